"""The Redis URL frontier: batches of pushes, leases, acknowledgements in one round trip.

:class:`SyncBatch` is what a worker sends (lua/frontier.lua documents each field),
:class:`SyncResult` what it gets back.  :class:`AsyncFrontier` runs batches from the reactor
(redis.asyncio); :class:`FrontierAdmin` runs them and the read-only queries from commands.

Lease life cycle of an entry (docs/architecture.md has the picture)::

    pushed -> queued --lease(token)--> leased --ack(token)--> gone
                 ^                       |  \\--release(token)--> queued (no penalty)
                 |                       |   \\--dead(token)----> dead letter (corrupt entry)
                 +---- expiry (< max) ---+--- expiry (= FLEET_MAX_LEASES) --> dead letter

Each call carries a fresh operation id; a call repeated after a lost reply (same op id) gets
the first reply back instead of running twice.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack
import redis
import redis.asyncio

from scrapy_fleet import lua, redis_client
from scrapy_fleet.config import STAGE_HOST
from scrapy_fleet.errors import CrawlStateLostError, RedisUnavailableError
from scrapy_fleet.keys import CrawlKeys
from scrapy_fleet.politeness.hosts import effective_policy

logger = logging.getLogger(__name__)

OP_TTL_MS = 300_000
#: expired leases one call reclaims at most (a reclaim storm is spread over calls; each
#: reclaim costs ~10 µs of Redis time: bench/bench_capacity.py --storm)
RECLAIM_LIMIT = 50
#: largest |Request.priority| the frontier orders by (lua/hosts.lua checks it too): the
#: scheduler clamps larger ones (the request itself keeps its priority), pushes refuse them
PRIORITY_LIMIT = 2**31


def clamp_priority(priority: int) -> int:
    """*priority* within +-PRIORITY_LIMIT (the frontier's order of requests beyond it is
    that of the limit)."""
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, int(priority)))


@dataclass
class SyncBatch:
    """One worker call.  Ids are entry ids (str), tokens fencing tokens (int), priorities ints.

    ``pushes`` holds ``(bloom_key, priority, payload[, group, host, delay_ms])``: bloom_key
    is 12 bytes, or ``b""`` for a ``dont_filter`` request (never checked, always a new
    entry); group 0 (the default) is a push without a parent, group k (1-based) a link
    found by the request of the k-th acknowledgement, pushed or not with it (see
    lua/frontier.lua); host (default ``""``: not counted per host) is the host name the
    per-host bound applies to; delay_ms (default 0) keeps the new entry among the deferred
    ones that long before it is queued.

    ``acks`` holds ``(entry id, token[, failure record])``: the record (msgpack bytes,
    ``failures.record.FailureRecord.encode``) of a request that failed for good is stored
    with its acknowledgement, in the same atomic call (lua/failed.lua).
    """

    acks: list[tuple[Any, ...]] = field(default_factory=list)
    releases: list[tuple[str, int]] = field(default_factory=list)
    dead: list[tuple[str, int, str]] = field(default_factory=list)
    extends: list[tuple[str, int]] = field(default_factory=list)
    pushes: list[tuple[Any, ...]] = field(default_factory=list)
    take: int = 0
    #: leases whose download is over: their host's concurrency slot is free (the lease
    #: itself lasts until its acknowledgement)
    downloaded: list[tuple[str, int]] = field(default_factory=list)
    #: a heartbeat is due: the call is made even with nothing else to carry
    beat: bool = False

    def is_empty(self) -> bool:
        return not (self.acks or self.releases or self.dead or self.extends or self.pushes
                    or self.take or self.downloaded or self.beat)


@dataclass(frozen=True)
class LeasedEntry:
    entry_id: str
    token: int
    payload: bytes
    expiries: int  #: how many leases of this entry expired before


@dataclass
class SyncResult:
    leased: list[LeasedEntry]
    lost: list[str]  #: entries whose ack/extend carried a stale token
    push_flags: list[int]  #: per push, 1 new entry / 0 duplicate, refused or not pushed
    refused: list[int]  #: indexes of pushes without a parent refused because of the bounds
    pushed: int
    duplicates: int
    acked: int
    released: int
    reclaimed: int
    dead_lettered: int
    parked: int  #: acknowledgements turned into parkings (links left over)
    deferred: int  #: acknowledgements turned into deferrals (no link could be pushed)
    resumed: int  #: parked requests returned to the queue by this call
    queued: int  #: entries waiting, after this call
    inflight: int  #: entries leased fleet-wide, after this call
    delayed: int  #: deferred entries, after this call
    size: int  #: queued + inflight + delayed: what FLEET_QUEUE_MAX bounds
    idle_ms: int  #: how long the fleet has been idle (nothing queued or leased), -1 if busy
    now_ms: int  #: Redis server time
    bloom_full: bool
    holds: dict[str, float] = field(default_factory=dict)  #: host -> seconds of hold left
    #: stored responses waiting for a parse worker (stages): count and bytes
    response_queue: tuple[int, int] = (0, 0)
    #: seconds until the next host may be fetched (its GCRA turn, a hold), when the call
    #: leased fewer requests than it asked for; None: no host is waiting for a time
    next_ready: float | None = None
    marker: str = ""  #: the crawl marker (lua/failed.lua), "" when none was written
    #: indexes of the pushes the Bloom filter (or this call) had seen: duplicates
    seen: list[int] = field(default_factory=list)
    #: generation id of the Bloom filter the pushes were checked against (None: none were)
    bloom_gen: str | None = None
    #: of the duplicates, pushes the worker's cache knew (left out of the call)
    cached: int = 0
    #: the reply cache of this client's previous call was gone (expired, or lost in a
    #: failover with that call's writes): what the client learnt of the filter is not trusted
    prev_lost: bool = False

    @classmethod
    def from_reply(cls, reply: bytes) -> SyncResult:
        # Redis's cmsgpack packs every string as msgpack "raw": read them as bytes.
        d = {k.decode(): v for k, v in msgpack.unpackb(reply, raw=True).items()}
        leased = [LeasedEntry(e[0].decode(), int(e[1]), e[2], int(e[3]))
                  for e in d.get("leased", [])]
        return cls(
            leased=leased,
            lost=[x.decode() for x in d.get("lost", [])],
            push_flags=[int(x) for x in d.get("pf", [])],
            refused=[int(x) for x in d.get("rf", [])],
            parked=int(d.get("parked", 0)), deferred=int(d.get("deferred", 0)),
            resumed=int(d.get("resumed", 0)), delayed=int(d.get("delayed", 0)),
            size=int(d.get("size", 0)),
            pushed=int(d.get("new", 0)), duplicates=int(d.get("dup", 0)),
            acked=int(d.get("acked", 0)), released=int(d.get("released", 0)),
            reclaimed=int(d.get("reclaimed", 0)), dead_lettered=int(d.get("dead", 0)),
            queued=int(d.get("queued", 0)), inflight=int(d.get("inflight", 0)),
            idle_ms=int(d.get("idle", -1)), now_ms=int(d.get("now", 0)),
            bloom_full=bool(d.get("full", False)),
            holds={h.decode(): float(left) / 1000 for h, left in d.get("holds", [])},
            next_ready=float(d["nr"]) / 1000 if d.get("nr") is not None else None,
            response_queue=_pair(d.get("rq")),
            marker=(d.get("mk") or b"").decode(errors="replace"),
            seen=[int(x) for x in d.get("pd", [])],
            bloom_gen=d["bg"].decode() if isinstance(d.get("bg"), bytes) else None,
            prev_lost=bool(d.get("pl", 0)),
        )


def _pair(value: Any) -> tuple[int, int]:
    """``[count, bytes]`` of the reply's ``rq`` (0, 0 when absent)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return 0, 0


@dataclass(frozen=True)
class FrontierParams:
    """Per-crawl constants sent with every call.  Times in seconds."""

    lease_timeout: float = 30.0
    max_leases: int = 3
    bloom_capacity: int = 1_000_000
    bloom_error_rate: float = 0.001
    queue_max: int | None = None  #: FLEET_QUEUE_MAX
    host_queue_max: int | None = None  #: FLEET_HOST_QUEUE_MAX
    defer_delay: float = 10.0  #: FLEET_BACKPRESSURE_DELAY
    host_interval: float = 0.0  #: seconds between two requests to one host, fleet-wide
    host_burst: int = 1  #: GCRA burst of a host
    host_concurrency: int = 0  #: requests in flight to one host, fleet-wide (0: no cap)
    robots: bool = False  #: ROBOTSTXT_OBEY: one scout per host until its robots.txt is known
    host_interval_is_rate: bool = False  #: host_interval comes from a rate (may catch up)
    #: stages (FLEET_ROLE): lease only from this host key ("" any), or never from this one
    lease_only_host: str = ""
    lease_except_host: str = ""
    failed_max: int = 10_000  #: FLEET_FAILED_MAX: failed requests kept, the oldest trimmed
    op_ttl: float = OP_TTL_MS / 1000  #: seconds a call's cached reply is kept (replays)


#: Bloom keys a worker remembers as being in the filter (FLEET_DUPEFILTER_CACHE's default)
DUPE_CACHE_SIZE = 100_000
STALE_GENERATION = "stale filter generation"


class StaleDupeCache(Exception):
    """The frontier refused a call that left known duplicates out: the Bloom filter is not
    the one the DupeCache knew (purge, failover).  The cache is cleared; nothing changed."""


class DupeCache:
    """Bloom keys this worker knows to be in the fleet's Bloom filter, at most *size* of them
    (the oldest are forgotten first).

    A Bloom filter never forgets a fingerprint, so a key seen in the filter stays a duplicate
    until the filter itself is replaced (``purge``): the cache holds the filter's generation
    id (lua/bloom.lua, field ``g``) with its keys, and a call that leaves keys out names that
    generation (``bg``); under another generation the script refuses the call before any
    write and the client clears the cache and sends the full call again.  A failover to a
    replica that lacked the latest writes rolls the filter back without a new generation:
    the script then finds the reply cache of the client's previous call gone (replication is
    in order), refuses a call that leaves keys out, and says so in every reply (``pl``), and
    the cache is cleared.  A link left out costs Redis nothing (no payload, no bit read).
    """

    def __init__(self, size: int = DUPE_CACHE_SIZE) -> None:
        self.size = size
        self.gen: str | None = None
        self._keys: dict[bytes, None] = {}
        self.hits = 0  #: pushes left out so far (known duplicates)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def clear(self) -> None:
        self._keys.clear()
        self.gen = None

    def split(self, batch: SyncBatch) -> tuple[SyncBatch, list[int], int]:
        """(the batch to send, index in *batch* of each push sent, pushes left out)."""
        if not self._keys or self.gen is None or not batch.pushes:
            return batch, list(range(len(batch.pushes))), 0
        kept: list[int] = []
        for i, p in enumerate(batch.pushes):
            if not (p[0] and p[0] in self._keys):
                kept.append(i)
        left_out = len(batch.pushes) - len(kept)
        self.hits += left_out
        if not left_out:
            return batch, kept, 0
        sent = replace(batch, pushes=[batch.pushes[i] for i in kept])
        return sent, kept, left_out

    def learn(self, sent: SyncBatch, result: SyncResult) -> None:
        """Remember the keys of *sent* that *result* found in the filter or added to it."""
        if result.prev_lost:
            self.clear()  # the state may have rolled back: nothing learnt before holds
        if result.bloom_gen is None:
            return
        if result.bloom_gen != self.gen:
            self._keys.clear()
            self.gen = result.bloom_gen
        if self.size <= 0:
            return
        keys = self._keys
        for i, flag in enumerate(result.push_flags):
            if flag and i < len(sent.pushes) and sent.pushes[i][0]:
                keys[sent.pushes[i][0]] = None
        for i in result.seen:
            if i < len(sent.pushes) and sent.pushes[i][0]:
                keys[sent.pushes[i][0]] = None
        over = len(keys) - self.size
        if over > 0:
            for key in list(itertools.islice(keys, over + self.size // 10)):
                del keys[key]


def _expand(result: SyncResult, kept: list[int], total: int, left_out: int) -> SyncResult:
    """*result* of a call sent without the pushes the cache left out, with indexes of the
    whole batch again: a left-out push is a duplicate (flag 0, in ``seen``)."""
    if not left_out:
        return result
    flags = [0] * total
    for j, flag in enumerate(result.push_flags):
        if j < len(kept):
            flags[kept[j]] = flag
    sent_seen = {kept[j] for j in result.seen if j < len(kept)}
    kept_set = set(kept)
    result.seen = sorted(sent_seen | {i for i in range(total) if i not in kept_set})
    result.push_flags = flags
    result.refused = [kept[j] for j in result.refused if j < len(kept)]
    result.duplicates += left_out
    result.cached = left_out
    return result


def _arg(batch: SyncBatch, worker: str, params: FrontierParams, marker: str = "",
         left_out: int = 0, gen: str | None = None) -> bytes:
    """ARGV[1] of lua/frontier.lua.  *marker*: the crawl marker the client saw ("" before
    its first call, or for a client that must not require one, like the push helper);
    *left_out*: pushes the worker's DupeCache left out, known to be in the filter of
    generation *gen*."""
    return msgpack.packb({
        "ld": left_out,
        "bg": gen or "",
        "w": worker,
        "lm": int(params.lease_timeout * 1000),
        "ml": params.max_leases,
        "ot": int(params.op_ttl * 1000),
        "a": [list(a) for a in batch.acks],
        "r": [list(r) for r in batch.releases],
        "d": [list(d) for d in batch.dead],
        "x": [list(x) for x in batch.extends],
        "s": [list(x) for x in batch.downloaded],
        "p": [[p[0], int(p[1]), p[2], int(p[3]) if len(p) > 3 else 0,
               p[4] if len(p) > 4 else "", int(p[5]) if len(p) > 5 else 0]
              for p in batch.pushes],
        "t": batch.take,
        "bn": params.bloom_capacity,
        "bp": params.bloom_error_rate,
        "rc": RECLAIM_LIMIT,
        "qm": params.queue_max or 0,
        "hm": params.host_queue_max or 0,
        "dd": int(params.defer_delay * 1000),
        "pt": int(params.host_interval * 1000),
        "pb": params.host_burst,
        "pc": params.host_concurrency,
        "ro": 1 if params.robots else 0,
        "pr": 1 if params.host_interval_is_rate else 0,
        "ho": params.lease_only_host,
        "hx": params.lease_except_host,
        "fm": params.failed_max,
        "mk": marker,
        "mc": uuid.uuid4().hex,
    }, use_bin_type=False)  # Redis's cmsgpack cannot read msgpack "bin"


def _int(value: Any, default: Any = 0) -> Any:
    """*value* (bytes or str from Redis) as an int; *default* when it is not one (a value not
    written by the fleet must not stop ``status``)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _policy_defaults(config: Any) -> dict[str, Any]:
    """The per-host defaults of the crawl's ``config`` hash (hosts.policy_fields), with
    neutral values for the fields a worker has not written (or not as numbers)."""
    text = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in config.items()}
    out: dict[str, Any] = {"host_key": text.get("host_key", "host")}
    for name, default in (("host_interval_ms", 0), ("host_interval_is_rate", 0),
                          ("host_burst", 1), ("host_concurrency", 0)):
        out[name] = _int(text.get(name), default)
    return out


def _seeding_state(fields: list[bytes | None]) -> str | None:
    """"done", "in progress", or None (no worker consumed start requests yet)."""
    holder, _, done = fields
    if done == b"1":
        return "done"
    return "in progress" if holder else None


def _state_lost(exc: redis.ResponseError, url: str) -> CrawlStateLostError | None:
    """*exc* as a :class:`CrawlStateLostError` when frontier.lua found the crawl marker gone."""
    text = str(exc)
    if "fleet: crawl state lost" not in text:
        return None
    from scrapy_fleet.redact import redact

    return CrawlStateLostError(f"Redis at {redact(url)} has lost this crawl's state: "
                               f"{text.split('crawl state lost: ', 1)[-1]}")


def _needs_payloads(result: SyncResult) -> list[str]:
    """Entry ids whose payload is missing: the reply was a cached replay (see frontier.lua)."""
    return [e.entry_id for e in result.leased if not e.payload]


def _fill_payloads(result: SyncResult, payloads: list[Any]) -> SyncResult:
    filled = []
    it = iter(payloads)
    for e in result.leased:
        if e.payload:
            filled.append(e)
        else:
            filled.append(LeasedEntry(e.entry_id, e.token, next(it) or b"", e.expiries))
    result.leased = filled
    return result


def _queue_size_reads(pipe: Any, keys: CrawlKeys) -> None:
    """Queue on *pipe* (sync or asyncio) the reads :func:`_size_of` adds up."""
    for key in keys.size_keys:
        pipe.zcard(key)
    pipe.get(keys.queue_count)


def _size_of(replies: list[Any]) -> int:
    """The frontier's size from the replies of :func:`_queue_size_reads`."""
    *sizes, queued = replies
    return int(sum(sizes)) + _int(queued)


async def frontier_size(client: redis.asyncio.Redis, keys: CrawlKeys) -> int:
    """Entries held against FLEET_QUEUE_MAX (queued + leased + deferred), one round trip."""
    async with client.pipeline(transaction=False) as pipe:
        _queue_size_reads(pipe, keys)
        return _size_of(await pipe.execute())


class AsyncFrontier:
    """Frontier client for a worker, on the reactor's asyncio loop.

    Raises:
        RedisUnavailableError: from :meth:`connect` when Redis cannot be reached, and from
            :meth:`sync` when it stays unreachable through ``retries`` retries.
    """

    def __init__(self, url: str, keys: CrawlKeys, worker: str, params: FrontierParams,
                 timeout: float = 10.0, retries: int = 3, wait_replicas: int = 0,
                 dupe_cache: int = DUPE_CACHE_SIZE) -> None:
        self.url = url
        self.keys = keys
        self.worker = worker
        self.params = params
        self.retries = retries
        self.timeout = timeout
        #: FLEET_REDIS_WAIT_REPLICAS: after a call that pushed requests without a parent
        #: (start requests), WAIT for that many replicas
        self.wait_replicas = wait_replicas
        self.unreplicated = 0  #: calls fewer replicas than wait_replicas acknowledged
        self.client: redis.asyncio.Redis = redis_client.async_client(url, timeout)
        self._script = lua.load(self.client, "frontier.lua")
        self._prev_op = "-"
        self.roundtrips = 0
        #: the crawl marker seen by this worker's first call; every later call requires it
        self.marker = ""
        #: Bloom keys known to be in the filter (links with them are not sent)
        self.dupes = DupeCache(dupe_cache)

    async def connect(self, patience: float = 30.0) -> None:
        """PING the crawl's node, trying again with back-off (0.1 s doubling to 5 s) for up
        to *patience* seconds: the start-up check has just reached Redis, so a failure now
        is a failover or a restart under way, which a worker waits out.

        Raises:
            RedisUnavailableError: still unreachable after *patience* seconds.
        """
        deadline = time.monotonic() + patience
        delay = 0.1
        while True:
            try:
                return await redis_client.ping_async(self.client, self.url, self.keys.stats)
            except RedisUnavailableError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                logger.warning("Redis not reachable yet (%s): trying again in %.1f s", exc,
                               delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def sync(self, batch: SyncBatch, monitor: bytes = b"",
                   resend: bool = True) -> SyncResult:
        """Run one batch atomically; retried with the same op id on connection errors.
        *monitor*: ARGV[2] of lua/frontier.lua (heartbeat and counter deltas,
        ``monitoring.heartbeat.WorkerMonitor.payload``).

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
        """
        try:
            return await self._sync(batch, self.dupes.split(batch), monitor)
        except redis.ResponseError as exc:
            if STALE_GENERATION not in str(exc):
                raise
            self.dupes.clear()
            if not resend:
                raise StaleDupeCache(str(exc)) from exc
            return await self._sync(batch, (batch, list(range(len(batch.pushes))), 0), monitor)

    async def _sync(self, batch: SyncBatch, split: tuple[SyncBatch, list[int], int],
                    monitor: bytes) -> SyncResult:
        sent, kept, left_out = split
        op = uuid.uuid4().hex
        keys = self.keys.frontier_keys(op, self._prev_op, self.worker)
        arg = _arg(sent, self.worker, self.params, self.marker, left_out, self.dupes.gen)

        async def attempt() -> bytes:
            self.roundtrips += 1
            return await self._script(  # type: ignore[no-any-return]
                keys=keys, args=[arg, monitor])

        try:
            reply = await redis_client.call_retrying_async(attempt, self.url, self.retries)
        except redis.ResponseError as exc:
            lost = _state_lost(exc, self.url)
            if lost is not None:
                raise lost from None
            raise
        self._prev_op = op
        if self.wait_replicas and any(len(p) > 3 and not p[3] for p in batch.pushes):
            acked = await redis_client.wait_replicas_async(
                self.client, self.keys.stats, self.wait_replicas, self.timeout)
            if acked < self.wait_replicas:
                self.unreplicated += 1
        result = SyncResult.from_reply(reply)
        if not self.marker:
            self.marker = result.marker
        self.dupes.learn(sent, result)
        result = _expand(result, kept, len(batch.pushes), left_out)
        missing = _needs_payloads(result)
        if missing:
            self.roundtrips += 1
            result = _fill_payloads(result, await self.client.hmget(self.keys.data, missing))
        return result

    async def close(self) -> None:
        await self.client.aclose()


class FrontierAdmin:
    """Blocking frontier access for commands and scripts: push, status, purge, dead letters.

    Raises:
        RedisUnavailableError: when Redis cannot be reached (message names the URL).
    """

    def __init__(self, url: str, crawl_id: str, prefix: str = "fleet",
                 params: FrontierParams | None = None, timeout: float = 10.0,
                 retries: int = 3, wait_replicas: int = 0, dupe_cache: int = 0) -> None:
        self.url = url
        self.keys = CrawlKeys(prefix, crawl_id)
        self.params = params or FrontierParams()
        self.retries = retries
        self.timeout = timeout
        #: FLEET_REDIS_WAIT_REPLICAS: after each call, WAIT for that many replicas
        self.wait_replicas = wait_replicas
        self.unreplicated = 0  #: calls fewer replicas than wait_replicas acknowledged
        self._client: Any = None
        self._script: Any = None
        self._prev_op = "-"
        #: Bloom keys known to be in the filter (*dupe_cache* > 0; see DupeCache)
        self.dupes = DupeCache(dupe_cache)

    @property
    def client(self) -> Any:
        """The blocking client (``redis.Redis``, or ``RedisCluster`` for a cluster URL),
        made on first use.

        Raises:
            RedisUnavailableError: a cluster none of whose start-up nodes answers.
        """
        if self._client is None:
            self._client = redis_client.sync_client(self.url, self.timeout)
        return self._client

    def ping(self, role: str | None = None) -> None:
        """PING; with *role* (``worker``, ``monitor``, ``admin``: scrapy_fleet/acl.py) also
        check that the Redis user may run every command of that role.

        Raises:
            RedisUnavailableError: Redis cannot be reached.
            RedisPermissionError: naming the commands the user may not run.
        """
        redis_client.ping_sync(self.client, self.url, self.keys.stats)
        if role is not None:
            from scrapy_fleet import acl

            acl.check_sync(self.client, self.keys, role,
                           cluster=redis_client.is_cluster(self.client))

    def _node(self) -> dict[str, Any]:
        """``target_nodes`` of the crawl's node for keyless commands (TIME, SCAN) on a
        cluster; nothing on one server."""
        return redis_client.node_of(self.client, self.keys.stats)

    def server_ms(self) -> int:
        """The Redis server's clock (of the crawl's node), in milliseconds."""
        seconds, micros = self.client.time(**self._node())
        return int(seconds) * 1000 + int(micros) // 1000

    def sync(self, batch: SyncBatch, worker: str = "", op_id: str | None = None,
             monitor: bytes = b"") -> SyncResult:
        """Run one batch (see :class:`AsyncFrontier.sync`), blocking.  *op_id* (default: a
        fresh one) names the call: the same id again replays the first reply."""
        if self._script is None:
            self._script = lua.load(self.client, "frontier.lua")
        # a call named by the caller may be a replay: it must carry what the first one did,
        # whatever the cache learned since, so it is sent whole
        whole = (batch, list(range(len(batch.pushes))), 0)
        try:
            return self._sync(batch, worker, op_id,
                              self.dupes.split(batch) if op_id is None else whole, monitor)
        except redis.ResponseError as exc:
            if STALE_GENERATION not in str(exc):
                raise
            self.dupes.clear()
            return self._sync(batch, worker, None, whole, monitor)

    def _sync(self, batch: SyncBatch, worker: str, op_id: str | None,
              split: tuple[SyncBatch, list[int], int], monitor: bytes) -> SyncResult:
        sent, kept, left_out = split
        op = op_id or uuid.uuid4().hex
        keys = self.keys.frontier_keys(op, self._prev_op, worker)
        arg = _arg(sent, worker, self.params, "", left_out, self.dupes.gen)
        reply = redis_client.call_retrying(lambda: self._script(keys=keys, args=[arg, monitor]),
                                           self.url, self.retries)
        self._prev_op = op
        if self.wait_replicas:
            acked = redis_client.wait_replicas_sync(self.client, self.keys.stats,
                                                    self.wait_replicas, self.timeout)
            if acked < self.wait_replicas:
                self.unreplicated += 1
        result = SyncResult.from_reply(reply)
        self.dupes.learn(sent, result)
        result = _expand(result, kept, len(batch.pushes), left_out)
        missing = _needs_payloads(result)
        if missing:
            result = _fill_payloads(result, self.client.hmget(self.keys.data, missing))
        return result

    def push(self, pushes: list[tuple[Any, ...]]) -> SyncResult:
        """Push ``(bloom_key or b"", priority, payload[, 0, host])`` entries without parent;
        ``push_flags`` say new/duplicate, ``refused`` which ones the bounds refused."""
        return self.sync(SyncBatch(pushes=pushes))

    def size(self) -> int:
        """Entries the frontier holds against FLEET_QUEUE_MAX: queued + leased + deferred."""
        with self.client.pipeline(transaction=False) as pipe:
            _queue_size_reads(pipe, self.keys)
            return _size_of(pipe.execute())

    def status(self) -> dict[str, Any]:
        """Counts of the crawl: queued, leased, dead, seen (Bloom), workers, idle seconds, and
        the fleet-wide counters of the stats hash (pushed, duplicates, leased, acked, ...)."""
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(k.queue)
            pipe.zcard(k.leases)
            pipe.hlen(k.dead)
            pipe.hgetall(k.bloom_meta)
            pipe.hgetall(k.stats)
            pipe.zrange(k.workers, 0, -1, withscores=True)
            pipe.get(k.idle_since)
            pipe.hmget(k.seeding, "holder", "progress", "done")
            pipe.zcard(k.delayed)
            pipe.llen(k.parked)
            pipe.hget(k.hostq, STAGE_HOST)
            pipe.get(k.queue_count)
            (queued, leased, dead, meta, stats, workers, idle, seeded, delayed,
             parked, stored, bucketed) = pipe.execute()
        queued += _int(bucketed)  # (the queue ZSET: entries of the previous format)
        server_ms = self.server_ms()  # not in the pipeline: a cluster pipeline refuses TIME
        meta = {a.decode(errors="replace"): b.decode(errors="replace") for a, b in meta.items()}
        seen = sum(_int(v) for name, v in meta.items() if name.startswith("c"))
        idle_ms = _int(idle, None) if idle is not None else None
        return {
            "crawl_id": k.crawl_id,
            "queued": queued,
            "leased": leased,
            "dead": dead,
            "delayed": delayed,
            "parked": parked,
            "size": queued + leased + delayed,
            "seen": seen,
            "bloom_slices": _int(meta.get("slices", 0)),
            "counters": {a.decode(errors="replace"): _int(b) for a, b in stats.items()},
            "workers": {w.decode(): round((server_ms - score) / 1000, 1) for w, score in workers},
            "idle_seconds": None if idle_ms is None else round((server_ms - idle_ms) / 1000, 1),
            "seeded_by": seeded[0].decode(errors="replace") if seeded[0] else None,
            "start_requests": _seeding_state(seeded),
            # stages (FLEET_ROLE): stored responses waiting for or in a parse worker
            "stored_responses": _int(stored),
            "stored_bytes": _int(stats.get(b"response_queue_bytes", 0)),
        }

    def hosts(self, limit: int = 50) -> list[dict[str, Any]]:
        """Per-host politeness state, busiest hosts first (up to *limit*): entries in the
        frontier, requests in flight, seconds until the host may be fetched, hold left,
        Crawl-delay, consecutive failures, override."""
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.hostq)
            pipe.hgetall(k.hostlive)
            pipe.zrange(k.ready, 0, -1, withscores=True)
            pipe.hgetall(k.hold)
            pipe.hgetall(k.crawldelay)
            pipe.hgetall(k.fails)
            pipe.hgetall(k.hostconf)
            pipe.hgetall(k.config)
            queued, live, ready, hold, delay, fails, conf, config = pipe.execute()
        now = self.server_ms()  # not in the pipeline: a cluster pipeline refuses TIME
        defaults = _policy_defaults(config)
        ready_at = {h: score for h, score in ready}
        names = set(queued) | set(live) | set(hold) | set(ready_at)
        rows = []
        for h in names:
            at = ready_at.get(h)
            interval, burst, cap, _ = effective_policy(
                defaults, conf[h].decode(errors="replace") if h in conf else None,
                _int(delay[h], None) if h in delay else None)
            rows.append({
                "host": h.decode(),
                "entries": int(queued.get(h, 0)),
                "in_flight": int(live.get(h, 0)),
                "next_in": None if at is None or at >= 9e15 else max(0.0, (at - now) / 1000),
                "waits_for_slot": at is not None and at >= 9e15,
                "hold_left": max(0.0, (int(hold.get(h, 0)) - now) / 1000),
                "crawl_delay": int(delay[h]) / 1000 if h in delay else None,
                "failures": int(fails.get(h, 0)),
                "override": conf[h].decode() if h in conf else None,
                # its policy as the lease step applies it (defaults, override, Crawl-delay)
                "interval": interval,
                "rate": round(1 / interval, 3) if interval > 0 else None,
                "burst": burst,
                "cap": cap,
            })
        rows.sort(key=lambda r: (-r["entries"], -r["in_flight"], r["host"]))
        return rows[:limit]

    def host_policy(self) -> dict[str, Any] | None:
        """The fleet-wide per-host defaults the workers run with (written by each worker at
        start): {host_key, interval (s, 0: none), rate (per s, or None), burst, cap (0:
        none), is_rate}; None before any worker started."""
        config = self.client.hgetall(self.keys.config)
        if b"host_interval_ms" not in config:
            return None
        defaults = _policy_defaults(config)
        interval = int(defaults["host_interval_ms"]) / 1000
        return {"host_key": defaults.get("host_key", "host"), "interval": interval,
                "rate": round(1 / interval, 3) if interval > 0 else None,
                "burst": int(defaults["host_burst"]), "cap": int(defaults["host_concurrency"]),
                "is_rate": bool(int(defaults["host_interval_is_rate"]))}

    def dead_letters(self, limit: int = 100) -> Iterator[dict[str, Any]]:
        """Dead letters as dicts {entry_id, reason, at (ms), data (bytes)}, up to *limit*."""
        n = 0
        for entry_id, raw in self.client.hscan_iter(self.keys.dead, count=100):
            if n >= limit:
                return
            try:
                d = {k.decode(): v for k, v in msgpack.unpackb(raw, raw=True).items()}
                reason = d.get("reason", b"")
                reason = reason.decode(errors="replace") if isinstance(reason, bytes) \
                    else str(reason)
            except Exception:  # not written by the fleet: show it, do not stop the listing
                d, reason = {"data": raw}, "unreadable dead letter (not written by the fleet)"
            yield {"entry_id": entry_id.decode(errors="replace"), "reason": reason,
                   "at": d.get("at"), "data": d.get("data", b"")}
            n += 1

    def has_state(self) -> bool:
        """Whether Redis holds anything of this crawl (one EXISTS): a push writes the entry
        counter, a worker its bounds and heartbeat, every call the counters."""
        k = self.keys
        return bool(self.client.exists(k.seq, k.stats, k.config, k.workers, k.bloom_meta,
                                       k.queue, k.queue_count, k.dead))

    def crawl_keys(self) -> list[bytes]:
        return list(self.client.scan_iter(match=self.keys.pattern, count=1000, **self._node()))

    def purge(self) -> int:
        """Delete every key of the crawl (queue, leases, dupefilter, stats...); returns how many."""
        deleted = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.keys.pattern, count=1000, **self._node()):
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.client.unlink(*batch)
                batch = []
        if batch:
            deleted += self.client.unlink(*batch)
        return deleted

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
