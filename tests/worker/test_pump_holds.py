"""A worker keeps the hold it noted itself (a 429's Retry-After, book.note_hold) when the
reply of a frontier call that was on its way meanwhile comes back without it, against a real
redis-server: the reply's holds are the fleet's as of that call, and used to replace the
worker's own outright, so the worker could lease the held host until its next call."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys


class _Spider(Spider):
    name = "holds"


def test_a_reply_without_the_workers_own_new_hold_keeps_it(redis_url):
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": "holds",
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    pump, book = sched.pump, sched.book
    book.spider = _Spider()
    crawler.engine = SimpleNamespace(_slot=None)  # no crawl running: nothing to wake

    async def run() -> tuple[float, float, int]:
        frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", "holds"), "w1",
                                 sched.config.frontier_params())
        pump.frontier = frontier
        try:
            # a call on its way (its reply names no hold), then the worker's own 429
            result = await frontier.call(CallBatch(take=1))
            book.note_hold("a.test", 30.0)
            book.note_hold("b.test", 0.0)  # (one already over: not kept)
            pump.receive(result)
            return book.hold_left("a.test"), book.hold_left("b.test"), len(result.holds)
        finally:
            await frontier.close()

    a_left, b_left, fleet_holds = asyncio.run(run())
    assert fleet_holds == 0
    assert a_left > 0.0  # (before: 0, the reply's holds replaced the worker's)
    assert b_left == 0.0 and "b.test" not in book.holds
