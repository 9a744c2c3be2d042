"""What the pump and the scheduler need from a worker's frontier client: :class:`WorkerFrontier`.

Two clients satisfy it (checked by mypy where the scheduler builds one, and by
tests/unit/test_frontier_port.py): :class:`~scrapy_fleet.frontier.client.AsyncFrontier`
(one partition, ``FLEET_PARTITIONS`` = 1: each pump call is one FCALL of lua/frontier.lua)
and :class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier` (P > 1: a pump call becomes
one call per partition it touches, docs/partitions.md).

A client that keeps work of its own between calls (links for another partition, parts kept
for a partition's next call) says so through :attr:`WorkerFrontier.buffer`, a
:class:`FrontierBuffer`; one that sends everything it is given has ``buffer = None``.  What a
call reached and whether its monitoring payload got through come back with its reply
(``CallResult.reached``, ``CallResult.monitor_confirmed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import redis.asyncio

    from scrapy_fleet.frontier.dupecache import DupeCache
    from scrapy_fleet.frontier.protocol import CallBatch, CallResult
    from scrapy_fleet.keys.crawl import CrawlKeys


class FrontierBuffer(Protocol):
    """Work a frontier client keeps between the pump's calls (no I/O)."""

    def flush_in(self) -> float | None:
        """Seconds until buffered work is due (0: now; None: nothing buffered).  The pump
        calls then even with nothing of its own to send."""

    def flush_now(self) -> None:
        """Make every buffered part due at the next call (the worker is closing)."""

    @property
    def acks_held(self) -> int:
        """Pages the pump acknowledged whose acknowledgement waits here: their leases are
        still in Redis, counted among the leases the worker's heartbeat reports."""


class WorkerFrontier(Protocol):
    """A worker's frontier client, as frontier/pump.py and frontier/scheduler.py use it."""

    @property
    def keys(self) -> CrawlKeys:
        """The crawl's own keys (its config, its worker list; a partition's are
        ``keys.partition(p, P)``)."""

    @property
    def client(self) -> redis.asyncio.Redis:
        """The connection the calls go through (the scheduler's start-up writes use it)."""

    @property
    def dupes(self) -> DupeCache:
        """The Bloom keys known to be duplicates (the lease book leaves those links
        unencoded)."""

    @property
    def last_op(self) -> str | None:
        """After :meth:`call` raised: the op id to send the same batch again with (a call
        that ran gives its cached reply); None: it did not run, send anew."""

    @property
    def unreplicated(self) -> int:
        """Calls fewer replicas than :attr:`wait_replicas` acknowledged in time, so far."""

    @property
    def wait_replicas(self) -> int:
        """FLEET_REDIS_WAIT_REPLICAS."""

    @property
    def buffer(self) -> FrontierBuffer | None:
        """What the client keeps between calls (None: it keeps nothing)."""

    async def connect(self, patience: float = 30.0) -> None:
        """Reach Redis (every partition), waiting up to *patience* seconds.

        Raises:
            RedisUnavailableError: still unreachable then.
            CrawlLayoutError: the crawl's keys are of another layout.
        """

    async def call(self, batch: CallBatch, monitor: bytes = b"", resend: bool = True,
                   op_id: str | None = None) -> CallResult:
        """One frontier call with *batch* and the monitoring payload *monitor*; *op_id*:
        :attr:`last_op` of the call that raised, sent again as it was.  *resend* False:
        a call refused for a stale cache of duplicates raises ``StaleDupeCache`` (the
        caller encodes the links it left unencoded, then calls again).

        Raises:
            CrawlStateLostError: Redis no longer holds the crawl.
            StaleDupeCache: as above.
            RedisUnavailableError: Redis stayed unreachable through the retries.
        """
        ...

    async def close(self) -> None:
        """Close the client's connections."""
