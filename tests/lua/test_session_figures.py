"""The session pools' figures (issue 32 item 6) and retirement by idle time, against a real
redis-server: the snapshot's ``sessions`` block (what ``status``, ``top``, the dashboard and
``/metrics`` show) read back after pools were used, and the metric families built from it."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring.metrics import families
from scrapy_fleet.monitoring.snapshot import read_snapshot
from scrapy_fleet.monitoring.top import sessions_line
from scrapy_fleet.sessions.pool import SessionPools, pool_report
from scrapy_fleet.sessions.settings import SessionConfig

KEYS = CrawlKeys("fleet", "figures")


def run(redis_url: str, body: Any, **config: Any) -> Any:
    async def main() -> Any:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            return await body(SessionPools(client, KEYS, SessionConfig(**config), login=True))
        finally:
            await client.aclose()
    return asyncio.run(main())


async def _use(p: SessionPools) -> None:
    """Two pools: a.test with two sessions logged in, one of them relogged after a failed
    check then retired (exit_banned) and replaced; b.test with one session never logged in."""
    for _ in range(2):
        drawn = await p.draw("a.test")
        await p.claim(drawn.id, "w")
        await p.done(drawn.id, "w", True)
    await p.relogin("a.test-1", 1)
    await p.claim("a.test-1", "w")
    await p.done("a.test-1", "w", True)
    await p.retire("a.test-1", "exit_banned")
    await p.draw("a.test")  # creates a.test-3 in its place (new: needs a login)
    await p.draw("b.test")


def test_the_snapshot_and_the_metrics_show_the_session_pools(redis_url):
    run(redis_url, _use, pool_size=2)
    snap = read_snapshot(redis.Redis.from_url(redis_url), KEYS)
    assert snap["sessions"] == {
        "a.test": {"active": 1, "drawable": 2, "logins": 3, "check_failed": 1,
                   "retired": {"exit_banned": 1}},
        "b.test": {"active": 0, "drawable": 2, "logins": 0, "check_failed": 0, "retired": {}}}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families(snap) for s in f.samples
               if s.name.startswith("scrapy_fleet_session")}
    assert samples[("scrapy_fleet_sessions", (("pool", "a.test"), ("state", "active")))] == 1
    assert samples[("scrapy_fleet_sessions", (("pool", "b.test"), ("state", "drawable")))] == 2
    assert samples[("scrapy_fleet_session_logins_total", (("pool", "a.test"),))] == 3
    assert samples[("scrapy_fleet_session_retirements_total",
                    (("pool", "a.test"), ("reason", "exit_banned")))] == 1
    assert samples[("scrapy_fleet_session_check_failures_total", (("pool", "a.test"),))] == 1
    line = sessions_line(snap["sessions"])
    assert line is not None and line.plain == (
        "sessions a.test 1/2 active  logins 3  failed checks 1  retired 1 (exit_banned 1);  "
        "b.test 0/2 active  logins 0  failed checks 0  retired 0")
    assert sessions_line({}) is None


def test_a_crawl_without_pools_has_no_session_figures(redis_url):
    snap = read_snapshot(redis.Redis.from_url(redis_url), CrawlKeys("fleet", "nopools"))
    assert snap["sessions"] == {}
    names = {s.name for f in families(snap) for s in f.samples}
    assert not {n for n in names if n.startswith("scrapy_fleet_session")}


def test_a_session_unused_for_max_idle_is_retired_when_it_comes_up(redis_url, lua_clock):
    """FLEET_SESSION_MAX_IDLE: a session idle for longer is retired (idle) by the draw or
    the pin that finds it, and the draw takes a new one."""
    async def body(p: SessionPools) -> dict[str, Any]:
        first = await p.draw("idle.test")
        await p.claim(first.id, "w")
        await p.done(first.id, "w", True)
        fresh = await p.pin(first.id)  # used just now: kept
        lua_clock(61)  # (Redis's clock, as the scripts read it: no sleep)
        drawn = await p.draw("idle.test")
        return {"first": first.id, "fresh": fresh.state, "drawn": drawn,
                "pinned": await p.pin(first.id)}

    out = run(redis_url, body, pool_size=1, max_idle=60.0)
    assert out["fresh"] == "active"
    assert out["drawn"].id == "idle.test-2" and out["drawn"].state == "new"
    assert out["pinned"].state == "retired"
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "idle.test")
    assert report["sessions"][out["first"]]["reason"] == "idle"
    assert report["counters"]["retired:idle"] == 1
