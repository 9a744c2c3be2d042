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
* A leased request pushed with ``scrapy fleet push`` (a start request of the crawl that has not
  met the spider middlewares yet) passes their ``process_start`` first, in a task, before it
  joins the prefetch (:meth:`FleetScheduler._start_pushed`; FleetSpiderMiddleware's module
  docstring says what "once" means there).
* A background task (the pump) sends everything buffered in one round trip: new requests
  (through the Bloom filter), acknowledgements of finished requests, lease extensions, and a
  request for more leases when the prefetch runs low.  The requests a response yielded are in
  the outbox before the engine reports that response done, so they reach the frontier in the
  same atomic call as the parent's acknowledgement, or in an earlier one.

This module is the Scrapy side (the scheduler interface and the engine's notices); the
buffers and the pump are in :mod:`scrapy_fleet.frontier.pump`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.reactor import is_asyncio_reactor_installed

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.codec import LEASE_META_KEY, START_META_KEY
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier import memory
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.dupefilter import RedisBloomDupeFilter
from scrapy_fleet.frontier.leases import Lease, Out
from scrapy_fleet.frontier.protocol import clamp_priority
from scrapy_fleet.frontier.pump import FrontierPump
from scrapy_fleet.frontier.spidermw import FleetSpiderMiddleware
from scrapy_fleet.keys import STAGE_HOST, CrawlKeys
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.politeness.middlewares import robots_of
from scrapy_fleet.redis_client import is_oom
from scrapy_fleet.stages.roles import StageRole

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

__all__ = ["FleetScheduler"]

logger = logging.getLogger(__name__)


class FleetScheduler(FrontierPump, BaseScheduler):
    """Scheduler whose queue is the fleet's Redis frontier (enabled by ``scrapy_fleet.Addon``).

    Each frontier call also carries the worker's heartbeat and its deltas of the fleet-wide
    counters (:class:`~scrapy_fleet.monitoring.heartbeat.WorkerMonitor`, docs/monitoring.md);
    the pump calls at least every FLEET_HEARTBEAT_INTERVAL.  When the engine begins to close
    (SIGTERM) the worker drains: prefetched leases go back at once, and past
    FLEET_DRAIN_TIMEOUT with requests still in progress it releases every lease and exits 0.

    Settings: ``FLEET_*`` (docs/settings.md).  Stats: ``scheduler/enqueued/redis``,
    ``scheduler/dequeued/redis`` and ``fleet/frontier/*``, ``fleet/redis/*``,
    ``fleet/codec/*`` (docs/stats.md).

    Raises:
        FleetConfigError: from ``from_crawler`` on a wrong ``FLEET_*`` setting, or from
            ``open`` when the reactor is not Twisted's asyncio reactor.
        RedisUnavailableError: from ``open`` when Redis cannot be reached.
    """

    def __init__(self, crawler: Crawler, config: FleetConfig, dupefilter: BaseDupeFilter) -> None:
        FrontierPump.__init__(self, crawler, config)
        self.df = dupefilter
        self._parents: dict[int, tuple[Request, Lease]] = {}  # id(child) -> (child, lease)
        self._uninstall_hook: Any = None
        self._logged_clamp = False
        self._start_tasks: set[asyncio.Task[None]] = set()  # pushed requests in the hook
        self.on_pushed = self._admit_pushed

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetScheduler:
        from scrapy.utils.misc import build_from_crawler, load_object

        config = FleetConfig.from_settings(crawler.settings)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(crawler, config, build_from_crawler(df_cls, crawler))

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not is_asyncio_reactor_installed():
            raise FleetConfigError(
                "TWISTED_REACTOR must be the asyncio reactor "
                "(twisted.internet.asyncioreactor.AsyncioSelectorReactor) for scrapy_fleet")
        self.spider = spider
        engine_hooks.publish_ledger(self.crawler, self)
        if hasattr(self.df, "open"):
            self.df.open()
        crawl_id = self.config.resolve_crawl_id(spider.name)
        keys = CrawlKeys(self.config.key_prefix, crawl_id)
        self.frontier = AsyncFrontier(self.config.redis_url, keys, self.config.worker_id,
                                      self.config.frontier_params(),
                                      self.config.redis_timeout, self.config.redis_retries,
                                      self.config.redis_wait_replicas,
                                      dupe_cache=self.config.dupefilter_cache)
        await self.frontier.connect()
        await self._until_room(lambda: self._write_config(keys))
        from scrapy import signals

        self.crawler.signals.connect(self._response_received, signal=signals.response_received)
        for warning in await memory.check_redis_memory(self.frontier.client, self.config,
                                                        keys.stats):
            logger.warning(warning, extra={"spider": spider})
            self._inc("fleet/backpressure/memory_warnings")
        self._uninstall_hook = engine_hooks.on_request_done(self.crawler, self._request_done)
        self.stage = StageRole(self)
        self.stage.install()
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._pump())
        self._wake.set()
        logger.info("Fleet worker %s joined crawl %r at %s", self.config.worker_id, crawl_id,
                    self._redacted_url(), extra={"spider": spider})
        logger.info(politeness.policy_log_line(self.config), extra={"spider": spider})

    async def _write_config(self, keys: CrawlKeys) -> None:
        assert self.frontier is not None
        await politeness.Politeness(self.frontier.client, keys, self.config,
                                    self.config.worker_id).write_overrides()
        # the bounds the workers run with, for pushes from outside the project
        await self.frontier.client.hset(keys.config, mapping={
            "queue_max": self.config.queue_max or 0,
            "low_watermark": self.config.queue_low_watermark,
            "host_queue_max": self.config.host_queue_max or 0,
            "host_key": self.config.host_key,
            "host_concurrency": self.config.host_concurrency})
        # the per-host defaults they run with, for `scrapy fleet status --hosts`
        await self.frontier.client.hset(keys.config, mapping=politeness.policy_fields(
            self.config))  # type: ignore[arg-type]

    async def _until_room(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run *write* again while Redis answers OOM (it filled up after the start-up check
        passed): one warning, a retry every 4 x FLEET_POLL_INTERVAL (docs/backpressure.md)."""
        warned = False
        while True:
            try:
                await write()
                return
            except redis.ResponseError as exc:
                if not is_oom(exc):
                    raise
                self._inc("fleet/backpressure/oom")
                if not warned:
                    warned = True
                    logger.warning("Redis is out of memory (maxmemory): the worker waits to "
                                   "start until it has room", extra={"spider": self.spider})
                await asyncio.sleep(self.config.poll_interval * 4)

    def _response_received(self, response: Any, request: Any, spider: Any = None) -> None:
        if "fleet-stored" in response.flags:
            return  # a stored response (stages): its fetch worker counted it
        self.monitor.on_response(politeness.host_key(response.url, self.config.host_key),
                                 response.status)

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        self._closing = True
        for task in list(self._start_tasks):  # their leases stay held: released below
            task.cancel()
        if self._uninstall_hook is not None:
            self._uninstall_hook()
        if self.stage is not None:
            self.stage.uninstall()
        if self._task is not None and self._wake is not None:
            self._wake.set()
            try:
                await self._task
            except Exception:
                logger.exception("Fleet pump failed")
        if self.frontier is not None:
            await self._final_flush(reason)
            if not self._state_lost:
                await self._leave()
            await self.frontier.close()
        self._flush_counts()
        if hasattr(self.df, "close"):
            self.df.close(reason)

    def has_pending_requests(self) -> bool:
        return bool(self._prefetch or self._outbox or self._inflight or self._done
                    or self._starting or not self._fleet_done)

    def note_parent(self, child: Request, parent: Request | None) -> None:
        """Record that *child* was yielded by the callback of *parent* (a request this
        worker leased), so that it is pushed with *parent*'s acknowledgement."""
        if parent is None:
            return
        entry = self._inflight.get(id(parent))
        if entry is not None:
            self._parents[id(child)] = (child, entry[1])

    def _parent_lease(self, request: Request) -> Lease | None:
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
        delay = request.meta.pop(codec.DEFER_META_KEY, None)
        delay_ms = int(delay * 1000) if isinstance(delay, int | float) and delay > 0 else 0
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
        parent = self._parent_lease(request)
        out: Out
        if key and self._known_duplicate(key, request):
            # most links of a crawl: the call leaves it out, so it is encoded only if the
            # frontier asks for the whole call again (_materialize)
            out = (request.url, key, priority, request, "", delay_ms)
        else:
            payload = self._encode(request, parent)
            if payload is None:
                return False
            out = (request.url, key, priority, payload,
                   politeness.host_key(request.url, self.config.host_key), delay_ms)
        if parent is not None:
            parent.children.append(out)
        else:
            self._outbox.append(out)
            start_index = request.meta.get(START_META_KEY)
            if isinstance(start_index, int):
                self._start_pending[id(out)] = start_index
        self._enqueued += 1  # counted into the stats before each frontier call (_flush_counts)
        self._poke()
        return True

    def _admit_pushed(self, request: Request, lease: Lease) -> None:
        """*request*, just leased, was pushed with ``scrapy fleet push``: it goes through the
        spider middlewares' start hook first (a task: a middleware may await); its lease is
        held meanwhile (extended, released at close)."""
        request.meta.pop(codec.PUSHED_META_KEY, None)
        self._starting.append(lease)
        task = asyncio.ensure_future(self._start_pushed(request, lease))
        self._start_tasks.add(task)
        task.add_done_callback(self._start_tasks.discard)

    async def _start_pushed(self, request: Request, lease: Lease) -> None:
        """Pass the pushed *request* (leased under *lease*) through the spider middlewares'
        ``process_start`` (all but FleetSpiderMiddleware's, which reads the spider's own start
        requests), and use what they yield: items go to the item pipelines; the request itself
        (or, when a middleware replaced it, the first request yielded for the same host) is
        fetched under the lease; every other request is a link of the lease, pushed with its
        acknowledgement (the Bloom filter applies).  Nothing yielded: the lease is acknowledged
        as done.  A middleware that raises: the entry goes to the dead letters with the
        error (``scrapy fleet retry --dead`` pushes it again, still a start request).  A lease
        lost meanwhile: nothing is used (its new holder runs the hook)."""
        try:
            outputs = await engine_hooks.process_start(self.crawler, [request],
                                                       FleetSpiderMiddleware)
            items = [o for o in outputs if not isinstance(o, Request)]
            for item in items:
                await engine_hooks.process_start_item(self.crawler, item)
        except Exception as exc:
            self._starting.remove(lease)
            if lease.lost:
                return
            logger.error("A spider middleware's process_start failed on the pushed request "
                         "%s (%s: %s); moved to dead letters", request, type(exc).__name__,
                         exc, extra={"spider": self.spider})
            self._inc("fleet/start/pushed/error")
            self._inc("fleet/frontier/dead_letter")
            self._dead.append((lease, f"process_start: {type(exc).__name__}: {exc}"[:500]))
            self._poke()
            return
        if self._withheld is not None:
            return  # stays held (in _starting), released when the worker closes
        self._starting.remove(lease)
        if lease.lost:
            return  # leased again elsewhere: the new holder runs the hook
        self._inc("fleet/start/pushed")
        if items:
            self._inc("fleet/start/pushed/items", len(items))
        requests = [o for o in outputs if isinstance(o, Request)]
        main = request if any(o is request for o in requests) else next(iter(requests), None)
        host_key = self.config.host_key
        if main is not None and politeness.host_key(main.url, host_key) != politeness.host_key(
                request.url, host_key):
            main = None  # its lease holds the pushed request's host's turn, not this one's
        for extra in requests:
            if extra is main:
                continue
            self._parents[id(extra)] = (extra, lease)
            if self.enqueue_request(extra):
                self._inc("fleet/start/pushed/added")
            self._parents.pop(id(extra), None)
        if main is None:
            self._inc("fleet/start/pushed/dropped")
            self._done.append(lease)  # acknowledged with the requests it yielded, if any
            self._poke()
            return
        self._prefetch.append((main, lease))
        engine_hooks.wake_engine(self.crawler)

    def next_request(self) -> Request | None:
        if not self._prefetch:
            return None
        request, lease = self._prefetch.popleft()
        self._inflight[id(request)] = (request, lease)
        self._by_entry[lease.entry_id] = lease
        request.meta[LEASE_META_KEY] = lease.entry_id
        lease.url = request.url
        self._dequeued += 1
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

    def note_failure(self, request: Request, record: bytes) -> bool:
        """*request* (leased by this worker, in flight) failed for good: *record* (an encoded
        ``failures.record.FailureRecord``) goes to Redis with its acknowledgement, atomically.
        The first record of a request is kept.  Returns False when the request is not one of
        this worker's leases in flight, or has a record already."""
        entry = self._inflight.get(id(request))
        lease = entry[1] if entry is not None else self._by_entry.get(
            request.meta.get(LEASE_META_KEY, ""))
        if lease is None or lease.failure is not None:
            return False
        lease.failure = record
        return True

    def note_revisit(self, request: Request, state: list[Any] | None,
                     interval: float = 0.0) -> bool:
        """recrawl (docs/recrawl.md): leased *request* is revisited in *interval* seconds with
        *state* (recrawl/schedule.py) in its meta, or not revisited (*state* None), written
        with its acknowledgement.  Returns False when it is not a lease of this worker in
        flight (or its leased request cannot be read back)."""
        from scrapy_fleet.errors import FleetError
        from scrapy_fleet.recrawl.record import revisit_record

        entry = self._inflight.get(id(request))
        lease = entry[1] if entry is not None else self._by_entry.get(
            request.meta.get(LEASE_META_KEY, ""))
        if lease is None:
            return False
        if state is None:
            lease.revisit = b""
            return True
        try:
            lease.revisit = revisit_record(
                lease.payload, state, interval,
                politeness.host_key(request.url, self.config.host_key),
                clamp_priority(request.priority))
        except FleetError as exc:  # RequestDecodeError / RequestEncodeError
            logger.warning("Recrawl: %s is not tracked: %s", request.url, exc,
                           extra={"spider": self.spider})
            self._inc("fleet/recrawl/unstorable")
            lease.revisit = b""
            return False
        return True

    def dead_letter(self, request: Request, reason: str) -> bool:
        """Send the leased *request* (the object ``next_request`` returned, still in flight) to
        the dead letters with *reason* at the next frontier call, instead of acknowledging it
        when the engine is done with it; ``scrapy fleet dead`` lists it.  False when this
        worker holds no lease for it.  Stat ``fleet/frontier/dead_letter``."""
        entry = self._inflight.get(id(request))
        if entry is None or entry[0] is not request or entry[1].lost:
            return False
        del self._inflight[id(request)]
        lease = entry[1]
        self._by_entry.pop(lease.entry_id, None)
        self._dead.append((lease, reason[:500]))
        self._inc("fleet/frontier/dead_letter")
        self._poke()
        return True

    def note_exit_wait(self, request: Request, why: str | None) -> None:
        """``FleetProxyMiddleware``: *request* waits for a proxy exit, for lua/proxies.lua's
        reason *why* (``empty``, ``dead``, ``cooling``, ``probe``, ``caps``), or no longer
        waits (None).  While one waits because the pool has no exit that may carry it
        (``dead``, ``empty``) the worker's heartbeat state is ``no_exit``, which status, top
        and the dashboard show, with the alert ``proxy_no_exit`` (monitoring/alerts.py)."""
        if why is None:
            self._exit_waits.pop(id(request), None)
        else:
            self._exit_waits[id(request)] = why

    def give_back(self, request: Request) -> bool:
        """Release the lease of *request* (in flight, never sent: it only waited for a proxy
        exit) at the next frontier call instead of acknowledging it, so that another worker
        fetches it: for a draining worker, whose engine would otherwise wait for it until
        FLEET_DRAIN_TIMEOUT.  False when this worker holds no lease for it.  Stat
        ``fleet/frontier/given_back``."""
        self._exit_waits.pop(id(request), None)
        entry = self._inflight.get(id(request))
        if entry is None or entry[0] is not request or entry[1].lost:
            return False
        del self._inflight[id(request)]
        self._by_entry.pop(entry[1].entry_id, None)
        self._give_back.append(entry[1])
        self._inc("fleet/frontier/given_back")
        self._poke()
        return True

    @property
    def draining(self) -> bool:
        """The worker is shutting down (SIGTERM, idle close): its engine takes no more
        requests."""
        return self._closing or self._drain_started is not None or \
            engine_hooks.engine_closing(self.crawler)

    def note_hold(self, host: str, seconds: float) -> None:
        """Put *host* on hold for *seconds* at once (others learn it at their next call)."""
        self.holds[host] = max(self.holds.get(host, 0.0), time.monotonic() + seconds)

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

    def holds_lease(self, request: Request) -> bool:
        """Is *request* (or a redirect/retry made from it) a request this worker leased and
        still holds?"""
        lease = self._by_entry.get(request.meta.get(LEASE_META_KEY, ""))
        return lease is not None and not lease.lost

    def attach_stored(self, request: Request, payload: bytes) -> None:
        """Send the stored response *payload* of *request* with its acknowledgement (one
        atomic frontier call: the request is done exactly when its response is stored)."""
        lease = self._by_entry[request.meta[LEASE_META_KEY]]
        lease.children.append((request.url, b"", clamp_priority(request.priority), payload,
                               STAGE_HOST, 0))

    def _redacted_url(self) -> str:
        from scrapy_fleet.redact import redact

        return redact(self.config.redis_url)
