"""Session records and pools (issue 32 items 2 and 4, lua/sessions.lua through
sessions/pool.py) against a real Redis: several ``SessionPools`` stand for several workers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions.pool import (
    SessionPools,
    jar_name,
    pool_report,
    retire_session,
)
from scrapy_fleet.sessions.settings import SessionConfig

KEYS = CrawlKeys("fleet", "pools")


def run(redis_url: str, body: Callable[..., Awaitable[Any]], workers: int = 1,
        login: bool = False, **config: Any) -> Any:
    async def main() -> Any:
        pools = [SessionPools(redis.asyncio.Redis.from_url(redis_url), KEYS,
                              SessionConfig(**{"pool_size": 2, **config}), login)
                 for _ in range(workers)]
        try:
            return await body(*pools)
        finally:
            for p in pools:
                await p.client.aclose()
    return asyncio.run(main())


def test_draws_fill_the_pool_and_take_the_least_used_first(redis_url):
    async def body(p: SessionPools) -> list[str]:
        return [(await p.draw("example.com")).id for _ in range(6)]

    ids = run(redis_url, body)
    assert ids == ["example.com-1", "example.com-2"] * 3
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "example.com")
    assert {sid: r["uses"] for sid, r in report["sessions"].items()} == {
        "example.com-1": "3", "example.com-2": "3"}
    assert {r["state"] for r in report["sessions"].values()} == {"active"}
    assert report["counters"] == {"created": 2}


def test_a_retired_session_is_never_drawn_and_is_replaced(redis_url):
    async def body(p: SessionPools) -> tuple[list[str], bool, Any]:
        first = await p.draw("site")
        assert await p.retire(first.id, "status/403")
        again = await p.retire(first.id, "status/403")
        drawn = [(await p.draw("site")).id for _ in range(40)]
        return drawn, again, await p.pin(first.id)

    drawn, again, pinned = run(redis_url, body)
    assert "site-1" not in drawn
    assert set(drawn) == {"site-2", "site-3"}
    assert again is False
    assert pinned.state == "retired"
    client = redis.Redis.from_url(redis_url)
    report = pool_report(client, KEYS, "site")
    assert report["sessions"]["site-1"]["state"] == "retired"
    assert report["sessions"]["site-1"]["reason"] == "status/403"
    assert report["counters"]["retired:status/403"] == 1
    assert client.zrange(KEYS.session_pool("site"), 0, -1) == [b"site-2", b"site-3"]


def test_max_uses_retires_before_the_draw(redis_url):
    async def body(p: SessionPools) -> list[str]:
        return [(await p.draw("site")).id for _ in range(7)]

    ids = run(redis_url, body, pool_size=1, max_uses=3)
    assert ids == ["site-1"] * 3 + ["site-2"] * 3 + ["site-3"]
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "site")
    assert report["counters"]["retired:uses"] == 2


def test_one_login_claim_among_concurrent_callers(redis_url):
    """Eight workers ask at once for the login of one new session: exactly one claims it,
    the others wait; its success makes the session active at generation 1."""
    async def body(*pools: SessionPools) -> Any:
        drawn = await pools[0].draw("site")
        assert (drawn.state, drawn.generation) == ("new", 0)
        claims = await asyncio.gather(*(p.claim(drawn.id, f"w{n}")
                                        for n, p in enumerate(pools)))
        winner = next(n for n, c in enumerate(claims) if c.state == "claimed")
        loser = (winner + 1) % len(pools)
        lost = await pools[loser].done(drawn.id, f"w{loser}", True)
        done = await pools[winner].done(drawn.id, f"w{winner}", True)
        after = await asyncio.gather(*(p.claim(drawn.id, "w9") for p in pools))
        return [c.state for c in claims], lost, done, [a.state for a in after]

    states, lost, done, after = run(redis_url, body, workers=8, login=True)
    assert sorted(states) == ["claimed"] + ["wait"] * 7
    assert lost.state == "lost"
    assert (done.state, done.generation) == ("active", 1)
    assert after == ["active"] * 8
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "site")
    assert report["counters"]["logins"] == 1


def test_a_claim_of_a_dead_worker_runs_out(redis_url):
    async def body(a: SessionPools, b: SessionPools) -> list[str]:
        drawn = await a.draw("site")
        first = await a.claim(drawn.id, "dead")
        while (await b.claim(drawn.id, "alive")).state == "wait":
            await asyncio.sleep(0.05)
        late = await a.done(drawn.id, "dead", True)
        return [first.state, late.state, (await b.done(drawn.id, "alive", True)).state]

    assert run(redis_url, body, workers=2, login=True, login_timeout=0.2) == [
        "claimed", "lost", "active"]


def test_a_failed_check_asks_one_login_per_generation(redis_url):
    """Several workers see the check fail on generation 1: the session needs one login; a
    failure reported for an older generation changes nothing; max_errors retires."""
    async def body(p: SessionPools) -> Any:
        s = await p.draw("site")
        await p.claim(s.id, "w")
        await p.done(s.id, "w", True)
        client = redis.Redis.from_url(redis_url)
        client.hset(KEYS.cookie_jar(jar_name(s.id)), "x", "0\t{}")
        fails = [(await p.relogin(s.id, 1)).state for _ in range(3)]
        claim = await p.claim(s.id, "w")
        jar_left = client.exists(KEYS.cookie_jar(jar_name(s.id)))
        await p.done(s.id, "w", True)
        stale = await p.relogin(s.id, 1)
        await p.passed(s.id, 2)
        states = []
        for gen in (2, 3):
            states.append((await p.relogin(s.id, gen)).state)
            await p.claim(s.id, "w")
            await p.done(s.id, "w", True)
        states.append((await p.relogin(s.id, 4)).state)
        return fails, claim.state, jar_left, stale, states

    fails, claim, jar_left, stale, states = run(redis_url, body, login=True, pool_size=1,
                                                max_errors=3)
    assert fails == ["relogin"] * 3
    assert claim == "claimed"
    assert jar_left == 0  # a new login starts from an empty jar
    assert (stale.state, stale.generation) == ("active", 2)
    assert states == ["relogin", "relogin", "retired"]
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "site")
    assert report["counters"]["check_failed"] == 4
    assert report["counters"]["retired:check"] == 1
    assert report["counters"]["logins"] == 4


def test_retire_from_the_command_line_names_unknown_sessions(redis_url):
    async def body(p: SessionPools) -> str:
        return (await p.draw("site")).id

    sid = run(redis_url, body)
    client = redis.Redis.from_url(redis_url)
    assert retire_session(client, KEYS, sid, "manual") == "retired"
    assert retire_session(client, KEYS, sid, "manual") == "already"
    assert retire_session(client, KEYS, "site-99", "manual") == "unknown"
