"""A worker holds at most its downloader's concurrency and a quarter more leases
(frontier/pump.py ``_max_held``), pushed requests in the spider middlewares' start hook
included, against a real redis-server.

A pushed request (``scrapy fleet push``) waits in ``book.starting`` until the start hook is
done with it.  Those leases were left out of the count, so each call while the hook ran took
as many again: a fetch worker (FLEET_ROLE = "fetch") of tests/e2e/test_partitions_stages.py
held 6 leases with CONCURRENT_REQUESTS = 2 and stored that many more responses past
FLEET_RESPONSE_QUEUE_MAX (12 against 5 + 2 + 3 under load).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet.commands.push import default_fingerprinter, push_lines
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys

PUSHED = 20


class _Spider(Spider):
    name = "held"


def test_pushed_requests_in_the_start_hook_count_among_the_leases_a_worker_holds(redis_url):
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": "held", "CONCURRENT_REQUESTS": 2,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    pump, book = sched.pump, sched.book
    book.spider = _Spider()
    admin = FrontierAdmin(redis_url, "held", params=sched.config.frontier_params())
    lines = [(n, f"http://h{n}.test/page") for n in range(1, PUSHED + 1)]
    assert push_lines(admin, lines, default_fingerprinter()).pushed == PUSHED
    # the start hook has not finished with them yet (a middleware awaiting something):
    # their leases stay in book.starting
    started: list[str] = []
    book.on_pushed = lambda request, lease: started.append(request.url)
    crawler.engine = SimpleNamespace(_slot=None)  # no crawl running: nothing to wake

    async def run() -> list[int]:
        frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", "held"), "w1",
                                 sched.config.frontier_params())
        pump.frontier = frontier
        leased = []
        try:
            for _ in range(3):
                await pump.call()
                leased.append(admin.status()["leased"])
        finally:
            await frontier.close()
        return leased

    leased = asyncio.run(run())
    admin.close()
    # CONCURRENT_REQUESTS = 2: 2 + max(1, 2 // 4) = 3 leases at most, whatever the calls
    assert leased == [3, 3, 3]  # (before: 3, 6, 9)
    assert len(started) == len(book.starting) == 3
    assert crawler.stats.get_value("fleet/frontier/leased") == 3
