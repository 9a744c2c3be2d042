"""The Redis URL frontier: batches of pushes, leases, acknowledgements in one round trip.

:class:`CallBatch` is what a worker sends (lua/frontier.lua documents each field),
:class:`CallResult` what it gets back.  :class:`AsyncFrontier` runs batches from the reactor
(redis.asyncio); :class:`FrontierAdmin` runs them and the read-only queries from commands.

Lease life cycle of an entry (docs/architecture.md has the picture)::

    pushed -> queued --lease(token)--> leased --ack(token)--> gone
                 ^                       |  \\--release(token)--> queued (no penalty)
                 |                       |   \\--dead(token)----> dead letter (corrupt entry)
                 +---- expiry (< max) ---+--- expiry (= FLEET_MAX_LEASES) --> dead letter

Each call carries a fresh operation id; a call repeated after a lost reply (same op id) gets
the first reply back instead of running twice.

This module holds the asyncio client (:class:`AsyncFrontier`, :func:`frontier_size`): the
asyncio transport of the call's description (``call.py``: the steps of a call, written once
for both clients); the call protocol (CallBatch, CallResult, FrontierParams, the ARGV packing,
replay fill-in) is in ``protocol.py``, the worker's duplicate cache in ``dupecache.py``, the
blocking client of the commands in ``admin.py`` (import each name from its home).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio

from scrapy_fleet import lua, redis_client
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier import layout
from scrapy_fleet.frontier.call import FrontierCall, RunScript, Step, WaitReplicas, drive_async
from scrapy_fleet.frontier.dupecache import DUPE_CACHE_SIZE, DupeCache
from scrapy_fleet.frontier.protocol import (
    CallBatch,
    CallResult,
    FrontierParams,
    queue_size_reads,
    size_of,
)
from scrapy_fleet.keys.crawl import CrawlKeys

if TYPE_CHECKING:
    from scrapy_fleet.frontier.port import FrontierBuffer

logger = logging.getLogger(__name__)

#: seconds between two lines of a worker waiting for Redis at start (AsyncFrontier.connect)
CONNECT_LOG_EVERY = 30.0


async def frontier_size(client: redis.asyncio.Redis, keys: CrawlKeys) -> int:
    """Entries held against FLEET_QUEUE_MAX (queued + leased + deferred), one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        queue_size_reads(pipe, keys)
        return size_of(await pipe.execute())


class AsyncFrontier:
    """Frontier client for a worker, on the reactor's asyncio loop.

    Raises:
        RedisUnavailableError: from :meth:`connect` when Redis cannot be reached, and from
            :meth:`call` when it stays unreachable through ``retries`` retries.
    """

    def __init__(self, url: str, keys: CrawlKeys, worker: str, params: FrontierParams,
                 timeout: float = 10.0, retries: int = 3, wait_replicas: int = 0,
                 dupe_cache: int = DUPE_CACHE_SIZE,
                 client: redis.asyncio.Redis | None = None) -> None:
        self.url = url
        self.keys = keys
        self.retries = retries
        #: :meth:`connect`'s failed tries so far (0: reached at once)
        self.connect_tries = 0
        #: seconds between two of :meth:`connect`'s "still not reachable" lines
        self.connect_log_every = CONNECT_LOG_EVERY
        self.timeout = timeout
        #: *client*: one shared with others (a partitioned crawl's partitions), which
        #: :meth:`close` leaves open; else this frontier's own
        self._owns_client = client is None
        self.client: redis.asyncio.Redis = (
            client if client is not None
            else redis_client.make_client(url, timeout, is_async=True))
        self._script = lua.load(self.client, "frontier.lua")
        self.roundtrips = 0  #: round trips of the calls (each attempt, each payload read)
        #: the description of this worker's frontier calls (frontier/call.py)
        self.calls = FrontierCall(keys, params, worker=worker, url=url,
                                  dupes=DupeCache(dupe_cache), wait_replicas=wait_replicas)

    async def connect(self, patience: float = 30.0) -> None:
        """PING the crawl's node, trying again with back-off (0.1 s doubling to 5 s) for up
        to *patience* seconds: the start-up check has just reached Redis, so a failure now
        is a failover or a restart under way, which a worker waits out.

        Then refuse a crawl written by another layout of the package (frontier/layout.py).

        Logs one WARNING at the first failure, then at most one per
        :attr:`connect_log_every` seconds (30) with the count of failed tries, and one INFO
        line once Redis answers (:attr:`connect_tries`: the failed tries).

        Raises:
            RedisUnavailableError: still unreachable after *patience* seconds.
            CrawlLayoutError: the crawl's keys are of another layout.
        """
        deadline = time.monotonic() + patience
        delay = 0.1
        first = logged = 0.0
        self.connect_tries = 0
        while True:
            try:
                await redis_client.ping_async(self.client, self.url, self.keys.stats)
                await layout.check_async(self.client, self.keys)
            except RedisUnavailableError as exc:
                self.connect_tries += 1
                now = time.monotonic()
                if now + delay > deadline:
                    raise
                # one line at the first failure, then at most one per connect_log_every
                # seconds with the count, and one once reached (it was one line per try)
                if self.connect_tries == 1:
                    first = logged = now
                    logger.warning("Redis not reachable yet (%s): trying again for up to "
                                   "%.0f s", exc, patience)
                elif now - logged >= self.connect_log_every:
                    logged = now
                    logger.warning("Redis still not reachable after %d tries (%.0f s): %s",
                                   self.connect_tries, now - first, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            else:
                if self.connect_tries:
                    logger.info("Redis reached after %d failed tries (%.1f s)",
                                self.connect_tries, time.monotonic() - first)
                return

    async def call(self, batch: CallBatch, monitor: bytes = b"", resend: bool = True,
                   op_id: str | None = None) -> CallResult:
        """Run one batch atomically (:meth:`FrontierCall.plan`); retried with the same op
        id on connection errors.  *monitor*: ARGV[2] of lua/frontier.lua (heartbeat and
        counter deltas, ``monitoring.heartbeat.WorkerMonitor.payload``).  *op_id*: default a
        fresh one; :attr:`last_op` after this call failed sends it again as it was (a call
        that ran gives its cached reply, one that did not runs now).

        Links whose Bloom key :attr:`dupes` holds are left out of the call (counted as
        duplicates by the script); after a purge (another filter generation) or a failover
        that lost writes the script refuses such a call before any write, :attr:`dupes` is
        cleared, and the call is sent again in full with a new op id (*resend* False: raises
        :class:`StaleDupeCache` instead, for a caller whose left-out pushes carry no payload
        yet).

        Raises:
            CrawlStateLostError: the crawl marker this client saw at its first call is gone
                (Redis restarted without its data, or the crawl was purged); nothing changed.
            StaleDupeCache: *resend* is False and the call was refused as above; nothing
                changed.
            RedisUnavailableError: Redis stayed unreachable through :attr:`retries` retries.
        """
        return await drive_async(self.calls.plan(batch, monitor, op_id, resend), self._run)

    async def _run(self, step: Step) -> Any:
        """The asyncio transport of a call's steps (frontier/call.py); counts round trips."""
        if isinstance(step, RunScript):
            async def attempt() -> Any:
                self.roundtrips += 1
                return await self._script(keys=step.keys, args=step.args)

            return await redis_client.call_retrying_async(attempt, self.url, self.retries,
                                                          self.client)
        if isinstance(step, WaitReplicas):
            return await redis_client.wait_replicas(self.client, step.key, step.replicas,
                                                    self.timeout)
        self.roundtrips += 1
        return await self.client.hmget(step.key, step.entry_ids)

    @property
    def last_op(self) -> str | None:
        """The op id of the last call's script step (:attr:`FrontierCall.last_op`)."""
        return self.calls.last_op

    @property
    def worker(self) -> str:
        """The worker id the calls are made as."""
        return self.calls.worker

    @property
    def params(self) -> FrontierParams:
        """The per-crawl constants sent with every call (those of :attr:`calls`)."""
        return self.calls.params

    @property
    def wait_replicas(self) -> int:
        """FLEET_REDIS_WAIT_REPLICAS: after a call that pushed requests without a parent
        (start requests), WAIT for that many replicas."""
        return self.calls.wait_replicas

    @property
    def dupes(self) -> DupeCache:
        """Bloom keys known to be in the filter (links with them are not sent)."""
        return self.calls.dupes

    @property
    def marker(self) -> str:
        """The crawl marker seen by this worker's first call; every later call requires it."""
        return self.calls.marker

    @property
    def unreplicated(self) -> int:
        """Calls fewer replicas than :attr:`wait_replicas` acknowledged in time."""
        return self.calls.unreplicated

    @property
    def buffer(self) -> FrontierBuffer | None:
        """None: a call sends everything it is given, nothing is kept between calls (the
        partitioned client keeps some: frontier/partitions.py)."""
        return None

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()
