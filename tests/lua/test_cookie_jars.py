"""The fleet's cookie jars (issue 32 item 1, sessions/): two ``FleetCookiesMiddleware``
instances stand for two workers, against a real Redis; requests and answers are real Scrapy
objects.  Which cookies a request sends is Python's http.cookiejar's decision, as in one
Scrapy process."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from support import server_ms, wait_server_past

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions import CookieTooLargeError
from scrapy_fleet.sessions.middleware import FleetCookiesMiddleware

CRAWL = "jars"


class _Spider(Spider):
    name = CRAWL


def worker(redis_url: str, **settings: Any) -> FleetCookiesMiddleware:
    crawler = get_crawler(_Spider, settings_dict={"FLEET_REDIS_URL": redis_url, **settings})
    crawler.spider = _Spider()
    crawler.stats.open_spider()
    return FleetCookiesMiddleware.from_crawler(crawler)


def run(redis_url: str, body: Callable[..., Awaitable[Any]], workers: int = 2,
        **settings: Any) -> Any:
    async def main() -> Any:
        mws = [worker(redis_url, **settings) for _ in range(workers)]
        try:
            return await body(*mws)
        finally:
            for mw in mws:
                await mw.store().client.aclose()
    return asyncio.run(main())


async def answer(mw: FleetCookiesMiddleware, url: str, *set_cookies: str,
                 **meta: Any) -> Request:
    request = Request(url, meta=meta)
    await mw.process_request(request)
    response = HtmlResponse(url, request=request, body=b"<html></html>",
                            headers={"Set-Cookie": list(set_cookies)})
    await mw.process_response(request, response)
    return request


async def sent(mw: FleetCookiesMiddleware, url: str, **kwargs: Any) -> str:
    request = Request(url, **kwargs)
    await mw.process_request(request)
    return b"; ".join(request.headers.getlist("Cookie")).decode()


def stat(mw: FleetCookiesMiddleware, name: str) -> int:
    return int(mw.crawler.stats.get_value("fleet/cookies/" + name, 0))


def jar(redis_url: str, session: str = "default") -> dict[str, str]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return client.hgetall(CrawlKeys("fleet", CRAWL).cookie_jar(session))


def test_a_cookie_one_worker_received_is_sent_by_another(redis_url):
    async def body(a, b):
        assert await sent(b, "http://example.com/members/") == ""
        await answer(a, "http://example.com/login", "sid=abc; Path=/; HttpOnly")
        return await sent(b, "http://example.com/members/1")

    assert run(redis_url, body) == "sid=abc"
    stored = jar(redis_url)
    assert list(stored) == ["example.com\t/\tsid"]
    assert stored["example.com\t/\tsid"].startswith("0\t")  # a session cookie: no expiry


def test_domain_path_secure_and_public_suffix_rules_are_scrapys(redis_url):
    async def body(a, b):
        await answer(a, "https://www.example.com/a/", "a=1; Domain=example.com; Path=/",
                     "b=2; Path=/a", "c=3; Path=/; Secure", "psl=1; Domain=com; Path=/")
        return [await sent(b, url) for url in (
            "http://other.example.com/", "http://www.example.com/a/x",
            "https://www.example.com/a/x", "https://www.example.com/", "https://example.org/",
            "http://www.example.co/a/")]

    assert run(redis_url, body) == ["a=1", "b=2; a=1", "b=2; c=3; a=1", "c=3; a=1", "", ""]
    assert sorted(jar(redis_url)) == [".example.com\t/\ta", "www.example.com\t/\tc",
                                      "www.example.com\t/a\tb"]


def test_expiry_is_the_servers_clock_and_a_past_expiry_deletes(redis_url):
    client = redis.Redis.from_url(redis_url)

    async def first(a, b):
        before = server_ms(client)
        await answer(a, "http://example.com/", "short=1; Max-Age=1; Path=/", "keep=1; Path=/",
                     "gone=1; Path=/")
        stored = jar(redis_url)
        expiry = int(stored["example.com\t/\tshort"].split("\t")[0])
        # (http.cookiejar keeps whole seconds: Max-Age=1 ends within the next second)
        assert before < expiry <= server_ms(client) + 1000
        assert await sent(b, "http://example.com/") == "gone=1; keep=1; short=1"
        await answer(a, "http://example.com/", "gone=x; Max-Age=0; Path=/")
        assert stat(a, "deleted") == 1
        return expiry

    expiry = run(redis_url, first)
    assert sorted(jar(redis_url)) == ["example.com\t/\tkeep", "example.com\t/\tshort"]
    wait_server_past(client, expiry)

    async def later(a, b):
        assert await sent(b, "http://example.com/") == "keep=1"
        await answer(a, "http://example.com/", "other=1; Path=/")
        return stat(a, "expired")

    assert run(redis_url, later) == 1  # the next merge removed the expired field
    assert sorted(jar(redis_url)) == ["example.com\t/\tkeep", "example.com\t/\tother"]


def test_a_requests_own_cookies_join_its_session_once(redis_url):
    async def body(a, b):
        assert await sent(a, "http://example.com/", cookies={"consent": "yes"}) == \
            "consent=yes"
        assert await sent(a, "http://example.com/x", cookies={"consent": "yes"}) == \
            "consent=yes"
        return stat(a, "writes"), await sent(b, "http://example.com/y")

    assert run(redis_url, body) == (1, "consent=yes")


def test_cookiejar_keys_are_sessions_and_dont_merge_cookies_reads_nothing(redis_url):
    async def body(a, b):
        await answer(a, "http://example.com/", "sid=alice; Path=/", cookiejar="alice")
        await answer(a, "http://example.com/", "sid=bob; Path=/", cookiejar=2)
        own = Request("http://example.com/", headers={"Cookie": "mine=1"},
                      meta={"dont_merge_cookies": True})
        await b.process_request(own)
        await b.process_response(own, HtmlResponse(own.url, request=own, body=b"",
                                                   headers={"Set-Cookie": "x=1"}))
        reads = stat(b, "reads")
        return (await sent(b, "http://example.com/", meta={"cookiejar": "alice"}),
                await sent(b, "http://example.com/", meta={"cookiejar": "2"}),
                await sent(b, "http://example.com/"), own.headers.get("Cookie"), reads)

    assert run(redis_url, body) == ("sid=alice", "sid=bob", "", b"mine=1", 0)
    assert jar(redis_url) == {}


def test_a_cookie_too_large_fails_its_request_and_the_others_are_stored(redis_url):
    big = "v" * 200

    async def body(a, b):
        with pytest.raises(CookieTooLargeError) as raised:
            await answer(a, "http://example.com/", f"big={big}; Path=/", "small=1; Path=/")
        return raised.value, stat(a, "too_large"), await sent(b, "http://example.com/")

    error, too_large, header = run(redis_url, body, FLEET_COOKIE_MAX_BYTES=100)
    assert error.fleet_reason == "cookie/too_large"
    assert "'big' for example.com/ (215 bytes)" in str(error) and big not in str(error)
    assert (too_large, header) == (1, "small=1")


def test_cookie_debug_logs_names_never_values(redis_url, caplog):
    async def body(a, b):
        await answer(a, "http://example.com/", "sid=s3cr3t; Path=/")
        await sent(b, "http://example.com/")

    with caplog.at_level(logging.DEBUG, logger="scrapy_fleet.sessions.middleware"):
        run(redis_url, body, COOKIES_DEBUG=True)
    text = caplog.text
    assert "Set-Cookie: sid=***; Path=/" in text and "Cookie: sid=***" in text
    assert "s3cr3t" not in text


def test_concurrent_merges_of_one_session_lose_nothing(redis_url):
    async def body(*mws):
        await asyncio.gather(*(answer(mws[n % 4], "http://example.com/", f"c{n}={n}; Path=/")
                               for n in range(200)))

    run(redis_url, body, workers=4)
    assert sorted(jar(redis_url)) == sorted(f"example.com\t/\tc{n}" for n in range(200))


def test_a_request_waits_for_its_jar_while_redis_is_down(redis_server, redis_url):
    """Never sent without its cookies: the read waits out the outage, then the request goes
    with the jar's cookies."""
    async def body(a, b):
        await answer(a, "http://example.com/", "sid=abc; Path=/")
        redis_server.client().save()  # the restarted server has the jar back
        redis_server.stop()
        request = Request("http://example.com/next")
        waiting = asyncio.ensure_future(b.process_request(request))
        while stat(b, "redis_waits") < 1:
            await asyncio.sleep(0.05)
        assert not waiting.done()
        redis_server.restart()
        (redis_server.workdir / "dump.rdb").unlink()  # (later restarts start empty)
        await waiting
        return request.headers.get("Cookie"), stat(b, "reads")

    assert run(redis_url, body, FLEET_REDIS_RETRIES=0) == (b"sid=abc", 1)


def test_requests_arriving_together_share_one_read_and_later_ones_read_again(redis_url):
    async def body(a, b):
        await answer(a, "http://example.com/", "sid=abc; Path=/")
        together = [Request(f"http://example.com/{n}") for n in range(10)]
        await asyncio.gather(*(b.process_request(r) for r in together))
        shared = stat(b, "reads")
        await answer(a, "http://example.com/", "lang=fr; Path=/")
        later = await sent(b, "http://example.com/later")
        return ([r.headers.get("Cookie") for r in together], shared, later,
                stat(b, "reads"), stat(b, "jars"))

    headers, shared, later, reads, jars = run(redis_url, body)
    assert headers == [b"sid=abc"] * 10
    assert (shared, later, reads, jars) == (1, "lang=fr; sid=abc", 2, 11)


def test_a_partitioned_crawl_keeps_each_sites_jar_in_that_sites_partition(redis_url):
    """FLEET_PARTITIONS > 1: a session's jar is split by site (registered domain) into the
    site's partition, so one master down stops only its sites' requests (the failover test,
    tests/e2e/test_partitions_cluster.py); the cookies a request sends are unchanged."""
    from scrapy_fleet.keys.partition import partition_of

    parts = 4
    sites = ("example.com", "example.org")
    assert partition_of(sites[0], parts) != partition_of(sites[1], parts)

    async def body(a, b):
        await answer(a, "https://www.example.com/", "a=1; Domain=example.com; Path=/")
        await answer(a, "https://example.org/", "o=2; Path=/")
        return [await sent(b, url) for url in (
            "https://shop.example.com/", "https://example.org/x", "https://example.net/")]

    assert run(redis_url, body, FLEET_PARTITIONS=parts) == ["a=1", "o=2", ""]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = CrawlKeys("fleet", CRAWL)
    for site, field in zip(sites, (".example.com\t/\ta", "example.org\t/\to"), strict=True):
        part = keys.partition(partition_of(site, parts), parts)
        assert list(client.hgetall(part.cookie_jar("default"))) == [field]
    assert not client.exists(keys.cookie_jar("default"))  # (nothing under the crawl's tag)
