"""Politeness per session at the cost of one call (issue 32 item 5): the draw or pin call of a
request takes its session's slot, and the slots given back ride on the worker's next call
(lua/sessions.lua SLOT arguments through sessions/pool.py, sessions/slots.py), against a real
Redis; two ``SessionPools`` stand for two workers."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio
from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions.drawing import SLOT_META, FleetSessionsMiddleware
from scrapy_fleet.sessions.pool import SessionPools, SlotAsk
from scrapy_fleet.sessions.settings import SessionConfig

KEYS = CrawlKeys("fleet", "slots")


def test_a_draw_and_a_pin_take_the_slot_and_carry_the_gives(redis_url):
    """Pool of one session, concurrency 1: the first draw takes the slot; a second worker's
    draw and pin count their use but get ``wait``; a call carrying the first slot's give frees
    it before its own take, in the same call; a ``gives`` call frees slots of any session;
    a session that is not active takes nothing."""
    async def main() -> dict[str, Any]:
        c1, c2 = (redis.asyncio.Redis.from_url(redis_url) for _ in range(2))
        config = SessionConfig(pool_size=1, concurrency=1)
        w1 = SessionPools(c1, KEYS, config, login=False)
        w2 = SessionPools(c2, KEYS, config, login=False)
        first = await w1.draw("a.test", SlotAsk("t1", 60))
        out: dict[str, Any] = {"first": (first.state, first.slot)}
        second = await w2.draw("a.test", SlotAsk("t2", 60))
        pinned = await w2.pin(first.id, SlotAsk("t3", 60))
        out["busy"] = [(second.id, second.slot, 0 < second.wait <= 1.0),
                       (pinned.state, pinned.slot)]
        freed = await w2.pin(first.id, SlotAsk("t4", 60, gives=(f"{first.id}|t1",)))
        out["freed"] = freed.slot
        out["held"] = sorted(m.decode() for m in await c1.zrange(KEYS.session_slots(first.id),
                                                                  0, -1))
        other = await w1.draw("b.test", SlotAsk("u1", 60))
        out["gives"] = await w1.give_all([f"{first.id}|t4", f"{other.id}|u1",
                                          f"{other.id}|gone"])
        out["left"] = [await c1.exists(KEYS.session_slots(s)) for s in (first.id, other.id)]
        login = SessionPools(c1, KEYS, config, login=True)
        new = await login.draw("c.test", SlotAsk("v1", 60))
        out["new"] = (new.state, new.slot, await c1.exists(KEYS.session_slots(new.id)))
        out["plain"] = (await w1.draw("a.test")).slot
        out["uses"] = int(await c1.hget(KEYS.session(first.id), "uses"))
        for c in (c1, c2):
            await c.aclose()
        return out

    out = asyncio.run(main())
    assert out["first"] == ("active", "taken")
    assert out["busy"] == [("a.test-1", "wait", True), ("active", "wait")]
    assert out["freed"] == "taken"
    assert out["held"] == ["t4"]
    assert out["gives"] == 2
    assert out["left"] == [0, 0]
    assert out["new"] == ("new", "", 0)
    assert out["plain"] == ""
    assert out["uses"] == 5


class _Spider(Spider):
    name = "slots"


def _evalshas(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_one_sessions_call_per_request_with_the_cap(redis_url):
    """Ten requests one after the other through the sessions middleware, each answered before
    the next: with ``FLEET_SESSION_CONCURRENCY`` 1 (the default) each costs one script call,
    its draw (which takes the slot and gives back the previous answer's), the last answer's
    give one call of its own a turn of the event loop later; as many as without the cap.
    Every request got the slot (one at a time: none waited) and none is held after (the
    warm-up request's give rides on the first draw)."""
    client = redis.Redis.from_url(redis_url)

    async def main(concurrency: int) -> dict[str, Any]:
        crawler = get_crawler(_Spider, settings_dict={
            "FLEET_REDIS_URL": redis_url, "FLEET_SESSION_POOL_SIZE": 1,
            "FLEET_SESSION_CONCURRENCY": concurrency, "FLEET_CRAWL_ID": f"calls{concurrency}"})
        crawler.spider = _Spider()
        crawler.stats.open_spider()
        mw = FleetSessionsMiddleware.from_crawler(crawler)
        warm = Request("http://a.test/warm")  # (loads the script)
        await mw.process_request(warm)
        await mw.process_response(warm, HtmlResponse(warm.url, request=warm, body=b"ok"))
        before, slots = _evalshas(client), []
        for i in range(10):
            request = Request(f"http://a.test/{i}")
            await mw.process_request(request)
            slots.append(request.meta.get(SLOT_META, ""))
            await mw.process_response(request, HtmlResponse(request.url, request=request,
                                                            body=b"ok"))
        await asyncio.sleep(0)
        await mw._gives.flush()
        calls = _evalshas(client) - before
        keys = CrawlKeys("fleet", f"calls{concurrency}")
        held = client.zcard(keys.session_slots("a.test-1"))
        await mw.pools().client.aclose()
        return {"calls": calls, "slots": sum(bool(s) for s in slots), "held": held,
                "waits": crawler.stats.get_value("fleet/sessions/slot_waits", 0)}

    capped, uncapped = asyncio.run(main(1)), asyncio.run(main(0))
    client.close()
    assert capped == {"calls": 11, "slots": 10, "held": 0, "waits": 0}
    assert uncapped == {"calls": 10, "slots": 0, "held": 0, "waits": 0}
