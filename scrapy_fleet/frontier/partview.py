"""What a partitioned worker learns of the whole crawl from its partitions' replies
(``FLEET_PARTITIONS`` > 1, docs/partitions.md): whether the fleet is idle across every
partition, and the response queue of stored responses (stages, docs/stages.md), which lives in
one partition.  Used by :class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from scrapy_fleet import lua, redis_client
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.keys.calls import PROBE_CALL
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.keys.partition import partition_of

if TYPE_CHECKING:
    import redis.asyncio

    from scrapy_fleet.frontier.lean import LeanResult
    from scrapy_fleet.frontier.picker import PartitionPicker
    from scrapy_fleet.frontier.protocol import CallBatch, CallResult


class FleetIdleness:
    """The fleet's idleness over the partitions *part_keys*: when the partitions a call
    reached all report idle for *idle_timeout* seconds (None: never closes when idle), every
    partition is probed (lua/partition_probe.lua); the fleet is idle only when each of them is
    idle that long on its own clock (push before ack: no work can hide between partitions)."""

    def __init__(self, client: redis.asyncio.Redis, url: str, retries: int,
                 part_keys: list[CrawlKeys], idle_timeout: float | None) -> None:
        self.client = client
        self.url = url
        self.retries = retries
        self.part_keys = part_keys
        self.idle_timeout = idle_timeout
        self._probe = lua.load(client, "partition_probe.lua")

    async def probe(self, start_clock: bool = True) -> list[list[Any]]:
        """lua/partition_probe.lua on every partition (concurrently): per partition
        ``[idle ms, queued, leased, deferred, parked, marker, now ms]``.

        Raises:
            RedisUnavailableError: a partition stayed unreachable through the retries.
        """
        async def one(k: CrawlKeys) -> list[Any]:
            async def attempt() -> list[Any]:
                return await self._probe(  # type: ignore[no-any-return]
                    keys=k.call_keys(PROBE_CALL), args=["1" if start_clock else "0"])
            return await redis_client.call_retrying_async(  # type: ignore[no-any-return]
                attempt, self.url, self.retries, self.client)

        return list(await asyncio.gather(*(one(k) for k in self.part_keys)))

    async def idle_ms(self, reached_idle_ms: int, waiting_work: bool,
                      picker: PartitionPicker) -> int:
        """The fleet's idle time in ms (-1: busy) after a call whose partitions reported
        *reached_idle_ms*; *waiting_work*: the worker keeps work of its own (busy).  Probes
        every partition (their queue sizes go to *picker*) once the reply looks idle long
        enough; a probe that fails counts as busy (the call itself went through)."""
        if waiting_work:
            return -1
        if (reached_idle_ms < 0 or self.idle_timeout is None
                or reached_idle_ms < self.idle_timeout * 1000):
            return reached_idle_ms
        try:
            rows = await self.probe()
        except RedisUnavailableError:
            return -1
        for p, row in enumerate(rows):
            picker.note_probe(p, int(row[1]))
        idles = [int(row[0]) for row in rows]
        return -1 if min(idles) < 0 else min(idles)


class ResponseQueueView:
    """The response queue (stored responses waiting for a parse worker) as a partitioned
    worker sees it: the figures of the partition of the stored responses, :attr:`part`."""

    def __init__(self, parts: int) -> None:
        #: the partition of the stored responses (FLEET_ROLE, docs/stages.md)
        self.part = partition_of(STAGE_HOST, parts)
        #: its last figures (count, bytes); None: none seen, no stored response in this
        #: crawl as far as this worker knows (once seen, that partition is called with every
        #: heartbeat, so a fetch worker that stopped leasing sees the queue drain)
        self.last: tuple[int, int] | None = None

    def note(self, lean: dict[int, LeanResult], by_part: dict[int, CallResult]) -> None:
        """File a call's replies: a cross-partition push's *lean* and the frontier calls'
        *by_part* (partition -> reply)."""
        q = self.part
        if q in lean and lean[q].rq is not None:
            self.last = lean[q].rq
        if q in by_part and (self.last is not None or any(by_part[q].response_queue)):
            self.last = by_part[q].response_queue  # (the frontier call ran after the lean one)

    def seen(self, keep: CallBatch) -> tuple[int, int]:
        """(count, bytes): the stage partition's last figures plus the stored responses
        waiting in *keep*, this worker's buffer (pushed before long: a fetch worker must not
        lease on past the bound meanwhile)."""
        waiting = [push.payload for push in keep.pushes if push.host == STAGE_HOST]
        if waiting and self.last is None:
            self.last = (0, 0)
        count, size = self.last or (0, 0)
        return count + len(waiting), size + sum(len(x) for x in waiting)
