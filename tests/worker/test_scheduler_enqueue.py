"""FleetScheduler.enqueue_request's cheap path for known duplicates (issue 12, goal 5a),
against a real redis-server: a link whose Bloom key the worker's DupeCache holds is buffered
unencoded and left out of the call; when the frontier refuses the call because the filter is
not the one the cache knew (replaced, or rolled back by a failover), the scheduler encodes
those links and sends them, so none is lost.  Stats are counted in plain ints and flushed
into Scrapy's stats before each frontier call."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from support import frontier_payloads

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys


class _Spider(Spider):
    name = "enq"


def scheduler_for(redis_url: str) -> FleetScheduler:
    """A FleetScheduler of a crawler that never runs: its frontier client is set up the way
    ``open`` does it, without an engine (the calls below are final ones: they lease
    nothing and wake no engine)."""
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": "enq",
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    sched.book.spider = _Spider()
    sched.pump.frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", "enq"), "w1",
                                   sched.config.frontier_params())
    return sched


def stat(sched: FleetScheduler, name: str) -> Any:
    return sched.crawler.stats.get_value(name) if sched.crawler.stats is not None else None


def stored_urls(redis_url: str) -> list[str]:
    keys = CrawlKeys("fleet", "enq")
    client = redis.Redis.from_url(redis_url)
    try:
        return sorted(codec.decode_dict(p)["url"] for p in frontier_payloads(client, keys))
    finally:
        client.close()


def test_known_duplicate_is_buffered_unencoded_left_out_and_counted(redis_url):
    sched = scheduler_for(redis_url)

    async def run() -> tuple[Any, Any, Any]:
        assert sched.pump.frontier is not None
        try:
            assert sched.enqueue_request(Request("http://h.test/a")) is True
            first = sched.book.outbox[0][3]
            await sched.pump.call(final=True)
            assert sched.enqueue_request(Request("http://h.test/a")) is True
            assert sched.enqueue_request(Request("http://h.test/b")) is True
            lazy = [type(o[3]) for o in sched.book.outbox]
            result = await sched.pump.call(final=True)
            return first, lazy, result
        finally:
            await sched.pump.frontier.close()

    first, lazy, result = asyncio.run(run())
    assert isinstance(first, bytes)  # unknown: encoded at once
    assert lazy == [Request, bytes]  # a is known: its request waits, unencoded
    assert result is not None and result.cached == 1 and result.pushed == 1
    assert stored_urls(redis_url) == ["http://h.test/a", "http://h.test/b"]
    assert stat(sched, "scheduler/enqueued/redis") == 3
    assert stat(sched, "scheduler/enqueued") == 3
    assert stat(sched, "dupefilter/filtered") == 1
    assert stat(sched, "fleet/dupefilter/cached") == 1
    assert not sched.book.outbox


def test_known_duplicates_are_encoded_and_sent_when_the_filter_is_not_the_cached_one(
        redis_url):
    """The filter is replaced while the crawl goes on (its keys deleted, the crawl marker
    kept: what a failover that lost writes looks like to the cache): the call that leaves a
    out is refused before any write, and the scheduler sends it again with a encoded.  A start
    request among them stays pending until that call and is pushed by it."""
    sched = scheduler_for(redis_url)
    keys = CrawlKeys("fleet", "enq")

    async def run() -> tuple[Any, Any, Any, Any]:
        assert sched.pump.frontier is not None
        try:
            sched.enqueue_request(Request("http://h.test/a"))
            await sched.pump.call(final=True)
            start = Request("http://h.test/a", meta={codec.START_META_KEY: 0})
            sched.enqueue_request(start)
            sched.enqueue_request(Request("http://h.test/c"))
            lazy = [type(o[3]) for o in sched.book.outbox]
            pending = sched.book.first_unpushed_start()
            await sched.pump.frontier.client.delete(keys.bloom_meta, keys.bloom_slice(0))
            result = await sched.pump.call(final=True)
            return lazy, pending, result, sched.book.first_unpushed_start()
        finally:
            await sched.pump.frontier.close()

    lazy, pending, result, pending_after = asyncio.run(run())
    assert lazy == [Request, bytes] and pending == 0
    assert result is not None and result.pushed == 2 and result.cached == 0
    assert stat(sched, "fleet/dupefilter/cache_cleared") == 1
    # a twice (the new filter did not know it), c once: nothing was lost to the cache
    assert stored_urls(redis_url) == ["http://h.test/a", "http://h.test/a", "http://h.test/c"]
    assert pending_after is None
    assert not sched.book.outbox
    FrontierAdmin(redis_url, "enq").purge()


def test_a_request_with_a_live_page_is_refused_even_when_known(redis_url):
    """A known duplicate holding a browser page in meta is encoded at once (and refused
    with the fix in the log), not buffered: its page must be closed now, not leak."""
    sched = scheduler_for(redis_url)

    async def run() -> bool:
        assert sched.pump.frontier is not None
        try:
            sched.enqueue_request(Request("http://h.test/p"))
            await sched.pump.call(final=True)
            return sched.enqueue_request(Request("http://h.test/p",
                                                 meta={"playwright_page": object()}))
        finally:
            await sched.pump.frontier.close()

    assert asyncio.run(run()) is False
    assert stat(sched, "fleet/codec/encode_error") == 1
    assert not sched.book.outbox
