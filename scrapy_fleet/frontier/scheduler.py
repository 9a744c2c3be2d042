"""FleetScheduler: Scrapy's scheduler interface on top of the shared Redis frontier.

Data flow in one worker (docs/architecture.md)::

    spider output --enqueue_request--> outbox --+
    engine done with a request --------> done --+--> pump: one frontier.lua call --> Redis
    next_request <-- prefetch (decoded) <-------+        (push + ack + extend + lease)

* ``enqueue_request`` encodes the request and buffers it; it never touches the network.
  A request found by another one in flight (a link its callback yielded, noted by
  ``FleetSpiderMiddleware``; a redirect or retry made from it, recognised by the private meta
  key ``_fleet_lease``) is buffered with its parent and sent with the parent's
  acknowledgement, so the frontier can apply its bounds to the pair (docs/backpressure.md).
* ``next_request`` pops the local prefetch; it never touches the network.
* A background task (the pump) sends everything buffered in one round trip: new requests
  (through the Bloom filter), acknowledgements of finished requests, lease extensions, and a
  request for more leases when the prefetch runs low.  The requests a response yielded are in
  the outbox before the engine reports that response done, so they reach the frontier in the
  same atomic call as the parent's acknowledgement, or in an earlier one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import redis
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.reactor import is_asyncio_reactor_installed

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError, RedisUnavailableError, RequestEncodeError
from scrapy_fleet.frontier import memory
from scrapy_fleet.frontier.client import AsyncFrontier, SyncBatch, SyncResult, clamp_priority
from scrapy_fleet.frontier.dupefilter import RedisBloomDupeFilter
from scrapy_fleet.keys import CrawlKeys
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.politeness.middlewares import robots_of
from scrapy_fleet.redis_client import is_oom

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

#: pushes sent in one frontier call at most (a request's links all go in one call)
PUSH_CHUNK = 200  # (~1 ms of Redis for 200 links it does not know: bench_capacity.py)
LEASE_META_KEY = codec.LEASE_META_KEY
START_META_KEY = codec.START_META_KEY

#: (url, bloom key, priority, payload, host) of a buffered request
_Out = tuple[str, bytes, int, bytes, str]


class _Lease:
    __slots__ = ("children", "downloaded", "entry_id", "lost", "token")

    def __init__(self, entry_id: str, token: int) -> None:
        self.entry_id = entry_id
        self.token = token
        self.lost = False
        self.downloaded = False  #: its download is over (its host's slot is given back)
        self.children: list[_Out] = []  #: links found by this request, sent with its ack


class FleetScheduler(BaseScheduler):
    """Scheduler whose queue is the fleet's Redis frontier (enabled by ``scrapy_fleet.Addon``).

    Settings: ``FLEET_*`` (docs/settings.md).  Stats: ``scheduler/enqueued/redis``,
    ``scheduler/dequeued/redis`` and ``fleet/frontier/*``, ``fleet/redis/*``,
    ``fleet/codec/*`` (docs/stats.md).

    Raises:
        FleetConfigError: from ``from_crawler`` on a wrong ``FLEET_*`` setting, or from
            ``open`` when the reactor is not Twisted's asyncio reactor.
        RedisUnavailableError: from ``open`` when Redis cannot be reached.
    """

    def __init__(self, crawler: Crawler, config: FleetConfig, dupefilter: BaseDupeFilter) -> None:
        self.crawler = crawler
        self.config = config
        self.df = dupefilter
        self.stats = crawler.stats
        self.spider: Spider | None = None
        self.frontier: AsyncFrontier | None = None
        self._prefetch: deque[tuple[Request, _Lease]] = deque()
        self._inflight: dict[int, tuple[Request, _Lease]] = {}
        self._done: list[_Lease] = []
        self._downloaded: list[_Lease] = []  # downloads over, not yet told to the frontier
        self._outbox: list[_Out] = []  # requests without a parent in flight
        #: id(outbox entry) -> index of a start request (middlewares.START_META_KEY) not yet
        #: accepted by the frontier
        self._start_pending: dict[int, int] = {}
        #: FleetSpiderMiddleware is reading start requests, or waiting to take them over:
        #: an idle frontier does not close this worker then (more may come)
        self.start_active = False
        self._outbox_hold_until = 0.0  # the frontier refused them: retry after this time
        self._parents: dict[int, tuple[Request, _Lease]] = {}  # id(child) -> (child, lease)
        self._by_entry: dict[str, _Lease] = {}  # entry id -> lease, for requests in flight
        self._dead: list[tuple[_Lease, str]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._fleet_done = False
        self._last_extend = 0.0
        self._uninstall_hook: Any = None
        self._logged_dupe = False
        self._logged_clamp = False
        self._lost_total = 0
        self._withheld: str | None = None  # why finished requests are no longer acknowledged
        #: host -> time.monotonic() until which it is on hold, from the last frontier call
        self.holds: dict[str, float] = {}
        concurrency = crawler.settings.getint("CONCURRENT_REQUESTS")
        #: leases this worker holds at most: its downloader's concurrency and a quarter more
        self._max_held = concurrency + max(1, concurrency // 4)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetScheduler:
        from scrapy.utils.misc import build_from_crawler, load_object

        config = FleetConfig.from_settings(crawler.settings)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(crawler, config, build_from_crawler(df_cls, crawler))

    # -- Scrapy scheduler interface -------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not is_asyncio_reactor_installed():
            raise FleetConfigError(
                "TWISTED_REACTOR must be the asyncio reactor "
                "(twisted.internet.asyncioreactor.AsyncioSelectorReactor) for scrapy_fleet")
        self.spider = spider
        if hasattr(self.df, "open"):
            self.df.open()
        crawl_id = self.config.resolve_crawl_id(spider.name)
        keys = CrawlKeys(self.config.key_prefix, crawl_id)
        self.frontier = AsyncFrontier(self.config.redis_url, keys, self.config.worker_id,
                                      self.config.frontier_params(),
                                      self.config.redis_timeout, self.config.redis_retries,
                                      dupe_cache=self.config.dupefilter_cache)
        await self.frontier.connect()
        await politeness.Politeness(self.frontier.client, keys, self.config,
                                    self.config.worker_id).write_overrides()
        # the bounds the workers run with, for pushes from outside the project
        await self.frontier.client.hset(keys.config, mapping={
            "queue_max": self.config.queue_max or 0,
            "low_watermark": self.config.queue_low_watermark,
            "host_queue_max": self.config.host_queue_max or 0,
            "host_key": self.config.host_key})
        for warning in await memory.check_redis_memory(self.frontier.client, self.config):
            logger.warning(warning, extra={"spider": spider})
            self._inc("fleet/backpressure/memory_warnings")
        self._uninstall_hook = engine_hooks.on_request_done(self.crawler, self._request_done)
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._pump())
        self._wake.set()
        logger.info("Fleet worker %s joined crawl %r at %s", self.config.worker_id, crawl_id,
                    self._redacted_url(), extra={"spider": spider})

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        self._closing = True
        if self._uninstall_hook is not None:
            self._uninstall_hook()
        if self._task is not None and self._wake is not None:
            self._wake.set()
            try:
                await self._task
            except Exception:
                logger.exception("Fleet pump failed")
        if self.frontier is not None:
            await self._final_flush(reason)
            try:
                await self.frontier.client.zrem(self.frontier.keys.workers, self.config.worker_id)
            except Exception:  # leaving the worker list is best effort
                pass
            await self.frontier.close()
        if hasattr(self.df, "close"):
            self.df.close(reason)

    def has_pending_requests(self) -> bool:
        return bool(self._prefetch or self._outbox or self._inflight or self._done
                    or not self._fleet_done)

    def note_parent(self, child: Request, parent: Request | None) -> None:
        """Record that *child* was yielded by the callback of *parent* (a request this
        worker leased), so that it is pushed with *parent*'s acknowledgement."""
        if parent is None:
            return
        entry = self._inflight.get(id(parent))
        if entry is not None:
            self._parents[id(child)] = (child, entry[1])

    def _parent_lease(self, request: Request) -> _Lease | None:
        noted = self._parents.pop(id(request), None)
        if noted is not None and noted[0] is request:
            return noted[1]
        entry_id = request.meta.get(LEASE_META_KEY)
        if isinstance(entry_id, str):
            lease = self._by_entry.get(entry_id)
            if lease is not None and id(request) not in self._inflight:
                return lease
        return None

    def _robots_disallow(self, request: Request) -> bool:
        robots = robots_of(self.crawler)
        if robots is None or request.meta.get("dont_obey_robotstxt"):
            return False
        if robots.disallows(request):
            self._inc("fleet/politeness/robots_disallowed")
            self._inc("robotstxt/forbidden")
            return True
        return False

    def enqueue_request(self, request: Request) -> bool:
        if not isinstance(self.df, RedisBloomDupeFilter) and not request.dont_filter:
            if self.df.request_seen(request):
                self.df.log(request, self.spider)  # type: ignore[arg-type]
                return False
        if self._robots_disallow(request):
            return False  # never leased: it would cost its host a turn for nothing
        try:
            payload = codec.encode(request, self.spider)
        except RequestEncodeError as exc:
            logger.error("%s; request dropped", exc, extra={"spider": self.spider})
            self._inc("fleet/codec/encode_error")
            self._inc(f"fleet/codec/encode_error/{type(exc.__cause__ or exc).__name__}")
            return False
        key = b"" if request.dont_filter or not isinstance(self.df, RedisBloomDupeFilter) \
            else self.df.bloom_key(request)
        priority = clamp_priority(request.priority)
        if priority != request.priority:
            self._inc("fleet/frontier/priority_clamped")
            if not self._logged_clamp:
                logger.warning("Request priority %d is beyond +-2**31: the frontier orders "
                               "<%s %s> as %d (logged once)", request.priority, request.method,
                               request.url, priority, extra={"spider": self.spider})
                self._logged_clamp = True
        out: _Out = (request.url, key, priority, payload,
                     politeness.host_key(request.url, self.config.host_key))
        parent = self._parent_lease(request)
        if parent is not None:
            parent.children.append(out)
        else:
            self._outbox.append(out)
            start_index = request.meta.get(START_META_KEY)
            if isinstance(start_index, int):
                self._start_pending[id(out)] = start_index
        self._inc("scheduler/enqueued/redis")
        self._inc("scheduler/enqueued")
        self._poke()
        return True

    def next_request(self) -> Request | None:
        if not self._prefetch:
            return None
        request, lease = self._prefetch.popleft()
        self._inflight[id(request)] = (request, lease)
        self._by_entry[lease.entry_id] = lease
        request.meta[LEASE_META_KEY] = lease.entry_id
        self._inc("scheduler/dequeued/redis")
        self._inc("scheduler/dequeued")
        if len(self._prefetch) <= self.config.prefetch // 2:
            self._poke()
        return request

    @property
    def closing(self) -> bool:
        """The scheduler is closing (its last frontier call is under way or done)."""
        return self._closing

    def first_unpushed_start(self) -> int | None:
        """Index of the first start request (``FleetSpiderMiddleware`` numbers them) that this
        worker holds and the frontier has not accepted yet, or None.  Every start request
        before it was pushed, found a duplicate, or dropped with an error."""
        return min(self._start_pending.values(), default=None)

    def __len__(self) -> int:
        return len(self._prefetch) + len(self._outbox)

    @property
    def outbox_size(self) -> int:
        """Requests buffered locally, waiting to be pushed (with or without a parent)."""
        return len(self._outbox) + sum(len(lease.children) for lease in self._done)

    # -- completion ------------------------------------------------------------------------

    def withhold_acknowledgements(self, reason: str) -> None:
        """Acknowledge no request from now on, and lease no more: the requests this worker
        finishes stay leased by it and are released when it closes (back to the queue, no
        expiry counted), so another worker fetches them again.  For a component that learns
        that their output was not handed on: ``MongoPipeline`` after a failure no retry heals
        (*reason*: its close reason).  Stat ``fleet/frontier/withheld``: requests finished
        and not acknowledged."""
        if self._withheld is None:
            self._withheld = reason
            logger.warning("Fleet worker stops acknowledging requests (%s): the requests it "
                           "still finishes go back to the frontier when it closes", reason,
                           extra={"spider": self.spider})

    def _request_done(self, request: Request) -> None:
        if self._withheld is not None:
            if id(request) in self._inflight:  # stays held: released by the final flush
                self._inc("fleet/frontier/withheld")
            return
        entry = self._inflight.pop(id(request), None)
        if entry is None:
            return
        lease = entry[1]
        self._by_entry.pop(lease.entry_id, None)
        if lease.lost:
            # another worker fetches this request again and will push its links
            self._inc("fleet/frontier/lease_lost")
            return
        self._done.append(lease)
        self._poke()

    def download_over(self, request: Request) -> None:
        """A leased request's download is over (response or failure): its host's concurrency
        slot goes back to the fleet with the next frontier call, while the response is still
        being parsed, as Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN counts downloads only.
        ``FleetPolitenessMiddleware`` calls it once it has put the host on hold if the answer
        asks for that, so that no slot is handed on before the hold.  Redirects and retries
        of the request carry the same entry id; only the first download counts."""
        lease = self._by_entry.get(request.meta.get(LEASE_META_KEY, ""))
        if lease is None or lease.downloaded or lease.lost:
            return
        lease.downloaded = True
        self._downloaded.append(lease)
        self._poke()

    # -- the pump --------------------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _held_leases(self) -> list[_Lease]:
        held = [lease for _, lease in self._prefetch]
        held += [lease for _, lease in self._inflight.values() if not lease.lost]
        return held

    def _wait_time(self) -> float:
        heartbeat = self.config.lease_timeout / 3
        until_extend = max(0.0, self._last_extend + heartbeat - time.monotonic())
        if len(self._prefetch) < self.config.prefetch and not self._fleet_done:
            return min(self.config.poll_interval, until_extend)
        return until_extend

    async def _pump(self) -> None:
        assert self._wake is not None
        backoff = 0.1
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._wait_time())
            except asyncio.TimeoutError:
                pass
            if self._closing:
                return
            self._wake.clear()
            if self.config.flush_interval and (self._outbox or self._done or self._downloaded):
                await asyncio.sleep(self.config.flush_interval)  # coalesce a burst
            try:
                await self._sync_once(final=False)
                backoff = 0.1
            except RedisUnavailableError as exc:
                self._inc("fleet/redis/errors")
                logger.error("Fleet frontier unreachable, retrying in %.1f s: %s", backoff, exc,
                             extra={"spider": self.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:
                self._inc("fleet/redis/errors")
                logger.exception("Fleet frontier call failed", extra={"spider": self.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    def _build_batch(self, final: bool) -> tuple[SyncBatch, int, int, int]:
        """The next call: finished requests with their links (all of a request's links in
        one call), requests without a parent, dead letters, heartbeats, a lease request."""
        batch = SyncBatch()
        n_done = 0
        for lease in self._done:
            if n_done and len(batch.pushes) + len(lease.children) > PUSH_CHUNK:
                break
            n_done += 1
            batch.acks.append((lease.entry_id, lease.token))
            batch.pushes += [(key, prio, payload, n_done, host)
                             for _, key, prio, payload, host in lease.children]
        n_out = 0
        if final or time.monotonic() >= self._outbox_hold_until:
            n_out = max(0, min(len(self._outbox), PUSH_CHUNK - len(batch.pushes)))
            batch.pushes += [(key, prio, payload, 0, host)
                             for _, key, prio, payload, host in self._outbox[:n_out]]
        dead = list(self._dead)
        batch.dead = [(lease.entry_id, lease.token, reason) for lease, reason in dead]
        batch.downloaded = [(lease.entry_id, lease.token) for lease in self._downloaded]
        now = time.monotonic()
        if final:
            batch.releases = [(lease.entry_id, lease.token) for lease in self._held_leases()]
        else:
            if now - self._last_extend >= self.config.lease_timeout / 3:
                # the heartbeat is due (with or without leases to extend: an idle worker
                # must not see it due again at once, or it would poll in a tight loop)
                self._last_extend = now
                batch.extends = [(lease.entry_id, lease.token) for lease in self._held_leases()]
            # a lease holds its host's concurrency slot until its download is over
            # (FLEET_HOST_CONCURRENCY counts them), so a worker holds little more than it can
            # download at once
            held = len(self._prefetch) + len(self._inflight)
            want = min(self.config.prefetch - len(self._prefetch), self._max_held - held)
            if want > 0 and not self._fleet_done and self._withheld is None:
                batch.take = want
        return batch, n_out, n_done, len(dead)  # (every download notice goes with it)

    async def _sync_once(self, final: bool) -> SyncResult | None:
        assert self.frontier is not None
        batch, n_out, n_done, n_dead = self._build_batch(final)
        if batch.is_empty():
            return None
        outbox = self._outbox[:n_out]
        done = self._done[:n_done]
        try:
            result = await self.frontier.sync(batch)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # Redis refused the call before its first write: nothing changed; keep it all
            self._inc("fleet/backpressure/oom")
            logger.warning("Redis is out of memory (maxmemory): pausing pushes and "
                           "acknowledgements until it has room", extra={"spider": self.spider})
            await asyncio.sleep(self.config.poll_interval * 4)
            return None
        # the call succeeded: drop what it carried from the local buffers
        del self._done[:n_done]
        del self._dead[:n_dead]
        del self._downloaded[:len(batch.downloaded)]
        if result.refused:
            refused = set(result.refused)
            base = len(batch.pushes) - n_out
            kept = [o for i, o in enumerate(outbox) if base + i in refused]
            self._outbox[:n_out] = kept
            self._outbox_hold_until = time.monotonic() + self.config.poll_interval
            self._inc("fleet/backpressure/refused", len(kept))
        else:
            del self._outbox[:n_out]
        if self._start_pending:
            refused_ids = {id(o) for o in self._outbox}
            for o in outbox:
                if id(o) not in refused_ids:
                    self._start_pending.pop(id(o), None)
        children = [c for lease in done for c in lease.children]
        self._account(result, batch, children + outbox)
        if not final:
            self._receive(result)
        return result

    def _account(self, result: SyncResult, batch: SyncBatch, sent: list[_Out]) -> None:
        self._inc("fleet/redis/roundtrips")
        if result.pushed:
            self._inc("fleet/frontier/pushed", result.pushed)
        if result.duplicates:
            self._inc("dupefilter/filtered", result.duplicates)
            self._inc("fleet/dupefilter/filtered", result.duplicates)
        if result.cached:
            self._inc("fleet/dupefilter/cached", result.cached)
            if not self._logged_dupe:
                first = next((url for (url, *_), flag in zip(sent, result.push_flags,
                                                              strict=False) if not flag), "?")
                logger.debug("Filtered duplicate request: <GET %s> - no more duplicates will be "
                             "shown", first, extra={"spider": self.spider})
                self._logged_dupe = True
        if result.acked:
            self._inc("fleet/frontier/acked", result.acked)
        if result.parked:
            self._inc("fleet/backpressure/parked", result.parked)
            logger.debug("Frontier full: %d request(s) parked until the frontier has room "
                         "for the rest of their links", result.parked,
                         extra={"spider": self.spider})
        if result.deferred:
            self._inc("fleet/backpressure/deferred", result.deferred)
        if result.resumed:
            self._inc("fleet/backpressure/resumed", result.resumed)
        if result.released:
            self._inc("fleet/frontier/released", result.released)
        if result.reclaimed:
            self._inc("fleet/frontier/reclaimed", result.reclaimed)
        if result.bloom_full:
            logger.warning("The fleet's Bloom filter is at its last slice; its false-positive "
                           "rate grows from here. Raise FLEET_DUPEFILTER_CAPACITY and purge.",
                           extra={"spider": self.spider})
        lost = set(result.lost)
        if lost:
            self._inc("fleet/frontier/lease_lost", len(lost))
            self._lost_total += len(lost)
            if self._lost_total <= 5 or self._lost_total % 100 < len(lost):
                logger.warning(
                    "%d lease(s) lost (%d so far): their requests were leased again elsewhere "
                    "(this worker stalled longer than FLEET_LEASE_TIMEOUT=%s s?), or the crawl "
                    "was purged / Redis lost its data; those pages may be fetched again and "
                    "their links are left to the new holder", len(lost), self._lost_total,
                    self.config.lease_timeout, extra={"spider": self.spider})
            self._prefetch = deque((r, lease) for r, lease in self._prefetch
                                   if lease.entry_id not in lost)
            for _, lease in self._inflight.values():
                if lease.entry_id in lost:
                    lease.lost = True

    def hold_left(self, host: str) -> float:
        """Seconds *host* is still on hold as of the last frontier call (no I/O)."""
        return max(0.0, self.holds.get(host, 0.0) - time.monotonic())

    def _receive(self, result: SyncResult) -> None:
        now = time.monotonic()
        self.holds = {h: now + left for h, left in result.holds.items()}
        got = 0
        for entry in result.leased:
            lease = _Lease(entry.entry_id, entry.token)
            try:
                request = codec.decode(entry.payload, self.spider, self.config.request_classes)
            except Exception as exc:  # RequestDecodeError, or anything a Request class raises
                logger.error("Frontier entry %s cannot be used (%s); moved to dead letters",
                             entry.entry_id, exc, extra={"spider": self.spider})
                self._dead.append((lease, f"{type(exc).__name__}: {exc}"[:500]))
                self._inc("fleet/frontier/dead_letter")
                self._poke()
                continue
            if entry.expiries:
                self._inc("fleet/frontier/redelivered")
            self._prefetch.append((request, lease))
            got += 1
        if got:
            self._inc("fleet/frontier/leased", got)
        idle_timeout = self.config.idle_timeout
        idle = (idle_timeout is not None and result.idle_ms >= idle_timeout * 1000
                and not (self._prefetch or self._inflight or self._done or self._outbox
                         or self.start_active))
        if idle and not self._fleet_done:
            logger.info("Fleet idle for %.1f s (FLEET_IDLE_TIMEOUT=%s): closing",
                        result.idle_ms / 1000, idle_timeout, extra={"spider": self.spider})
        # not sticky: work pushed since (start requests read after this worker's first call,
        # another worker's pushes) makes it lease again; the engine closes only once the
        # start requests are done and nothing is pending
        self._fleet_done = idle
        if got or self._fleet_done:
            engine_hooks.wake_engine(self.crawler)

    async def _final_flush(self, reason: str) -> None:
        """Acknowledge what is done, push what is buffered, release every other lease."""
        assert self.frontier is not None
        try:
            for _ in range(1000):
                before = (len(self._outbox), len(self._done))
                result = await self._sync_once(final=True)
                if result is not None:
                    self._prefetch.clear()
                    self._inflight.clear()
                if result is None or not (self._outbox or self._done):
                    break
                if (len(self._outbox), len(self._done)) == before:
                    break  # the frontier refuses them: it is full
            if self._outbox:
                self._inc("fleet/backpressure/lost_at_close", len(self._outbox))
                logger.warning("Fleet worker closing (%s) with %d request(s) the full frontier "
                               "refused (start requests or links from errbacks); they are "
                               "dropped", reason, len(self._outbox),
                               extra={"spider": self.spider})
        except RedisUnavailableError as exc:
            logger.error("Fleet worker closing (%s) without reaching Redis: %d requests not "
                         "pushed, %d not acknowledged; their parents' leases will expire and "
                         "be fetched again. %s", reason, len(self._outbox), len(self._done),
                         exc, extra={"spider": self.spider})

    # -- helpers ---------------------------------------------------------------------------

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, count)

    def _redacted_url(self) -> str:
        from scrapy_fleet.redact import redact

        return redact(self.config.redis_url)
