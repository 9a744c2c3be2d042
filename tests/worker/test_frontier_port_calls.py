"""At P = 1 a pump call is one call of the frontier script (issue 33: the one-partition
crawl keeps its single round trip through the frontier interface, frontier/port.py), counted
with Redis's own ``INFO commandstats`` around a worker's calls: leasing, acknowledging with a
push, a heartbeat, the closing call."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from scrapy import Request, Spider
from support import idle_scheduler

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.keys.crawl import CrawlKeys

CRAWL = "portcalls"
URLS = [f"http://h{n}.test/page" for n in range(6)]
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval", "eval_ro")


class _Spider(Spider):
    name = CRAWL


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
               for name in SCRIPT_COMMANDS)


def _setup(redis_url: str) -> tuple[Any, FrontierAdmin]:
    return idle_scheduler(redis_url, _Spider(), URLS, {
        # each call carries the heartbeat and extends the leases held (its steps run too)
        "FLEET_HEARTBEAT_INTERVAL": 0.001})


def test_each_pump_call_at_one_partition_is_one_frontier_script_call(redis_url: str) -> None:
    sched, admin = _setup(redis_url)
    pump, book = sched.pump, sched.book
    client = admin.client
    made: list[int] = []  # per pump call: the script calls Redis counted

    async def counted(**kwargs: Any) -> Any:
        before = _script_calls(client)
        result = await pump.call(**kwargs)
        made.append(_script_calls(client) - before)
        return result

    async def main() -> None:
        frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", CRAWL), "w",
                                 sched.config.frontier_params())
        pump.frontier = frontier
        try:
            leased = await counted()  # a lease request
            assert leased is not None and len(leased.leased) == 2
            first, second = book.take(), book.take()
            assert first is not None and second is not None
            book.finished(first)
            sched.enqueue_request(Request("http://h9.test/new"))  # a push without a parent
            acked = await counted()  # an acknowledgement, a push, a lease request
            assert acked is not None and acked.acked == 1 and acked.pushed == 1
            beat = await counted()  # a heartbeat alone, extending the lease held
            assert beat is not None and beat.lost == [] and beat.acked == 0
            book.finished(second)
            final = await counted(final=True)  # acknowledges, releases the rest
            assert final is not None and final.acked == 1
        finally:
            await frontier.close()

    asyncio.run(main())
    assert made == [1, 1, 1, 1]
    assert admin.client.hget(admin.keys.stats, "acked") == b"2"
    # the partition counts are a partitioned client's stats: none at one partition
    stats = sched.crawler.stats.get_stats()
    assert not [name for name in stats if name.startswith("fleet/partitions/")]
    admin.close()
