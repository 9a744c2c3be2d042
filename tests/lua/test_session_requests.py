"""A request's session (issue 32 item 2, sessions/drawing.py) against a real Redis: real
Scrapy requests through ``FleetSessionsMiddleware`` in one process, a spider with a validity
check and no login (a login needs a running engine: tests/e2e/test_sessions_crawl.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions import SessionError
from scrapy_fleet.sessions.drawing import FleetSessionsMiddleware
from scrapy_fleet.sessions.pool import pool_report

KEYS = CrawlKeys("fleet", "reqs")


class _Spider(Spider):
    name = "reqs"

    def fleet_session_check(self, response: Any) -> bool:
        return b"login" not in response.body


def run(redis_url: str, body: Callable[[FleetSessionsMiddleware], Awaitable[Any]],
        **settings: Any) -> Any:
    async def main() -> Any:
        crawler = get_crawler(_Spider, settings_dict={
            "FLEET_REDIS_URL": redis_url, "FLEET_SESSION_POOL_SIZE": 2,
            # (most requests here get no answer: no cap on a session's requests in flight,
            # but in test_one_request_of_a_session_in_flight_at_a_time)
            "FLEET_SESSION_CONCURRENCY": 0, **settings})
        crawler.spider = _Spider()
        crawler.stats.open_spider()
        mw = FleetSessionsMiddleware.from_crawler(crawler)
        try:
            return await body(mw)
        finally:
            await mw.pools().client.aclose()
    return asyncio.run(main())


async def sent(mw: FleetSessionsMiddleware, url: str, **meta: Any) -> Request:
    request = Request(url, meta=meta)
    await mw.process_request(request)
    return request


def test_a_pool_per_host_a_named_pool_and_the_requests_that_skip_pools(redis_url):
    async def body(mw: FleetSessionsMiddleware) -> list[dict[str, Any]]:
        return [(await sent(mw, url, **meta)).meta for url, meta in (
            ("http://a.test/1", {}), ("http://a.test/2", {}), ("http://b.test/1", {}),
            ("http://b.test/2", {"fleet_session_pool": "accounts"}),
            ("http://a.test/3", {"fleet_session": False}),
            ("http://a.test/4", {"cookiejar": "mine"}),
            ("http://a.test/5", {"dont_merge_cookies": True}))]

    metas = run(redis_url, body)
    assert [m.get("fleet_session") for m in metas] == [
        "a.test-1", "a.test-2", "b.test-1", "accounts-1", False, None, None]
    assert metas[0]["cookiejar"] == "session:a.test-1"
    assert metas[0]["fleet_session_generation"] == 1
    assert metas[5]["cookiejar"] == "mine"  # the spider's own jar, as without pools


def test_a_pinned_request_keeps_its_session_an_unknown_one_fails(redis_url):
    async def body(mw: FleetSessionsMiddleware) -> Any:
        pinned = [(await sent(mw, "http://a.test/x", fleet_session="a.test-1")).meta
                  ["fleet_session"] for _ in range(3)]
        with pytest.raises(SessionError) as info:
            await sent(mw, "http://a.test/y", fleet_session="a.test-7")
        return pinned, info.value

    first = run(redis_url, lambda mw: sent(mw, "http://a.test/0"))
    assert first.meta["fleet_session"] == "a.test-1"
    pinned, error = run(redis_url, body)
    assert pinned == ["a.test-1"] * 3
    assert error.fleet_reason == "session/unknown"
    assert "'a.test-7': no such session" in str(error)


def test_a_403_retires_the_session_and_the_request_goes_again_without_it(redis_url):
    async def body(mw: FleetSessionsMiddleware) -> Any:
        request = await sent(mw, "http://a.test/p")
        response = HtmlResponse(request.url, status=403, request=request, body=b"no")
        retry = await mw.process_response(request, response)
        again = await sent(mw, retry.url, **retry.meta)
        second = await mw.process_response(again, HtmlResponse(
            again.url, status=403, request=again, body=b"no"))
        return request.meta["fleet_session"], retry, again.meta["fleet_session"], second

    first, retry, redrawn, second = run(redis_url, body, FLEET_SESSION_RETIRE_STATUSES=[403])
    assert isinstance(retry, Request) and retry.dont_filter
    assert "fleet_session" not in retry.meta and "cookiejar" not in retry.meta
    assert retry.meta["fleet_session_retries"] == 1
    assert redrawn != first
    assert isinstance(second, Request)  # a second session retired: sent once more
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "a.test")
    assert report["counters"]["retired:status/403"] == 2
    assert report["sessions"][first]["state"] == "retired"


def test_without_a_login_a_failed_check_retires_the_session(redis_url):
    async def body(mw: FleetSessionsMiddleware) -> Any:
        request = await sent(mw, "http://a.test/p")
        ok = await mw.process_response(request, HtmlResponse(request.url, request=request,
                                                             body=b"<html>page</html>"))
        bad = await mw.process_response(request, HtmlResponse(request.url, request=request,
                                                              body=b"<html>login</html>"))
        return request.meta["fleet_session"], ok, bad

    sid, ok, bad = run(redis_url, body)
    assert isinstance(ok, HtmlResponse)
    assert isinstance(bad, Request) and "fleet_session" not in bad.meta
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "a.test")
    assert (report["sessions"][sid]["state"], report["sessions"][sid]["reason"]) == (
        "retired", "check")


def test_children_of_the_same_host_keep_their_parents_session():
    from scrapy_fleet.sessions.drawing import FleetSessionsSpiderMiddleware

    crawler = get_crawler(_Spider, settings_dict={"FLEET_SESSION_POOL_SIZE": 2})
    crawler.stats.open_spider()
    mw = FleetSessionsSpiderMiddleware.from_crawler(crawler)
    parent = Request("http://a.test/", meta={"fleet_session": "accounts-2",
                                             "fleet_session_pool": "accounts"})
    response = HtmlResponse(parent.url, request=parent, body=b"")
    children = [Request("http://a.test/1"), Request("http://b.test/1"),
                Request("http://a.test/2", meta={"cookiejar": "mine"}),
                Request("http://a.test/3", meta={"fleet_session_pool": "other"}),
                Request("http://a.test/4", meta={"fleet_session": False}), {"item": 1}]
    out = list(mw.process_spider_output(response, children))
    assert [x.meta.get("fleet_session") for x in out[:5]] == [
        "accounts-2", None, None, None, False]
    assert out[0].meta["fleet_session_pool"] == "accounts"
    assert out[5] == {"item": 1}
    assert crawler.stats.get_value("fleet/sessions/inherited") == 1
    off = get_crawler(_Spider, settings_dict={"FLEET_SESSION_POOL_SIZE": 2,
                                              "FLEET_SESSION_INHERIT": False})
    with pytest.raises(NotConfigured):
        FleetSessionsSpiderMiddleware.from_crawler(off)


def test_one_request_of_a_session_in_flight_at_a_time(redis_url):
    """FLEET_SESSION_CONCURRENCY = 1: a second request of the session waits for the first's
    answer (its slot given back once the answer passed the middleware), then goes; a
    download error gives the slot back too."""
    async def body(mw: FleetSessionsMiddleware) -> dict[str, Any]:
        first = await sent(mw, "http://c.test/1")
        second = Request("http://c.test/2", meta={"fleet_session": first.meta["fleet_session"]})
        waiting = asyncio.ensure_future(mw.process_request(second))
        await asyncio.sleep(0.5)  # (a lower bound: the slot is held whatever the load)
        held = not waiting.done()
        await mw.process_response(first, HtmlResponse(first.url, body=b"ok", request=first))
        await asyncio.wait_for(waiting, 30)
        third = Request("http://c.test/3", meta={"fleet_session": first.meta["fleet_session"]})
        waiting = asyncio.ensure_future(mw.process_request(third))
        await asyncio.sleep(0.5)
        held = held and not waiting.done()
        await mw.process_exception(second, TimeoutError())
        await asyncio.wait_for(waiting, 30)
        return {"held": held, "slots": [r.meta.get("fleet_session_slot", "").split("|")[0]
                                        for r in (second, third)],
                "waits": mw.crawler.stats.get_value("fleet/sessions/slot_waits")}

    out = run(redis_url, body, FLEET_SESSION_CONCURRENCY=1, FLEET_SESSION_POOL_SIZE=1)
    assert out["held"] is True
    assert out["slots"] == ["", "c.test-1"]  # the second's given back by its error
    assert out["waits"] == 2
