"""A seeding worker stopped with Ctrl-C (SIGINT) gives its start-request lease up at once,
with its progress, so the next worker takes the rest over without waiting for the lease."""

from __future__ import annotations

import os
import signal

import pytest
import redis
from support import TEST_PROJECT, read_items, running, start_worker, tail, wait_all, wait_until

from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

pytestmark = pytest.mark.slow


def test_ctrl_c_releases_the_seeding_lease_with_its_progress(redis_url, tmp_path,
                                                              site_factory, worker_env):
    n = 300
    generate_site(tmp_path / "www", n, 1, seed=4)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.2}]})
    admin = FrontierAdmin(redis_url, "many_starts")
    client = redis.Redis.from_url(redis_url)
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_QUEUE_MAX": 20,
                # a long lease: a worker that did not give it up would block the takeover
                "FLEET_LEASE_TIMEOUT": 600, "CONCURRENT_REQUESTS": 2}
    first = start_worker(TEST_PROJECT, "many_starts", {
        **settings, "FLEET_JSONL_PATH": tmp_path / "out-0.jsonl"}, worker_env,
        tmp_path / "w-0.log", spider_args={"base": site.url, "n": n})
    log = tmp_path / "w-0.log"
    # (progress is written lazily)
    wait_until(lambda: running(first, log=log) and len(
        read_items([tmp_path / "out-0.jsonl"], growing=True)) >= 40, 60, "40 items", 0.1,
        explain=lambda: tail(log))
    os.kill(first.pid, signal.SIGINT)  # Ctrl-C: Scrapy's graceful shutdown
    assert wait_all([first], 60) == [0], tail(tmp_path / "w-0.log")
    state = client.hgetall(admin.keys.seeding)
    assert b"holder" not in state and b"done" not in state, state  # given up, not done
    pushed = admin.status()["counters"]["pushed"]  # many_starts pushes start requests only
    assert int(state[b"progress"]) == pushed, (state, pushed)
    assert 40 <= pushed < n
    log = (tmp_path / "w-0.log").read_text(encoding="utf-8")
    assert f"Start requests interrupted (shutdown) after {pushed} of them" in log

    # (the second worker fetches the rest 8 at a time: how fast it crawls is not what is
    # tested, only that it takes the start requests over at once)
    second = start_worker(TEST_PROJECT, "many_starts", {
        **settings, "CONCURRENT_REQUESTS": 8, "FLEET_JSONL_PATH": tmp_path / "out-1.jsonl"},
        worker_env,
        tmp_path / "w-1.log", spider_args={"base": site.url, "n": n})
    # with a 600 s lease not given up, this would time out
    assert wait_all([second], 180) == [0], tail(tmp_path / "w-1.log")
    urls = [i["url"] for i in read_items([tmp_path / f"out-{k}.jsonl" for k in range(2)])]
    assert set(urls) == {f"{site.url}site/p/{i}.html" for i in range(n)}
    log = (tmp_path / "w-1.log").read_text(encoding="utf-8")
    assert f"Took over the start requests from a worker that stopped: skipping the {pushed}" \
        in log
    assert client.hget(admin.keys.seeding, "done") == b"1"
