"""A partitioned worker's heartbeat and counter deltas go with its call to its home partition
(issue 21).  When that partition cannot be reached while the others can, the deltas are not
lost: the pump keeps them (monitoring/heartbeat.py ``confirmed`` is not called) and they go
again, unchanged (same ``cs``), to that same partition until it answers; meanwhile the home
gets the heartbeat alone.  Against a real redis-server; the unreachable partition is an ACL
user without its keys (standing for a master being failed over)."""

from __future__ import annotations

import asyncio
import os
import time

import redis
from support import partition_user

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.monitoring.heartbeat import WorkerMonitor

KEYS = CrawlKeys("fleet", "deltas")
STATUS_200 = "downloader/response_status_count/200"


class _Stats:
    """The part of Scrapy's stats collector WorkerMonitor reads."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def get_stats(self) -> dict[str, int]:
        return dict(self.values)


def test_the_deltas_of_a_failed_home_call_go_again_to_that_partition_and_count_once(
        redis_server, redis_url):
    parts = 2
    host0 = next(h for h in (f"h{i}.test" for i in range(100)) if partition_of(h, parts) == 0)
    tag0, tag1 = (KEYS.partition(p, parts).base for p in range(parts))
    client = redis.Redis.from_url(redis_url)
    stats = _Stats()
    monitor = WorkerMonitor(stats, FleetConfig.from_settings({}), time.time(), "host", 1)

    def pages() -> list[int]:
        return [int(client.hget(k.stats, "pages") or 0) for k in KEYS.all_partitions(parts)]

    async def main() -> None:
        fr = PartitionedFrontier(url, KEYS, "w", FrontierParams(), parts)

        async def call(batch: CallBatch) -> None:  # as the pump calls
            await fr.call(batch, monitor.payload("running", 0, 0))
            if getattr(fr, "monitor_confirmed", True):
                monitor.confirmed()

        def push(tag: bytes) -> CallBatch:
            return CallBatch(pushes=[(os.urandom(12), 0, tag, 0, host0)])
        try:
            fr.home = 1
            stats.values[STATUS_200] = 3
            await call(push(b"a"))  # partition 0 answers, partition 1 (with the deltas) not
            assert pages() == [0, 0]
            fr.home = 0  # the home moved on: the deltas still wait for partition 1
            stats.values[STATUS_200] = 5
            await call(push(b"b"))
            assert pages() == [0, 0]
            assert client.zscore(KEYS.partition(0, parts).workers, "w") is not None  # the beat
            reach(tag1)  # partition 1 is back
            await call(push(b"c"))
            assert pages() == [0, 3]  # the first batch, once, where it was sent first
            await call(CallBatch(beat=True))
            await call(CallBatch(beat=True))
            assert pages() == [2, 3]  # then the next one, at the home
        finally:
            await fr.close()
    with partition_user(redis_server, "deltas", tag0) as (url, reach):
        asyncio.run(main())
