"""Whose crawl, whose worker id (scrapy_fleet/identity.py), and start-up failures that must be
one line or the promised wait: real ``scrapy crawl`` processes of the test project against a
real redis-server.

* two spiders of tests/project sharing one FLEET_CRAWL_ID: the second one's worker and push
  refuse, naming both, and change nothing; purge forgets the crawl's spider;
* three workers given one FLEET_WORKER_ID: one runs, two refuse naming it; after a SIGKILL
  the id starts again at once; a stale heartbeat of another host is waited out;
* a Redis out of memory at start: the worker waits with one warning and crawls once memory is
  freed (docs/backpressure.md); FLEET_JSONL_PATH under a file: one line.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import redis
from support import (
    TEST_PROJECT,
    kill_worker,
    run_scrapy,
    start_worker,
    stop_process,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

TIMEOUT = 60.0


@pytest.fixture
def site(site_factory, tmp_path):
    generate_site(tmp_path / "www", 3, 1)
    served = site_factory(tmp_path / "www")
    served.start_path = "/site/"
    return served


def crawl(site, env, spider: str, *settings: str, timeout: float = TIMEOUT):
    args = ["crawl", spider, "-L", "INFO"]
    if spider == "starts":
        args += ["-a", f"start={site.start_url}"]
    for setting in settings:
        args += ["-s", setting]
    return run_scrapy(TEST_PROJECT, args, env, timeout=timeout)


def one_error(result: Any) -> str:
    """Exit status 1, exactly one ERROR line (the start-up check's), no traceback."""
    out = result.stderr + result.stdout
    assert result.returncode == 1, out
    errors = [line for line in out.splitlines() if " ERROR: " in line or " CRITICAL: " in line]
    assert len(errors) == 1, out
    assert "[scrapy_fleet.startup] ERROR: Fleet worker cannot start: " in errors[0], out
    assert "Traceback" not in out, out
    assert "Task exception was never retrieved" not in out, out
    assert "Spider opened" not in out, out
    return errors[0]


def snapshot(client: redis.Redis, keys: CrawlKeys) -> dict[bytes, bytes | None]:
    """Every key of the crawl with its serialized value, but the short-lived ones (cached
    replies of scripts, worker-id claims), which expire by themselves."""
    found = client.keys(keys.pattern)
    return {k: client.dump(k) for k in sorted(found)
            if b":op:" not in k and b":claim:" not in k}


# -- item 3: two spiders, one crawl id ------------------------------------------------------------


def test_a_second_spider_on_a_crawl_is_refused_by_worker_and_push(site, worker_env, redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "shared")
    common = [f"FLEET_REDIS_URL={redis_url}", "FLEET_CRAWL_ID=shared"]
    first = crawl(site, worker_env, "starts", *common, "FLEET_IDLE_TIMEOUT=1",
                  "FLEET_START_REQUESTS=always")
    assert first.returncode == 0, first.stderr + first.stdout
    assert client.get(keys.spider) == b"starts\tfleettest.spiders.StartsSpider"
    before = snapshot(client, keys)
    assert keys.stats.encode() in before

    second = crawl(site, worker_env, "fetch", *common, "FLEET_IDLE_TIMEOUT=1")
    line = one_error(second)
    assert line.endswith(
        "Fleet worker cannot start: crawl 'shared' belongs to spider 'starts' "
        "(fleettest.spiders.StartsSpider), not to spider 'fetch' "
        "(fleettest.spiders.FetchSpider). Give each spider its own FLEET_CRAWL_ID (by default "
        "the crawl id is the spider's name), or purge the crawl first (`scrapy fleet purge "
        "starts -s FLEET_CRAWL_ID=shared --yes`)."), line
    assert snapshot(client, keys) == before  # the frontier was not touched

    settings = [a for s in common for a in ("-s", s)]
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", site.url + "x", *settings],
                        worker_env, timeout=TIMEOUT)
    assert pushed.returncode == 2, pushed.stderr
    assert pushed.stderr.strip().splitlines() == [
        "error: crawl 'shared' belongs to spider 'starts' (fleettest.spiders.StartsSpider), "
        "not to spider 'fetch' (fleettest.spiders.FetchSpider): nothing pushed. Give each "
        "spider its own FLEET_CRAWL_ID (by default the crawl id is the spider's name), or "
        "purge the crawl first (`scrapy fleet purge starts -s FLEET_CRAWL_ID=shared --yes`)"]
    assert "Traceback" not in pushed.stderr
    retried = run_scrapy(TEST_PROJECT, ["fleet", "retry", "fetch", "--all", *settings],
                         worker_env, timeout=TIMEOUT)
    assert retried.returncode == 2, retried.stderr
    assert retried.stderr.strip().splitlines() == [
        pushed.stderr.strip().replace("nothing pushed", "nothing retried")]
    assert snapshot(client, keys) == before

    own = run_scrapy(TEST_PROJECT, ["fleet", "push", "starts", site.url + "y", *settings],
                     worker_env, timeout=TIMEOUT)
    assert own.returncode == 0, own.stderr
    # status asked as the other spider names the crawl's own
    status = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", *settings], worker_env,
                        timeout=TIMEOUT)
    assert "crawl 'shared' (spider 'starts', not 'fetch')" in status.stdout, status.stdout

    # the hint's own command purges this crawl (it names the crawl id: the command's default
    # would be the spider's name, another crawl)
    hint = pushed.stderr.split("`")[1].split()
    assert hint[:2] == ["scrapy", "fleet"]
    purged = run_scrapy(TEST_PROJECT, [*hint[1:], "-s", f"FLEET_REDIS_URL={redis_url}"],
                        worker_env, timeout=TIMEOUT)
    assert purged.returncode == 0, purged.stderr
    assert client.exists(keys.spider) == 0
    # the crawl id is free again: the other spider's push records it as its own
    again = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", site.url + "x", *settings],
                       worker_env, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert client.get(keys.spider) == b"fetch\tfleettest.spiders.FetchSpider"


# -- item 9: one worker id, one live worker -------------------------------------------------------


def joined(log: Path) -> bool:
    return log.exists() and "Fleet worker same-id joined crawl" in log.read_text(errors="replace")


def test_three_workers_with_one_id_then_a_restart_after_sigkill(site, worker_env, redis_url,
                                                              tmp_path):
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_WORKER_ID": "same-id",
                "FLEET_START_REQUESTS": "always", "LOG_LEVEL": "INFO"}
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [start_worker(TEST_PROJECT, "starts", settings, worker_env, log,
                          spider_args={"start": site.start_url}) for log in logs]
    try:
        wait_until(lambda: sum(p.poll() is not None for p in procs) == 2, TIMEOUT,
                   "two of three workers with one id to stop")
        running = [p for p in procs if p.poll() is None]
        assert len(running) == 1
        live, live_log = running[0], logs[procs.index(running[0])]
        wait_until(lambda: joined(live_log), TIMEOUT, "the running worker to join")
        host = socket.gethostname()
        for proc, log in zip(procs, logs, strict=True):
            if proc is live:
                continue
            out = log.read_text(errors="replace")
            assert proc.returncode == 1, out
            errors = [line for line in out.splitlines() if " ERROR: " in line]
            assert len(errors) == 1, out
            assert (f"Fleet worker cannot start: FLEET_WORKER_ID 'same-id' is in use by a live "
                    f"worker of crawl 'starts' (host {host}, pid {live.pid}, running since "
                    in errors[0]), out
            assert errors[0].endswith(
                "Give each worker its own FLEET_WORKER_ID (unset, each process gets a unique "
                "host:pid:start id), or stop that worker first."), out
            assert "Traceback" not in out and not joined(log), out

        # a crash: the heartbeat stays fresh in Redis, but its pid runs no more on this host
        kill_worker(live)
        restarted_log = tmp_path / "restarted.log"
        restarted = start_worker(TEST_PROJECT, "starts", settings, worker_env, restarted_log,
                                 spider_args={"start": site.start_url})
        procs.append(restarted)
        wait_until(lambda: joined(restarted_log) or restarted.poll() is not None, TIMEOUT,
                   "the restarted worker to join")
        out = restarted_log.read_text(errors="replace")
        assert restarted.poll() is None and joined(restarted_log), out
        assert "waiting up to" not in out, out  # a dead pid of this host: no wait at all
    finally:
        for proc in procs:
            stop_process(proc)


def test_a_stale_heartbeat_of_another_host_is_waited_out(site, worker_env, redis_url, tmp_path):
    """A worker of another machine that died (its heartbeat stopped): a restart with its id
    starts once the heartbeat is FLEET_WORKER_DEAD_AFTER old, never later."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "starts")
    seconds, _ = client.time()
    client.hset(keys.worker_info("same-id"), mapping={
        "seen": int(seconds) * 1000, "h": "elsewhere.example", "pid": 4242,
        "sa": int(seconds) - 60, "st": "idle"})
    result = crawl(site, worker_env, "starts", f"FLEET_REDIS_URL={redis_url}",
                   "FLEET_WORKER_ID=same-id", "FLEET_HEARTBEAT_INTERVAL=1",
                   "FLEET_WORKER_DEAD_AFTER=10", "FLEET_IDLE_TIMEOUT=1",
                   "FLEET_START_REQUESTS=always")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out
    waits = [line for line in out.splitlines() if "waiting up to" in line]
    assert len(waits) == 1, out
    assert "FLEET_WORKER_ID 'same-id' was used" in waits[0]
    assert "host elsewhere.example, pid 4242" in waits[0], waits[0]
    assert "'item_scraped_count': 1" in out, out


# -- item 8: start-up failures --------------------------------------------------------------------


def test_a_worker_started_while_redis_is_out_of_memory_waits(site, worker_env, redis_url,
                                                            tmp_path):
    client = redis.Redis.from_url(redis_url)
    for chunk in range(25):  # ~5 MB in small fields (no big query buffer to free later)
        client.hset("filler", mapping={f"{chunk}-{i}": b"x" * 200 for i in range(1000)})
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used - 2_000_000)
    log = tmp_path / "oom.log"
    worker = start_worker(TEST_PROJECT, "starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_START_REQUESTS": "always",
        "FLEET_POLL_INTERVAL": 0.1, "LOG_LEVEL": "INFO"}, worker_env, log,
        spider_args={"start": site.start_url})
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("probe", b"1")  # Redis refuses writes
        wait_until(lambda: "is out of memory" in log.read_text(errors="replace"), TIMEOUT,
                   "the worker's out-of-memory warning")
        assert worker.poll() is None, tail(log)
        assert site.requests() == []
        client.delete("filler")  # memory is freed: the worker starts and crawls
        assert wait_all([worker], TIMEOUT) == [0], tail(log)
    finally:
        stop_process(worker)
        client.config_set("maxmemory", 0)
        client.close()
    out = log.read_text(errors="replace")
    assert "Traceback" not in out, out
    assert " ERROR: " not in out, out
    assert "Task exception was never retrieved" not in out, out
    warnings = [line for line in out.splitlines() if "is out of memory" in line]
    assert len(warnings) == 1, out
    assert "the worker waits and tries again every 0.4 s until Redis has room" in warnings[0]
    assert "'item_scraped_count': 1" in out, out
    assert [r["path"] for r in site.requests()] == ["/site/"]


def test_jsonl_path_under_a_file_is_one_line(site, worker_env, redis_url, tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    path = tmp_path / "afile" / "items.jsonl"
    result = crawl(site, worker_env, "starts", f"FLEET_REDIS_URL={redis_url}",
                   f"FLEET_JSONL_PATH={path}", "FLEET_IDLE_TIMEOUT=1")
    line = one_error(result)
    assert line.endswith(
        f"Fleet worker cannot start: FLEET_JSONL_PATH='{path}' is invalid: its folder "
        f"'{path.parent}' cannot exist: '{path.parent}' is a file. Fix it in settings.py, in "
        "the spider's custom_settings or on the command line (-s NAME=VALUE); `scrapy fleet "
        "settings` or `scrapy-fleet settings` lists the valid values."), line
    assert site.requests() == []
    proc_path = "/proc/fleet-no-such-folder/items.jsonl"  # no folder can be made in /proc
    line = one_error(crawl(site, worker_env, "starts", f"FLEET_REDIS_URL={redis_url}",
                           f"FLEET_JSONL_PATH={proc_path}", "FLEET_IDLE_TIMEOUT=1"))
    assert f"FLEET_JSONL_PATH='{proc_path}' is invalid: cannot write '{proc_path}': " in line
    assert site.requests() == []


def test_retry_of_a_crawl_never_pushed_claims_nothing(worker_env, redis_url):
    """retry writes no request of its own: on a crawl id Redis has no record of it says so
    and leaves no spider record (which would refuse the crawl's real spider later)."""
    client = redis.Redis.from_url(redis_url)
    settings = ["-s", f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_CRAWL_ID=never"]
    retried = run_scrapy(TEST_PROJECT, ["fleet", "retry", "starts", "--all", *settings],
                         worker_env, timeout=TIMEOUT)
    assert retried.returncode == 4, retried.stderr
    assert client.keys("*never*") == []
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "http://h.test/", *settings],
                        worker_env, timeout=TIMEOUT)
    assert pushed.returncode == 0, pushed.stderr
    assert client.get(CrawlKeys("fleet", "never").spider) == (
        b"fetch\tfleettest.spiders.FetchSpider")
