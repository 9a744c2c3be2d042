# ruff: noqa: F811 - the fixtures of proxyfixtures are imported into this module
"""Sessions bound to their exit (issue 32 item 3): real tinyproxy exits (one egress address
each), the login site (tests/loginsite.py) recording the client address of every request,
a real Redis, real ``scrapy crawl`` workers of the pool spider."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import loginsite
import pytest
import redis
from proxyfixtures import tinyproxy  # noqa: F401 - fixture
from support import TEST_PROJECT, read_items, start_worker, stop_process, tail, wait_all

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.proxies.pool import proxy_id
from scrapy_fleet.sessions.pool import pool_report

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1]
EGRESS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@pytest.fixture
def address_site(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    started: list[subprocess.Popen[str]] = []

    def factory(pages: int, ban_addr_after: int) -> tuple[str, Path]:
        log = tmp_path / "site.jsonl"
        proc, url = loginsite.launch(str(log), pages, ban_addr_after=ban_addr_after)
        started.append(proc)
        return url, log

    yield factory
    for proc in started:
        stop_process(proc)


def read_log(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text("utf-8").splitlines() if line]


def test_cookies_leave_only_through_the_exit_that_received_them(
        redis_url, tinyproxy, address_site, worker_env, tmp_path):
    """Three exits, a pool of two sessions, three workers; the site bans the first exit
    address that fetches 12 members pages.  Every session cookie the site saw came from the
    address its login was answered to (0 from another); the banned exit's sessions are
    retired (exit_banned), never re-bound: 0 requests with their cookies through other
    exits; their pages are fetched logged in through replacement sessions."""
    exits = [tinyproxy(addr) for addr in EGRESS]
    url, log = address_site(60, 12)
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2,
                "CONCURRENT_REQUESTS": 4, "FLEET_PREFETCH": 4, "LOG_LEVEL": "INFO",
                "FLEET_PROXIES": ",".join(e.url() for e in exits),
                "FLEET_PROXY_COOLDOWN_BASE": 600, "FLEET_PROXY_COOLDOWN_MAX": 600}
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    procs = [start_worker(TEST_PROJECT, "pool_members", {**settings, "FLEET_JSONL_PATH": out},
                          worker_env, wlog, {"site": url})
             for out, wlog in zip(outs, logs, strict=True)]
    for n, code in enumerate(wait_all(procs, 300)):
        assert code == 0, f"worker {n} exited {code}:\n{tail(logs[n])}"
    items = read_items(outs)
    requests = read_log(log)
    # every session cookie the site handed out, and the address it was handed to
    granted = {r["sid"]: r["addr"] for r in requests if r.get("login")}
    carried = [r for r in requests if r.get("sid") and not r.get("login")]
    assert carried and set(granted) >= {r["sid"] for r in carried}
    seen_from: dict[str, set[str]] = defaultdict(set)
    for r in carried:
        seen_from[r["sid"]].add(r["addr"])
    assert {sid: addrs for sid, addrs in seen_from.items() if addrs != {granted[sid]}} == {}
    # the ban happened, and the banned exit's sessions were retired, not re-bound
    banned = {r["addr"] for r in requests if r.get("addr_banned")}
    assert len(banned) == 1 and banned <= set(EGRESS)
    (banned_addr,) = banned
    client = redis.Redis.from_url(redis_url)
    report = pool_report(client, CrawlKeys("fleet", "pool_members"), "127.0.0.1")
    by_addr = {proxy_id(e.url()): e.egress for e in exits}
    retired = {sid: r for sid, r in report["sessions"].items() if r["state"] == "retired"}
    assert retired and {r["reason"] for r in retired.values()} == {"exit_banned"}
    assert {by_addr[r["exit"]] for r in retired.values()} == {banned_addr}
    assert all(by_addr[r["exit"]] != banned_addr for r in report["sessions"].values()
               if r["state"] == "active")
    assert report["counters"]["retired:exit_banned"] == len(retired)
    assert report["counters"]["logins"] == sum(1 for r in requests if r.get("login"))
    # nothing lost: every members page itemised logged in, none as the login form
    pages = {i["url"] for i in items if "/members/p/" in i.get("url", "")}
    assert len(pages) == 60
    assert all(i["member"] for i in items if "url" in i)
    assert not [i for i in items if i.get("login_form") or "failed" in i]
    text = "".join(tail(p, 10**7) for p in logs)
    assert "fleet/proxy/session/bound" in text
