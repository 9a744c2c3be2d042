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

This module is the Scrapy side (the scheduler interface and the engine's notices), an adapter
over two components it holds: the pump (:mod:`scrapy_fleet.frontier.pump`: the frontier
calls) and its lease book (:mod:`scrapy_fleet.frontier.book`: the buffers and leases, which
the other components get as their ``LeaseLedger``).  It uses their public interface only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.reactor import is_asyncio_reactor_installed

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.compat.feeder import StartKeyFeeder, is_start_key_spider, take_over
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier import budgets, control, memory
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.dupefilter import RedisBloomDupeFilter
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.partition_count import check_async as check_partitions
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.port import WorkerFrontier
from scrapy_fleet.frontier.protocol import clamp_priority
from scrapy_fleet.frontier.pump import FrontierPump
from scrapy_fleet.frontier.spidermw import FleetSpiderMiddleware
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.politeness.middlewares import robots_of
from scrapy_fleet.recrawl.sitemaps import LASTMOD_META_KEY
from scrapy_fleet.redis_client import is_oom
from scrapy_fleet.stages.roles import StageRole

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from twisted.internet.defer import Deferred

__all__ = ["FleetScheduler"]

logger = logging.getLogger(__name__)



class FleetScheduler(BaseScheduler):
    """Scheduler whose queue is the fleet's Redis frontier (enabled by ``scrapy_fleet.Addon``).

    Each frontier call also carries the worker's heartbeat and its deltas of the fleet-wide
    counters (:class:`~scrapy_fleet.monitoring.heartbeat.WorkerMonitor`, docs/monitoring.md);
    the pump calls at least every FLEET_HEARTBEAT_INTERVAL.  When the engine begins to close
    (SIGTERM) the worker drains: prefetched leases go back at once, and past
    FLEET_DRAIN_TIMEOUT with requests still in progress it releases every lease and exits 0.

    ``pump`` (:class:`~scrapy_fleet.frontier.pump.FrontierPump`) makes the frontier calls;
    ``book`` (its :class:`~scrapy_fleet.frontier.book.LeaseBook`) holds the buffers and
    leases, and is what ``engine_hooks.ledger_of`` gives the other components.

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
        self.pump = FrontierPump(crawler, config)
        self.book = self.pump.book
        self.book.on_pushed = self._admit_pushed
        if isinstance(dupefilter, RedisBloomDupeFilter):  # recrawl: a revisit's place entry
            self.book.bloom_key_of = dupefilter.bloom_key
        self._uninstall_hook: Any = None
        self._uninstall_gate: Any = None  #: crawl control's hold (frontier/control.py)
        self._logged_clamp = False
        self._start_tasks: set[asyncio.Task[None]] = set()  # pushed requests in the hook
        #: a scrapy-redis spider's start key, fed into the frontier (compat/feeder.py)
        self._feeder: StartKeyFeeder | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetScheduler:
        from scrapy.utils.misc import build_from_crawler, load_object

        config = FleetConfig.from_settings(crawler.settings)
        df_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        return cls(crawler, config, build_from_crawler(df_cls, crawler))

    @property
    def spider(self) -> Spider | None:
        """The spider of the crawl (None before ``open``)."""
        return self.book.spider

    async def _control_gate(self, request: Request) -> None:
        """A download waits here while the crawl or its host is paused (issue 34)."""
        await control.gate(self.crawler, request,
                           politeness.host_key(request.url, self.config.politeness.host_key))

    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        if not is_asyncio_reactor_installed():
            raise FleetConfigError(
                "TWISTED_REACTOR must be the asyncio reactor "
                "(twisted.internet.asyncioreactor.AsyncioSelectorReactor) for scrapy_fleet")
        self.book.spider = spider
        engine_hooks.publish_ledger(self.crawler, self.book, scheduler=self)
        if hasattr(self.df, "open"):
            self.df.open()
        crawl_id = self.config.resolve_crawl_id(spider.name)
        keys = self.config.crawl_keys(spider.name)  # (in its crawl group, if any)
        frontier: WorkerFrontier
        if self.config.partitions > 1:  # issue 21: the same surface, over the partitions
            frontier = PartitionedFrontier(
                self.config.redis_url, keys, self.config.worker_id,
                self.config.frontier_params(), self.config.partitions,
                self.config.redis_timeout, self.config.redis_retries,
                self.config.redis_wait_replicas, self.config.idle_timeout,
                self.config.dupefilter.cache, self.config.partition_flush,
                encode=self.book.encode_link, stats=self.crawler.stats)
        else:
            frontier = AsyncFrontier(self.config.redis_url, keys, self.config.worker_id,
                                     self.config.frontier_params(),
                                     self.config.redis_timeout, self.config.redis_retries,
                                     self.config.redis_wait_replicas,
                                     dupe_cache=self.config.dupefilter.cache)
        self.pump.frontier = frontier  # closed by pump.close
        await frontier.connect()
        await check_partitions(frontier.client, keys, self.config.partitions)
        await self._until_room(lambda: self._write_config(frontier))
        from scrapy import signals

        self.crawler.signals.connect(self._response_received, signal=signals.response_received)
        for warning in await memory.check_redis_memory(frontier.client, self.config,
                                                        keys.stats):
            logger.warning(warning, extra={"spider": spider})
            self.book.inc("fleet/backpressure/memory_warnings")
        self._uninstall_hook = engine_hooks.on_request_done(self.crawler, self.book.finished)
        self._uninstall_gate = engine_hooks.gate_sends(self.crawler, self._control_gate)
        stage = StageRole(self.book)
        stage.install()
        self.pump.start(frontier, stage)
        if is_start_key_spider(spider):
            take_over(self.crawler, spider)
            if self.config.start_requests == "never":  # (a worker that only drains)
                logger.info("FLEET_START_REQUESTS=never: this worker does not read start "
                            "key %r", getattr(spider, "redis_key", ""), extra={"spider": spider})
            else:
                self._feeder = StartKeyFeeder(self.crawler, self.config, spider, self.book,
                                              self.enqueue_request)
                self._feeder.start()
        logger.info("Fleet worker %s joined crawl %r at %s", self.config.worker_id, crawl_id,
                    self._redacted_url(), extra={"spider": spider})
        logger.info(politeness.policy_log_line(self.config), extra={"spider": spider})

    async def _write_config(self, frontier: WorkerFrontier) -> None:
        keys = frontier.keys
        for part_keys in keys.all_partitions(self.config.partitions):  # (issue 21)
            await politeness.Politeness(frontier.client, part_keys, self.config,
                                        self.config.worker_id).write_overrides()
            await budgets.write_host_budgets(frontier.client, part_keys, self.config.budget)
        # the bounds the workers run with, for pushes from outside the project
        await frontier.client.hset(keys.config, mapping={
            "queue_max": self.config.backpressure.queue_max or 0,
            "low_watermark": self.config.backpressure.low_watermark,
            "host_queue_max": self.config.backpressure.host_queue_max or 0,
            "host_key": self.config.politeness.host_key,
            "host_concurrency": self.config.politeness.host_concurrency,
            # the budgets they run with, for `scrapy fleet status` (issue 34)
            "budget_pages": self.config.budget.pages,
            "budget_seconds": self.config.budget.seconds,
            "host_budget_pages": self.config.budget.host_pages})
        # the per-host defaults they run with, for `scrapy fleet status --hosts`
        await frontier.client.hset(keys.config, mapping=politeness.policy_fields(
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
                self.book.inc("fleet/backpressure/oom")
                if not warned:
                    warned = True
                    logger.warning("Redis is out of memory (maxmemory): the worker waits to "
                                   "start until it has room", extra={"spider": self.spider})
                await asyncio.sleep(self.config.poll_interval * 4)

    def _response_received(self, response: Any, request: Any, spider: Any = None) -> None:
        if "fleet-stored" in response.flags:
            return  # a stored response (stages): its fetch worker counted it
        host = politeness.host_key(response.url, self.config.politeness.host_key)
        self.pump.monitor.on_response(host, response.status)

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        self.book.closing = True
        for task in list(self._start_tasks):  # their leases stay held: released below
            task.cancel()
        if self._uninstall_hook is not None:
            self._uninstall_hook()
        if self._uninstall_gate is not None:
            self._uninstall_gate()
        if self.pump.stage is not None:
            self.pump.stage.uninstall()
        if self._feeder is not None:
            await self._feeder.stop()
        await self.pump.close(reason)
        if self._feeder is not None:
            await self._feeder.close()
        if hasattr(self.df, "close"):
            self.df.close(reason)

    def has_pending_requests(self) -> bool:
        return self.book.pending

    def _robots_disallow(self, request: Request) -> bool:
        robots = robots_of(self.crawler)
        if robots is None or request.meta.get("dont_obey_robotstxt"):
            return False
        if robots.disallows(request):
            self.book.inc("fleet/politeness/robots_disallowed")
            self.book.inc("robotstxt/forbidden")
            return True
        return False

    def enqueue_request(self, request: Request) -> bool:
        return self._enqueue(request)

    def _enqueue(self, request: Request, parent: Lease | None = None) -> bool:
        """``enqueue_request``, with the lease *request* goes with when the caller knows it
        (else the book finds it: ``LeaseBook.parent_of``)."""
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
            self.book.inc("fleet/frontier/priority_clamped")
            if not self._logged_clamp:
                logger.warning("Request priority %d is beyond +-2**31: the frontier orders "
                               "<%s %s> as %d (logged once)", request.priority, request.method,
                               request.url, priority, extra={"spider": self.spider})
                self._logged_clamp = True
        lastmod = request.meta.get(LASTMOD_META_KEY) if key else None  # (sitemap <lastmod>)
        lastmod = lastmod if type(lastmod) is int and lastmod > 0 else 0
        return self.book.buffer(request, key, priority, delay_ms, parent, lastmod)

    def _admit_pushed(self, request: Request, lease: Lease) -> None:
        """*request*, just leased, was pushed with ``scrapy fleet push``: it goes through the
        spider middlewares' start hook first (a task: a middleware may await); its lease is
        held meanwhile by the book (extended, released at close)."""
        request.meta.pop(codec.PUSHED_META_KEY, None)
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
        book = self.book
        try:
            outputs = await engine_hooks.process_start(self.crawler, [request],
                                                       FleetSpiderMiddleware)
            items = [o for o in outputs if not isinstance(o, Request)]
            for item in items:
                await engine_hooks.process_start_item(self.crawler, item)
        except Exception as exc:
            if not lease.lost:
                logger.error("A spider middleware's process_start failed on the pushed "
                             "request %s (%s: %s); moved to dead letters", request,
                             type(exc).__name__, exc, extra={"spider": self.spider})
                book.inc("fleet/start/pushed/error")
            book.start_failed(lease, f"process_start: {type(exc).__name__}: {exc}")
            return
        if book.withheld is not None:
            return  # stays held (in the start hook), released when the worker closes
        if lease.lost:
            book.forget_start(lease)
            return  # leased again elsewhere: the new holder runs the hook
        book.inc("fleet/start/pushed")
        if items:
            book.inc("fleet/start/pushed/items", len(items))
        requests = [o for o in outputs if isinstance(o, Request)]
        main = request if any(o is request for o in requests) else next(iter(requests), None)
        host_key = self.config.politeness.host_key
        if main is not None and politeness.host_key(main.url, host_key) != politeness.host_key(
                request.url, host_key):
            main = None  # its lease holds the pushed request's host's turn, not this one's
        for extra in requests:
            if extra is not main and self._enqueue(extra, parent=lease):
                book.inc("fleet/start/pushed/added")
        if main is None:
            book.inc("fleet/start/pushed/dropped")
        # main: fetched under the lease; None: acknowledged with the requests it yielded
        book.settle_start(lease, main)

    def next_request(self) -> Request | None:
        # (after a stall, the partitions this worker may have been dead to are held:
        # frontier/liveness.py; their requests stay prefetched, the others go on)
        return self.book.take(self.pump.held_partitions())

    def __len__(self) -> int:
        return len(self.book)

    def _redacted_url(self) -> str:
        from scrapy_fleet.redact import redact

        return redact(self.config.redis_url)
