"""A worker whose frontier calls Redis refuses with OOM logs the spell once when it starts
and once when it ends (issue 30, trial item 8: the warning came every 2 s per worker)."""

from __future__ import annotations

import logging

import pytest
import redis
from support import TEST_PROJECT, start_worker, stop_process, tail, wait_until

from scrapy_fleet.outage import OutOfMemory
from testsite import generate_site

TIMEOUT = 60.0


def test_an_out_of_memory_spell_is_logged_at_its_start_reminders_and_end(caplog):
    now = [100.0]
    spell = OutOfMemory(remind_every=30.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="scrapy_fleet.outage")
    for _ in range(20):  # a refused call every 2 s for 40 s
        spell.refused()
        now[0] += 2.0
    assert spell.recovered() == 40.0
    assert spell.recovered() is None  # (a second success ends nothing)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("Redis is out of memory (maxmemory): pausing pushes")
    assert lines[1] == ("Redis still out of memory after 30 s (16 refused call(s)): pushes and "
                        "acknowledgements still paused")
    assert lines[2] == ("Redis has room again after 40.0 s out of memory (20 refused call(s)): "
                        "pushes and acknowledgements resume")


@pytest.fixture
def site(site_factory, tmp_path):
    generate_site(tmp_path / "www", 3, 1)
    served = site_factory(tmp_path / "www")
    served.start_path = "/site/"
    return served


def test_a_worker_logs_an_out_of_memory_spell_once(site, worker_env, redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    log = tmp_path / "oom.log"
    worker = start_worker(TEST_PROJECT, "starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 600,
        "FLEET_START_REQUESTS": "always", "FLEET_POLL_INTERVAL": 0.1, "LOG_LEVEL": "INFO"},
        worker_env, log, spider_args={"start": site.start_url})
    try:
        wait_until(lambda: site.requests(), TIMEOUT, "the worker's first fetch")
        for chunk in range(25):  # ~5 MB in small fields, then a maxmemory below it
            client.hset("filler", mapping={f"{chunk}-{i}": b"x" * 200 for i in range(1000)})
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 2_000_000)
        errors = lambda: int(client.info("stats").get("total_error_replies", 0))  # noqa: E731
        before = errors()
        # the worker keeps calling (every 4 x FLEET_POLL_INTERVAL): ten refusals at least
        wait_until(lambda: errors() >= before + 10, TIMEOUT, "ten refused frontier calls")
        client.config_set("maxmemory", 0)
        wait_until(lambda: "has room again" in log.read_text(errors="replace"), TIMEOUT,
                   "the end of the spell in the log")
        assert worker.poll() is None, tail(log)
    finally:
        stop_process(worker)
        client.config_set("maxmemory", 0)
        client.delete("filler")
        client.close()
    out = log.read_text(errors="replace")
    assert "Traceback" not in out, out
    starts = [line for line in out.splitlines() if "Redis is out of memory" in line]
    ends = [line for line in out.splitlines() if "has room again" in line]
    assert len(starts) == 1 and len(ends) == 1, out
