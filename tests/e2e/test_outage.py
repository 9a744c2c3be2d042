"""Redis outages mid-crawl: gone for 30 s and back with its data, or back without it.

Real parts: a real redis-server (append-only file, fsync on every write) killed with SIGKILL
and started again on the same port, the test site server, real ``scrapy crawl`` workers.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from support import (
    EXAMPLE_PROJECT,
    RedisServer,
    read_items,
    run_scrapy,
    running,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet import redis_client
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

pytestmark = pytest.mark.slow

OUTAGE = 30.0  #: seconds Redis is gone


def _crawl_setup(tmp_path: Path, site_factory, worker_env, server: RedisServer,
                 pages: int = 120):
    paths = generate_site(tmp_path / "www", pages, 4, seed=9)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.15}]})
    site.expected_paths = paths
    site.start_path = "/site/"
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site.start_url, "-s",
                                          f"FLEET_REDIS_URL={server.url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
    logs = [tmp_path / f"w-{n}.log" for n in range(2)]
    procs = [start_worker(EXAMPLE_PROJECT, "docs", {
        "FLEET_REDIS_URL": server.url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_JSONL_PATH": outs[n],
        "FLEET_REDIS_TIMEOUT": 1, "FLEET_LEASE_TIMEOUT": 120, "CONCURRENT_REQUESTS": 3,
        "FLEET_PREFETCH": 8}, worker_env, logs[n]) for n in range(2)]
    wait_until(lambda: running(*procs, log=logs[0]) and len(
        read_items(outs, growing=True)) >= 15, 90, "15 items", 0.05,
        explain=lambda: tail(logs[0]))
    return site, outs, logs, procs


def test_redis_gone_for_30_s_is_logged_once_and_the_crawl_loses_nothing(
        tmp_path, site_factory, worker_env):
    server = RedisServer(tmp_path / "redis", persistent=True)
    server.start()
    procs = []
    try:
        site, outs, logs, procs = _crawl_setup(tmp_path, site_factory, worker_env, server)
        server.kill()
        at_kill = len(read_items(outs, growing=True))
        time.sleep(OUTAGE)
        during = len(read_items(outs, growing=True))
        assert all(p.poll() is None for p in procs), tail(logs[0])  # waiting, not dead
        server.start()
        assert wait_all(procs, 240) == [0, 0], tail(logs[0]) + tail(logs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    assert during > at_kill  # the downloads in flight completed while Redis was gone
    urls = [i["url"] for i in read_items(outs)]
    assert set(urls) == site.expected_urls  # nothing lost
    assert collections.Counter(urls).most_common(1)[0][1] == 1  # nothing fetched twice
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        gone = [line for line in text.splitlines() if "unreachable (" in line]
        back = re.findall(r"reachable again after ([0-9.]+) s of outage", text)
        assert len(gone) == 1, gone  # once per outage, not once per retry
        assert "[scrapy_fleet.outage] WARNING" in gone[0] and "retrying in" in gone[0]
        assert len(back) == 1 and OUTAGE - 5 <= float(back[0]) <= OUTAGE + 30, back
        assert "Redis call failed" not in text and "Fleet frontier unreachable" not in text
        assert "'fleet/redis/outages': 1" in text


def test_redis_restarted_without_its_data_stops_the_workers_with_an_error(
        tmp_path, site_factory, worker_env):
    server = RedisServer(tmp_path / "redis")
    server.start()
    procs = []
    try:
        site, outs, logs, procs = _crawl_setup(tmp_path, site_factory, worker_env, server)
        server.kill()
        server.start()  # same port, empty
        codes = wait_all(procs, 120)
        keys = FrontierAdmin(server.url, "docs").keys
        client = redis.Redis(port=server.port)
        left = {k for k in (keys.queue_count, keys.queue_index, keys.data, keys.marker,
                            keys.leases, keys.stats)
                if client.exists(k)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    assert codes == [1, 1], tail(logs[0]) + tail(logs[1])
    assert len(read_items(outs)) < len(site.expected_urls)  # it did not finish "done"
    assert left == set()  # the workers wrote no partial crawl into the empty Redis
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "Fleet worker stops: Redis at redis://127.0.0.1:" in text
        assert "has lost this crawl's state" in text and "is gone" in text
        assert "Spider closed (fleet_state_lost)" in text
        assert "Fleet idle" not in text


def test_a_frozen_redis_outage_counts_from_the_call_that_hung(tmp_path, caplog):
    # a frozen server fails the first call only after its read timeout: the outage began
    # when that call was sent, and the "reachable again" line must count that time too
    server = RedisServer(tmp_path / "frozen")
    server.start()
    url = server.url
    client = redis_client.make_client(url, timeout=1.0)
    try:
        client.ping()
        os.kill(server.proc.pid, signal.SIGSTOP)
        frozen = 3.0
        thaw = threading.Timer(frozen, os.kill, (server.proc.pid, signal.SIGCONT))
        thaw.start()
        with caplog.at_level(logging.WARNING, logger="scrapy_fleet.outage"):
            assert redis_client.call_retrying(client.ping, url, 50) is True
        thaw.join()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        client.close()
        server.stop()
    back = [r.getMessage() for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(back) == 1, back
    length = float(re.search(r"after ([0-9.]+) s of outage", back[0]).group(1))
    # before the fix it counted from the first failure, a read timeout (1 s) later: ~2 s
    assert length >= frozen - 0.25, back
