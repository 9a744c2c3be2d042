"""Redis trouble: lost scripts, a frozen server whose late replies make clients retry."""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest
import redis
from support import (
    EXAMPLE_PROJECT,
    TEST_PROJECT,
    RedisServer,
    read_items,
    run_scrapy,
    running,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch
from testsite import generate_site


def test_script_cache_flush_is_survived(redis_url):
    admin = FrontierAdmin(redis_url, "flush")
    admin.push([(b"", 0, b"\x01\x81\xa1u\xa8http://x/")])
    admin.client.script_flush()  # what a restarted Redis looks like to a client: no
    admin.client.function_flush()  # scripts, no functions (the frontier call's library)
    result = admin.call(CallBatch(take=1), worker="w")
    assert len(result.leased) == 1


@pytest.mark.slow
def test_frozen_redis_mid_crawl_loses_and_repeats_nothing(tmp_path, site_factory, worker_env):
    """SIGSTOP the Redis server for 3 s while 2 workers crawl with a 0.5 s socket timeout.

    Calls time out and are retried with the same operation id; when the server wakes up it
    runs the first attempts too (their bytes are in its socket buffers).  A retry must then
    replay the first reply instead of leasing or pushing again: no lease may be orphaned
    (which would show as a reclaimed lease) and no page fetched twice.
    """
    server = RedisServer(tmp_path / "redis").start()
    try:
        paths = generate_site(tmp_path / "www", 80, 5, seed=5)
        site = site_factory(tmp_path / "www",
                            behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.1}]})
        site.expected_paths = paths
        site.start_path = "/site/"
        pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site.start_url, "-s",
                                              f"FLEET_REDIS_URL={server.url}"], worker_env)
        assert pushed.returncode == 0, pushed.stderr
        outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
        logs = [tmp_path / f"w-{n}.log" for n in range(2)]
        procs = [start_worker(EXAMPLE_PROJECT, "docs", {
            "FLEET_REDIS_URL": server.url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_JSONL_PATH": outs[n],
            "FLEET_REDIS_TIMEOUT": 0.5, "FLEET_REDIS_RETRIES": 20, "CONCURRENT_REQUESTS": 2,
        }, worker_env, logs[n]) for n in range(2)]
        wait_until(lambda: len(read_items(outs, growing=True)) >= 10, 60, "10 items", 0.05,
                   explain=lambda: tail(logs[0]))
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        time.sleep(3)
        os.kill(server.proc.pid, signal.SIGCONT)
        codes = wait_all(procs, 180)
        assert codes == [0, 0], tail(logs[0]) + tail(logs[1])
        urls = [i["url"] for i in read_items(outs)]
        assert set(urls) == site.expected_urls
        assert collections.Counter(urls).most_common(1)[0][1] == 1
        status = FrontierAdmin(server.url, "docs").status()
        assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0)
        assert status["counters"].get("reclaimed", 0) == 0  # no orphaned lease
        retried = sum("retrying in" in tail(log, 200000) for log in logs)
        assert retried >= 1  # the freeze really hit the workers
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


def test_start_requests_are_taken_over_when_their_worker_is_killed(redis_url, tmp_path,
                                                                   site_factory, worker_env):
    """FLEET_START_REQUESTS='once' with back pressure: the worker reading the start requests
    is SIGKILLed midway; another takes its lease over, skips what was pushed, pushes the rest."""
    n = 300
    generate_site(tmp_path / "www", n, 2, seed=3)
    site = site_factory(tmp_path / "www")
    client = redis.Redis.from_url(redis_url)
    seeding = FrontierAdmin(redis_url, "many_starts").keys.seeding
    first = start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_QUEUE_MAX": 20,
        "FLEET_LEASE_TIMEOUT": 3, "CONCURRENT_REQUESTS": 2,
        "FLEET_JSONL_PATH": tmp_path / "out-0.jsonl"}, worker_env, tmp_path / "w-0.log",
        spider_args={"base": site.url, "n": n})
    wait_until(lambda: running(first, log=tmp_path / "w-0.log") and int(
        client.hget(seeding, "progress") or 0) >= 40, 60, "a seeding progress of 40", 0.1,
        explain=lambda: tail(tmp_path / "w-0.log"))
    others = [start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_QUEUE_MAX": 20,
        "FLEET_LEASE_TIMEOUT": 3, "CONCURRENT_REQUESTS": 2,
        "FLEET_JSONL_PATH": tmp_path / f"out-{k}.jsonl"}, worker_env, tmp_path / f"w-{k}.log",
        spider_args={"base": site.url, "n": n}) for k in (1, 2)]
    killed_holder = client.hget(seeding, "holder")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    pushed_at_kill = int(client.hget(seeding, "progress"))
    assert 40 <= pushed_at_kill < n  # killed midway
    assert wait_all(others, 180) == [0, 0], tail(tmp_path / "w-1.log")
    urls = {i["url"] for i in read_items([tmp_path / f"out-{k}.jsonl" for k in range(3)])}
    assert urls == {f"{site.url}site/p/{i}.html" for i in range(n)}
    state = client.hgetall(seeding)
    assert state[b"done"] == b"1" and state[b"holder"] != killed_holder
    assert int(state[b"progress"]) == n
    logs = [tail(tmp_path / f"w-{k}.log", 200000) for k in (1, 2)]
    assert sum("Took over the start requests" in log for log in logs) == 1


def test_start_requests_outlast_a_redis_restart(tmp_path, site_factory, worker_env):
    """Redis (append-only file) restarts while the start requests are being read: the worker
    reading them, and the one waiting to take over, wait for Redis; none is lost."""
    import subprocess

    from testsite.processes import free_port, stop_process

    n = 200
    generate_site(tmp_path / "www", n, 1, seed=5)
    site = site_factory(tmp_path / "www")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()

    def redis_server() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                 "--dir", str(data), "--appendonly", "yes", "--save", ""],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return proc
            except redis.exceptions.RedisError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    server = redis_server()
    url = f"redis://127.0.0.1:{port}/0"
    settings = {"FLEET_REDIS_URL": url, "FLEET_IDLE_TIMEOUT": 5, "FLEET_QUEUE_MAX": 20,
                "FLEET_LEASE_TIMEOUT": 5}
    workers = [start_worker(TEST_PROJECT, "many_starts", {
        **settings, "FLEET_JSONL_PATH": tmp_path / f"out-{k}.jsonl"}, worker_env,
        tmp_path / f"w-{k}.log", spider_args={"base": site.url, "n": n}) for k in range(2)]
    try:
        seeding = FrontierAdmin(url, "many_starts").keys.seeding
        client = redis.Redis(port=port)
        wait_until(lambda: int(client.hget(seeding, "progress") or 0) >= 30, 60,
                   "a seeding progress of 30", 0.1, explain=lambda: tail(tmp_path / "w-0.log"))
        client.shutdown(nosave=False)  # writes and closes the AOF
        stop_process(server)
        time.sleep(1.0)
        server = redis_server()
        assert wait_all(workers, 180) == [0, 0], tail(tmp_path / "w-0.log")
        urls = {i["url"] for i in read_items([tmp_path / f"out-{k}.jsonl" for k in range(2)])}
        assert urls == {f"{site.url}site/p/{i}.html" for i in range(n)}
        assert redis.Redis(port=port).hget(seeding, "done") == b"1"
    finally:
        stop_process(server)


def test_counters_not_written_by_the_fleet_do_not_break_frontier_calls(redis_url):
    """A non-integer in the stats or per-host count hashes (HINCRBY would fail after the
    script's earlier writes) is replaced, and the call goes on."""
    import redis

    admin = FrontierAdmin(redis_url, "corrupt")
    client = redis.Redis.from_url(redis_url)
    client.hset(admin.keys.stats, mapping={"leased": "1.5", "pushed": "abc"})
    client.hset(admin.keys.hostq, "a.test", "many")
    admin.push([(b"k" * 12, 0, b"\x01\x81\xa1u\xaehttp://a.test/", 0, "a.test")])
    res = admin.call(CallBatch(take=1), worker="w")
    assert len(res.leased) == 1
    res = admin.call(CallBatch(acks=[(res.leased[0].entry_id, res.leased[0].token)]),
                     worker="w")
    assert res.acked == 1
    counters = admin.status()["counters"]
    assert (counters["pushed"], counters["leased"], counters["acked"]) == (1, 1, 1)
