"""The crawl marker: written by the crawl's first frontier call, required by a worker's later
calls; its loss (Redis restarted without its data, purge) fails the call before any write."""

from __future__ import annotations

import asyncio

import pytest
import redis

from scrapy_fleet.errors import CrawlStateLostError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys


def test_a_worker_notices_that_redis_lost_the_crawl(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "mark")

    async def main() -> None:
        frontier = AsyncFrontier(redis_url, keys, "w1", FrontierParams())
        try:
            first = await frontier.call(CallBatch(take=1))
            assert first.marker and client.get(keys.marker) == first.marker.encode()
            again = await frontier.call(CallBatch(take=1))
            assert again.marker == first.marker
            client.flushall()  # what a Redis restarted without its data looks like
            with pytest.raises(CrawlStateLostError, match=r"crawl marker .* is gone"):
                await frontier.call(CallBatch(take=1))
            assert client.dbsize() == 0  # refused before any write
            FrontierAdmin(redis_url, "mark").push([(b"", 0, b"\x01\x81\xa1u\xa8http://x/")])
            with pytest.raises(CrawlStateLostError, match="changed"):  # a new crawl's marker
                await frontier.call(CallBatch(take=1))
            other = AsyncFrontier(redis_url, keys, "w2", FrontierParams())
            assert len((await other.call(CallBatch(take=1))).leased) == 1  # a new worker works
            await other.close()
        finally:
            await frontier.close()

    asyncio.run(main())


def test_the_first_push_writes_the_marker_and_pushes_never_require_it(redis_url):
    admin = FrontierAdmin(redis_url, "pm")
    result = admin.push([(b"", 0, b"\x01\x81\xa1u\xa8http://x/")])
    assert result.marker and admin.client.get(admin.keys.marker) == result.marker.encode()
    admin.client.delete(admin.keys.marker)
    assert admin.push([(b"", 0, b"\x01\x81\xa1u\xa8http://y/")]).pushed == 1
