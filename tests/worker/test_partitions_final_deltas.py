"""The worker's last counter deltas reach Redis at every P (issue 33, "exact at every P").

A partitioned worker's counter deltas go with its calls to its home partition
(frontier/partitions.py ``_payloads``); a call that only acknowledges and leases in another
partition carries none of them (the pump keeps them, ``monitor_confirmed`` is False).  When the
last page of a worker was acknowledged by such a call, the closing call had nothing else to
send: the pump skipped it as empty, and that page was never counted in ``counters.pages``
(a clean-clone ``make test`` saw ``counters.pages`` 119 for 120 pages acknowledged at P = 4,
tests/e2e/test_partitions_commands.py).  The closing call now goes whenever the worker has
deltas Redis has not confirmed.  Against a real redis-server, through the pump the scheduler
uses.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from support import hosts_in_partition

from scrapy_fleet import codec
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys

CRAWL = "lastdeltas"
STATUS_200 = "downloader/response_status_count/200"


class _Spider(Spider):
    name = CRAWL


def _scheduler(redis_url: str, parts: int) -> Any:
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": CRAWL, "FLEET_PARTITIONS": parts,
        "CONCURRENT_REQUESTS": 1, "FLEET_PREFETCH": 1,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(_slot=None)  # no crawl running: nothing to wake
    sched.book.spider = _Spider()
    return sched


@pytest.mark.parametrize("parts", [1, 2])
def test_the_closing_call_carries_the_deltas_not_sent_yet(redis_url: str, parts: int) -> None:
    """One page, in a partition other than the worker's home (P = 2), or in the only one
    (P = 1), fetched and acknowledged; then one more response is counted and the worker
    closes with nothing else to send: ``pages`` summed over the partitions is 2."""
    sched = _scheduler(redis_url, parts)
    pump, book = sched.pump, sched.book
    keys = CrawlKeys("fleet", CRAWL)
    host = hosts_in_partition(parts - 1, parts)[0]
    url = f"http://{host}/page"

    async def main() -> None:
        params = sched.config.frontier_params()
        frontier: Any = (PartitionedFrontier(redis_url, keys, "w", params, parts)
                         if parts > 1 else AsyncFrontier(redis_url, keys, "w", params))
        if parts > 1:
            frontier.home = 0
        await frontier.connect()
        await frontier.call(CallBatch(pushes=[(b"", 0, codec.encode(Request(url)), 0, host)]))
        pump.frontier = frontier
        try:
            for _ in range(20):  # the picker tries the (empty) home first
                await pump.call()
                if book.prefetch:
                    break
            request = book.take()
            assert request is not None and request.url == url
            sched.crawler.stats.set_value(STATUS_200, 1)  # its response, counted
            book.finished(request)
            result = await pump.call()  # acknowledges it, and asks for more
            assert result is not None and result.acked == 1
            # a response counted after the worker's last call (its deltas not sent with
            # it: at P > 1 a call leasing and acknowledging in another partition than the
            # home carries none)
            sched.crawler.stats.set_value(STATUS_200, 2)
            book.closing = True
            await pump.call(final=True)
        finally:
            await frontier.close()

    asyncio.run(main())
    client = redis.Redis.from_url(redis_url)
    parts_keys = keys.all_partitions(parts) if parts > 1 else [keys]
    pages = sum(int(client.hget(k.stats, "pages") or 0) for k in parts_keys)
    acked = sum(int(client.hget(k.stats, "acked") or 0) for k in parts_keys)
    assert (acked, pages) == (1, 2)


def test_the_last_deltas_held_back_by_a_call_away_from_home_reach_redis(redis_url: str) -> None:
    """The P = 4 case, step by step at P = 2: two pages in partition 1, the worker's home 0.
    The first page's acknowledgement goes with a lease request for the second, both for
    partition 1 only: that call carries no deltas (``monitor_confirmed`` False; the pump
    keeps its batch, frozen).  The second page's acknowledgement goes with a lease request
    for the (empty) home, which takes the frozen batch (1 page) and confirms it.  The second
    page's response is then counted nowhere but in the closing call, which has nothing else
    to send: before, it was skipped, and ``pages`` was 1 for 2 acknowledged."""
    parts = 2
    sched = _scheduler(redis_url, parts)
    pump, book = sched.pump, sched.book
    keys = CrawlKeys("fleet", CRAWL)
    hosts = hosts_in_partition(1, parts, 2)

    async def main() -> None:
        frontier = PartitionedFrontier(redis_url, keys, "w", sched.config.frontier_params(),
                                       parts)
        frontier.home = 0
        await frontier.connect()
        await frontier.call(CallBatch(pushes=[
            (b"", 0, codec.encode(Request(f"http://{h}/page")), 0, h) for h in hosts]))
        pump.frontier = frontier
        try:
            for pages in (1, 2):
                for _ in range(20):
                    if book.prefetch:
                        break
                    await pump.call()
                request = book.take()
                assert request is not None
                sched.crawler.stats.set_value(STATUS_200, pages)  # its response, counted
                book.finished(request)
                result = await pump.call()
                assert result is not None and result.acked == 1
                if pages == 1:  # (the scenario: these deltas did not go with that call)
                    assert frontier.monitor_confirmed is False
            assert not (book.prefetch or book.done or book.outbox)
            book.closing = True
            await pump.call(final=True)
        finally:
            await frontier.close()

    asyncio.run(main())
    client = redis.Redis.from_url(redis_url)
    pages = [int(client.hget(k.stats, "pages") or 0) for k in keys.all_partitions(parts)]
    acked = [int(client.hget(k.stats, "acked") or 0) for k in keys.all_partitions(parts)]
    assert (acked, sum(pages)) == ([0, 2], 2)
