"""Sessions bound to their exit (issue 32 item 3) against a real redis-server: the binding in
the session's record (lua/sessions.lua ``bind``) and the choice of a bound exit only
(lua/proxies.lua ``choose`` with ``only``)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio

from scrapy_fleet import redis_client
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.proxies.pool import Choice, Gone, PoolAdmin, ProxyPool, Report, Wait, proxy_id
from scrapy_fleet.proxies.settings import proxy_config
from scrapy_fleet.sessions.pool import Drawn, ExitBindings, SessionPools, pool_report
from scrapy_fleet.sessions.settings import SessionConfig

KEYS = CrawlKeys("fleet", "exits")
A, B, C = "http://127.0.0.1:3128", "http://127.0.0.1:3129", "http://127.0.0.1:3130"


def test_the_first_binding_wins_and_is_never_changed(redis_url):
    async def main() -> dict[str, Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        pools = SessionPools(client, KEYS, SessionConfig(pool_size=1), login=True)
        bindings = ExitBindings(client, KEYS)
        drawn = await pools.draw("site")
        out = {"drawn": drawn,
               "first": await bindings.bind(drawn.id, "e1"),
               "second": await bindings.bind(drawn.id, "e2"),
               "claim": await pools.claim(drawn.id, "w1")}
        out["done"] = await pools.done(drawn.id, "w1", True)
        out["pin"] = await pools.pin(drawn.id)
        out["state"] = await pools.state(drawn.id)
        out["draw"] = await pools.draw("site")
        # a relogin keeps the exit: the new generation's cookies leave through it too
        await pools.relogin(drawn.id, 1)
        await pools.claim(drawn.id, "w2")
        out["relogin"] = await pools.done(drawn.id, "w2", True)
        out["retired"] = await bindings.retire(drawn.id, "exit_banned")
        out["again"] = await bindings.retire(drawn.id, "exit_banned")
        out["bind_retired"] = await bindings.bind(drawn.id, "e3")
        out["unknown"] = await bindings.bind("site-9", "e3")
        await client.aclose()
        return out

    out = asyncio.run(main())
    sid = "site-1"
    assert out["drawn"] == Drawn(sid, "new", 0, "")
    assert out["first"] == Drawn(sid, "new", 0, "e1")
    assert out["second"] == Drawn(sid, "new", 0, "e1")
    assert out["done"] == Drawn(sid, "active", 1, "e1")
    assert out["pin"] == Drawn(sid, "active", 1, "e1")
    assert out["state"] == Drawn(sid, "active", 1, "e1")
    assert out["draw"] == Drawn(sid, "active", 1, "e1")
    assert out["relogin"] == Drawn(sid, "active", 2, "e1")
    assert (out["retired"], out["again"]) == (True, False)
    assert out["bind_retired"] == Drawn(sid, "retired", 2, "e1")
    assert out["unknown"].state == "unknown"
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "site")
    assert report["sessions"][sid]["exit"] == "e1"
    assert report["sessions"][sid]["reason"] == "exit_banned"
    assert report["counters"]["retired:exit_banned"] == 1


def test_concurrent_bindings_of_one_session_agree_on_one_exit(redis_url):
    async def main() -> list[Drawn]:
        clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(8)]
        pools = SessionPools(clients[0], KEYS, SessionConfig(pool_size=1), login=False)
        sid = (await pools.draw("many")).id
        bound = await asyncio.gather(*(ExitBindings(c, KEYS).bind(sid, f"e{n}")
                                       for n, c in enumerate(clients)))
        for c in clients:
            await c.aclose()
        return list(bound)

    bound = asyncio.run(main())
    assert len({b.exit for b in bound}) == 1 and bound[0].exit.startswith("e")


def _pool(url: str, **settings: object) -> tuple[ProxyPool, PoolAdmin]:
    config = proxy_config({"FLEET_PROXY_POOL": "x", **settings})
    keys = ProxyPoolKeys("fleet", "x")
    return (ProxyPool(redis_client.make_client(url, is_async=True), keys, config),
            PoolAdmin(redis_client.make_client(url), keys, config))


def test_a_bound_exit_is_chosen_alone_or_gone(redis_url):
    async def main() -> dict[str, Any]:
        pool, admin = _pool(redis_url, FLEET_PROXY_CONCURRENCY=1, FLEET_PROXY_DEAD_AFTER=1)
        await pool.seed([A, B, C])
        a, b, c = proxy_id(A), proxy_id(B), proxy_id(C)
        out: dict[str, Any] = {}
        first = await pool.choose("s1")
        assert isinstance(first, Choice)
        out["caps"] = await pool.choose("s1", only=first.exit_id)  # concurrency 1: a wait
        await pool.report([Report(first.ticket, first.exit_id, "s1", "ok", True)])
        # the least recently used exit is another one: only the bound one is taken
        out["only"] = [await pool.choose("s1", only=first.exit_id)]
        ticket = out["only"][0]
        await pool.report([Report(ticket.ticket, ticket.exit_id, "s1", "ban", True, 1.0)])
        out["banned"] = await pool.choose("s1", only=first.exit_id)
        out["banned_other_site"] = await pool.choose("s2", only=first.exit_id)
        others = [e for e in (a, b, c) if e != first.exit_id]
        admin.drain([others[0]])
        out["drained"] = await pool.choose("s1", only=others[0])
        dead = await pool.choose("s1", only=others[1])
        await pool.report([Report(dead.ticket, dead.exit_id, "s1", "proxy_dead", False, 1.0)])
        out["dead"] = await pool.choose("s2", only=others[1])
        admin.remove([others[1]])
        out["removed"] = await pool.choose("s2", only=others[1])
        out["first"] = first
        await pool.client.aclose()
        return out

    out = asyncio.run(main())
    first = out["first"]
    assert isinstance(out["only"][0], Choice) and out["only"][0].exit_id == first.exit_id
    assert isinstance(out["caps"], Wait) and out["caps"].why == "caps"
    assert out["banned"] == Gone("exit_banned")
    assert isinstance(out["banned_other_site"], Choice)  # a ban is per site
    assert out["drained"] == Gone("exit_drained")
    assert out["dead"] == Gone("exit_dead")
    assert out["removed"] == Gone("exit_drained")


def test_session_slots_cap_concurrency_and_space_starts(redis_url, lua_clock):
    """Politeness per session (issue 32 item 5): FLEET_SESSION_CONCURRENCY tickets live at
    once, fleet-wide (two clients stand for two workers); a given-back or run-out ticket
    frees its slot; FLEET_SESSION_DELAY spaces the starts; a retired session gives none."""
    async def main() -> dict[str, Any]:
        c1, c2 = (redis.asyncio.Redis.from_url(redis_url) for _ in range(2))
        w1 = SessionPools(c1, KEYS, SessionConfig(pool_size=1, concurrency=2), login=False)
        w2 = SessionPools(c2, KEYS, SessionConfig(pool_size=1, concurrency=2), login=False)
        sid = (await w1.draw("slots")).id
        out: dict[str, Any] = {"first": [await w1.take(sid, "a", 60), await w2.take(sid, "b", 60),
                                         await w2.take(sid, "c", 60)]}
        out["give"] = [await w1.give(sid, "a"), await w1.give(sid, "a")]
        out["after_give"] = await w2.take(sid, "c", 60)
        # a ticket of a dead worker runs out
        await w1.give(sid, "b")
        await w1.give(sid, "c")
        await w1.take(sid, "d", 30)
        await w1.take(sid, "e", 30)
        out["full"] = await w2.take(sid, "f", 60)
        lua_clock(31)  # (Redis's clock, as the scripts read it: no sleep)
        out["ran_out"] = await w2.take(sid, "f", 60)
        spaced = SessionPools(c1, KEYS, SessionConfig(pool_size=1, concurrency=0, delay=10),
                              login=False)
        other = (await spaced.draw("spaced")).id
        out["spaced"] = [await spaced.take(other, "x", 60), await spaced.take(other, "y", 60)]
        await w1.retire(sid, "manual")
        out["retired"] = await w1.take(sid, "g", 60)
        for c in (c1, c2):
            await c.aclose()
        return out

    out = asyncio.run(main())
    assert out["first"][:2] == [("taken", 0.0), ("taken", 0.0)]
    assert out["first"][2][0] == "wait" and 0 < out["first"][2][1] <= 1.0
    assert out["give"] == [True, False]
    assert out["after_give"] == ("taken", 0.0)
    assert out["full"][0] == "wait"
    assert out["ran_out"] == ("taken", 0.0)
    assert out["spaced"][0] == ("taken", 0.0)
    assert out["spaced"][1][0] == "wait" and 0 < out["spaced"][1][1] <= 10.0
    assert out["retired"] == ("retired", 0.0)
