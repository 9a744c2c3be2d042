"""The politeness path across a Redis restart: fail closed, and one outage logged once.

Real parts: a real redis-server (append-only, fsync always) SIGKILLed and started again on
the same port, the test site on several loopback addresses (one host each) with its access
log, a real ``scrapy crawl`` worker obeying robots.txt, one request per 2 s per host
(``FLEET_HOST_DELAY``: a minimum gap between two turns, never caught up, unlike a rate).

A robots.txt fetch is a request the frontier did not lease: it takes its turn from the
host's GCRA in the politeness guard.  When Redis dies while such a request waits there for
its turn, the request must wait for Redis, not go out without its turn.  And after the
restart, the sockets the politeness client kept from before must not make a second outage
of the one that just ended (each stale socket fails one call).
"""

from __future__ import annotations

import collections
import re
import time
from pathlib import Path

import pytest
import redis
from support import (
    TEST_PROJECT,
    RedisServer,
    read_items,
    start_worker,
    tail,
    wait_all,
    wait_until,
    worker_stats,
)

from scrapy_fleet.commands.push import default_fingerprinter, push_lines
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.politeness.hosts import robots_origin
from testsite import generate_site

pytestmark = pytest.mark.slow

#: one host each: A1-A3 before the restart, B across it, C1-C3 after it
BINDS = tuple(f"127.0.0.{n}" for n in range(2, 9))
INTERVAL = 2.0  #: seconds between two turns of a host (FLEET_HOST_DELAY)
OUTAGE = 3.0  #: seconds Redis is gone: longer than the turn the robots.txt fetch waits for


def push(url: str, urls: list[str]) -> None:
    admin = FrontierAdmin(url, "fetch")
    try:
        report = push_lines(admin, enumerate(urls, 1), default_fingerprinter())
        assert report.pushed == len(urls), report
    finally:
        admin.close()


def wait_for(condition, timeout: float, what: str, log: Path) -> None:
    wait_until(condition, timeout, what, 0.02, explain=lambda: tail(log))


def test_a_redis_restart_never_lets_a_request_skip_its_turn_and_is_one_outage(
        tmp_path, site_factory, worker_env):
    generate_site(tmp_path / "www", 10, 2, seed=5)
    site = site_factory(tmp_path / "www", binds=BINDS)
    a_hosts, b_host, c_hosts = site.urls[0:3], site.urls[3], site.urls[4:7]
    server = RedisServer(tmp_path / "redis", persistent=True)
    server.start()
    out, log = tmp_path / "out.jsonl", tmp_path / "w.log"
    proc = None
    try:
        push(server.url, [f"{h}site/p/0.html" for h in a_hosts])
        proc = start_worker(TEST_PROJECT, "fetch", {
            "FLEET_REDIS_URL": server.url, "FLEET_JSONL_PATH": out, "FLEET_IDLE_TIMEOUT": 6,
            "ROBOTSTXT_OBEY": True, "FLEET_HOST_DELAY": INTERVAL,
            "FLEET_REDIS_TIMEOUT": 1, "LOG_LEVEL": "DEBUG"}, worker_env, log)
        # the robots.txt of three hosts fetched at once: the politeness client keeps several
        # connections in its pool
        wait_for(lambda: len(read_items([out], growing=True)) == 3, 90, "the A pages", log)
        push(server.url, [f"{b_host}site/p/{n}.html" for n in range(3)])
        client = redis.Redis(port=server.port)
        locks = FrontierAdmin(server.url, "fetch").keys.robots_lock
        b_origin = robots_origin(b_host)
        # B's first page is leased (its turn taken); its robots.txt fetch took the fetch lock
        # and now waits in the guard for the host's next turn, 2 s away: Redis dies then
        wait_for(lambda: client.hexists(locks, b_origin), 60, "B's robots.txt lock", log)
        client.close()
        server.kill()
        killed = time.time()
        time.sleep(OUTAGE)
        restarted = time.time()
        server.start()
        wait_for(lambda: "reachable again" in tail(log, 10**7), 30, "the end of the outage",
                 log)
        push(server.url, [f"{h}site/p/0.html" for h in c_hosts])  # new origins, new robots
        assert wait_all([proc], 120) == [0], tail(log)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        server.stop()
    requests = site.requests()
    # fail closed: while Redis was down nothing reached the site (the page leased before
    # waited for its robots.txt, and the robots.txt for its turn)
    during = [r for r in requests if killed <= r["t"] <= restarted]
    assert not during, during
    robots = [r for r in requests if r["path"] == "/robots.txt"]
    assert sorted(r["addr"] for r in robots) == sorted(BINDS)  # once per origin
    assert min(r["t"] for r in robots if r["addr"] == "127.0.0.5") > restarted
    # every request took its turn, counted: each host got its pages and its robots.txt
    # once (nothing fetched twice), the robots.txt fetches asked their turns in the guard
    # (one per origin), and the one caught by the outage waited there for Redis
    per_host = collections.Counter(r["addr"] for r in requests)
    assert per_host == {addr: 4 if addr == "127.0.0.5" else 2 for addr in BINDS}, per_host
    stats = worker_stats(log)
    assert stats.get("fleet/politeness/robots_fetched") == len(BINDS), stats
    assert stats.get("fleet/politeness/guard_redis_waits", 0) >= 1, stats
    urls = {i["url"] for i in read_items([out])}
    assert len(urls) == 3 + 3 + 3
    text = log.read_text(encoding="utf-8", errors="replace")
    gone = [line for line in text.splitlines() if "] WARNING: Redis at" in line
            and "unreachable (" in line]
    back = re.findall(r"reachable again after ([0-9.]+) s of outage", text)
    assert len(gone) == 1 and len(back) == 1, (gone, back)  # one outage, one pair of lines
    assert OUTAGE - 1 <= float(back[0]) <= OUTAGE + 20, back
    assert "the request goes on" not in text
