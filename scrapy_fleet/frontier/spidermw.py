"""``FleetSpiderMiddleware``: who consumes start requests, their back pressure, and which
request found which link.

Start requests.  Every worker runs the same spider, so by default each would schedule the
spider's start requests (``start_urls``, ``start()``), which are ``dont_filter=True`` in Scrapy
and so would be crawled once per worker.  ``FLEET_START_REQUESTS`` chooses:

* ``"once"`` (default): one worker at a time consumes them, holding a lease on the crawl's
  ``seeding`` hash (lua/seeding.lua) that it renews every ``FLEET_LEASE_TIMEOUT / 3``
  seconds with its *progress*: how many start requests, in the order the spider yields them,
  the frontier has accepted.  The other workers wait (and work on the frontier meanwhile);
  when the holder stops renewing — killed, stopped, its Redis calls failing — for
  ``FLEET_LEASE_TIMEOUT`` seconds, one of them takes the lease over, skips the first
  *progress* start requests and consumes the rest.  When all are consumed the holder marks
  them done, and workers that start later skip them, until ``scrapy fleet purge``.  This
  assumes the spider yields the same start requests in the same order each time
  (``start_urls`` does); a start request may be pushed twice around a takeover, never lost.
* ``"always"``: every worker consumes them, as plain Scrapy would.
* ``"never"``: no worker does; all work comes from ``scrapy fleet push``.

Start requests are consumed lazily: while the frontier holds ``FLEET_QUEUE_MAX`` entries or
more, the middleware stops reading them until the frontier is below the low watermark.

Pushed start requests.  What ``scrapy fleet push`` pushes are start requests too, and meet
the spider middlewares' ``process_start`` as the spider's own do (the one of this middleware
aside: it reads the spider's start requests).  The push helper marks each entry
(``codec.PUSHED_FIELD``); the worker that leases a marked entry passes the request through
the hook before fetching it (``FleetScheduler._start_pushed``).  What the hook yields takes
effect only with that lease's acknowledgement, in one atomic frontier call: the request it
kept (or the first one it yielded for the same host) is fetched under the lease, the other
requests are pushed as the lease's links, a request it dropped is acknowledged as done
(stat ``fleet/start/pushed/dropped``).  The entry in Redis keeps its mark until then.  So
the hook's *effect* is exactly once (every pushed request reaches its callback as the hook
made it, once per fetch; extra requests are pushed once), and the hook itself runs at least
once: a worker that dies (or releases the lease at close) before the acknowledgement leaves
the entry, still marked, to the next worker, which runs the hook again on the request as it
was pushed, never on the hook's own output.  Exactly-once runs would need the hook's output
written to Redis before the fetch, a second frontier call per pushed request for a guarantee
that matters only to a middleware with side effects outside the request, which then must be
idempotent anyway (the same holds for every callback in the fleet).  Requests the worker
stores again (Scrapy's retries, redirects) are encoded from the request the hook made, and
carry no mark: as in Scrapy, they do not meet the hook.  ``scrapy fleet retry`` of a failed
pushed request pushes the entry as it was pushed, mark included, so the hook makes it again
(the stored form of a start request the spider yielded is already the hook's).

Links.  For each request the spider's callback yields, the middleware tells the scheduler
which leased request found it, so the link travels with that request's acknowledgement.
It must be the outermost spider middleware (order 0, set by the add-on), so that it sees the
requests the other middlewares let through.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import Request, signals
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_fleet import engine_hooks, lua, outage, redis_client
from scrapy_fleet.codec import START_META_KEY
from scrapy_fleet.compat.feeder import is_start_key_spider
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.client import frontier_size
from scrapy_fleet.keys.crawl import CrawlKeys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_fleet.frontier.ledger import LeaseLedger

logger = logging.getLogger(__name__)

#: seconds between two checks of the frontier's size while reading start requests, at most
CHECK_PERIOD = 0.5
T = TypeVar("T")

#: seconds between two tries to take over the start requests, at most
CLAIM_PERIOD = 2.0


class FleetSpiderMiddleware(BaseSpiderMiddleware):
    """See module docstring.  Stats: ``fleet/start/skipped`` (1 when this worker skipped the
    start requests), ``fleet/start/taken_over`` (1 when it took them over from a worker that
    stopped), ``fleet/start/resumed_after`` (start requests it skipped then, pushed before),
    ``fleet/backpressure/start_paused`` (pauses of the start requests)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        super().__init__(crawler)
        self.config = config
        self._seeding_script: Any = None
        self._yielded = 0  # start requests this worker handed to the engine
        #: this worker holds the seeding lease and has not marked the start requests done
        self._holding = False
        self._crawl_keys: CrawlKeys | None = None
        #: the FleetScheduler's note_parent (None until a scheduler that has one is seen)
        self._ledger: LeaseLedger | None = None
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSpiderMiddleware:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def get_processed_request(self, request: Request,
                              response: Response | None) -> Request | None:
        if response is not None:
            ledger = self._ledger
            if ledger is None:  # looked up once: one scheduler per crawl (for every link)
                ledger = self._ledger = engine_hooks.ledger_of(self.crawler)
            if ledger is not None:
                ledger.note_parent(request, response.request)
        return request

    def _keys(self) -> CrawlKeys:
        if self._crawl_keys is None:
            spider = self.crawler.spider
            assert spider is not None
            self._crawl_keys = CrawlKeys(self.config.key_prefix,
                                         self.config.resolve_crawl_id(spider.name))
        return self._crawl_keys

    async def _seeding(self, client: Any, op: str, progress: int = 0) -> tuple[str, Any]:
        if self._seeding_script is None:
            self._seeding_script = lua.load(client, "seeding.lua")
        lease_ms = int(self.config.lease_timeout * 1000)
        status, value = await redis_client.call_retrying_async(
            lambda: self._seeding_script(keys=[self._keys().seeding],
                                         args=[op, self.config.worker_id, lease_ms, progress]),
            self.config.redis_url, self.config.redis_retries)
        status = status.decode() if isinstance(status, bytes) else str(status)
        return status, value.decode() if isinstance(value, bytes) else value

    async def _patiently(self, call: Callable[[], Awaitable[T]]) -> T:
        """*call*, tried again (with back-off, up to 5 s apart) for as long as Redis is
        unreachable: reading start requests must outlast a Redis restart, or the rest of
        them would be lost with this worker's start iterator."""
        delay, warned = 0.1, False
        while True:
            sent_at = time.monotonic()
            try:
                return await call()
            except (RedisUnavailableError, *redis_client.RETRYABLE) as exc:
                if not warned:  # the outage itself is logged once per worker (outage.py)
                    outage.tracker(self.config.redis_url).failed(exc, delay, sent_at)
                    logger.debug("Redis unreachable while reading start requests (%s): "
                                 "trying again until it answers", exc,
                                 extra={"spider": self.crawler.spider})
                    warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _claim_seeding(self, client: Any) -> int | None:
        """Wait for the seeding lease; returns how many start requests to skip, or None when
        the start requests are done (by this or another worker)."""
        told = False
        while True:
            status, value = await self._patiently(lambda: self._seeding(client, "claim"))
            if status == "done":
                logger.info("Start requests already consumed by another worker; this worker "
                            "skips them (FLEET_START_REQUESTS='once')",
                            extra={"spider": self.crawler.spider})
                return None
            if status == "won":
                if int(value):
                    self._set_stat("fleet/start/taken_over", 1)
                    self._set_stat("fleet/start/resumed_after", int(value))
                    logger.warning("Took over the start requests from a worker that stopped: "
                                   "skipping the %d it had pushed", int(value),
                                   extra={"spider": self.crawler.spider})
                return int(value)
            if not told:
                logger.info("Start requests are being consumed by worker %s; this worker "
                            "takes them over if it stops (FLEET_START_REQUESTS='once')", value,
                            extra={"spider": self.crawler.spider})
                told = True
            await asyncio.sleep(min(self.config.lease_timeout / 3, CLAIM_PERIOD))

    def _progress(self) -> int:
        """Start requests (in yield order) the frontier accepted: all those yielded, up to the
        first this worker still holds unpushed."""
        ledger = engine_hooks.ledger_of(self.crawler)
        first = None if ledger is None else ledger.first_unpushed_start()
        return self._yielded if first is None else min(first, self._yielded)

    async def _renew_seeding(self, client: Any, lost: Any) -> None:
        """Renew the seeding lease with the progress, until cancelled or lost."""
        while True:
            await asyncio.sleep(self.config.lease_timeout / 3)
            try:
                status, holder = await self._seeding(client, "renew", self._progress())
            except Exception as exc:  # tried again at the next period
                logger.warning("Could not renew the start requests' lease (%s)", exc,
                               extra={"spider": self.crawler.spider})
                continue
            if status == "lost":
                logger.warning("Worker %s took over the start requests (this one did not "
                               "renew its lease in time): stopping them here", holder,
                               extra={"spider": self.crawler.spider})
                self._holding = False
                lost.set()
                return

    def _set_stat(self, key: str, value: int) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.set_value(key, value)

    def _local(self) -> int:
        """Requests this worker buffered but has not pushed yet."""
        ledger = engine_hooks.ledger_of(self.crawler)
        return 0 if ledger is None else ledger.outbox_size

    async def _wait_for_room(self, client: Any) -> int:
        """Return the frontier's size (with this worker's unpushed requests) at once when it
        is below FLEET_QUEUE_MAX, else once it is below the low watermark."""
        queue_max, low = self.config.backpressure.queue_max, self.config.backpressure.queue_low
        assert queue_max is not None and low is not None
        size = await self._patiently(lambda: frontier_size(client, self._keys())) + self._local()
        if size < queue_max:
            return size
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value("fleet/backpressure/start_paused")
        logger.info("Frontier full (%d >= FLEET_QUEUE_MAX=%d): start requests paused until it "
                    "is below %d", size, queue_max, low, extra={"spider": self.crawler.spider})
        while size >= low:
            await asyncio.sleep(self.config.poll_interval)
            size = await self._patiently(
                lambda: frontier_size(client, self._keys())) + self._local()
        logger.info("Frontier at %d: start requests resumed", size,
                    extra={"spider": self.crawler.spider})
        return size

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        mode = self.config.start_requests
        if is_start_key_spider(self.crawler.spider):
            return  # its start requests would pop its start key: the fleet feeds it instead
        if mode == "never":
            self._skipped()
            return
        client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                          is_async=True)
        renewer: asyncio.Task[None] | None = None
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None:
            ledger.start_active = True  # no idle close while start requests may come
        try:
            await self._patiently(lambda: redis_client.ping_async(
                client, self.config.redis_url, self._keys().seeding))
            skip = 0
            lost = asyncio.Event()
            if mode == "once":
                claimed = await self._claim_seeding(client)
                if claimed is None:
                    self._skipped()
                    return
                skip = claimed
                self._holding = True
                renewer = asyncio.ensure_future(self._renew_seeding(client, lost))
            queue_max = self.config.backpressure.queue_max
            estimate, checked_at = 0, 0.0
            index = 0
            async for item_or_request in start:
                if lost.is_set():
                    return
                if isinstance(item_or_request, Request):
                    index += 1
                    if index <= skip:
                        continue  # pushed by the worker this one took over from
                    item_or_request.meta[START_META_KEY] = index - 1
                    if queue_max is not None:
                        # the size seen at the last check plus what was yielded since:
                        # check Redis again before that estimate could pass the bound
                        estimate += 1
                        if estimate >= queue_max or \
                                time.monotonic() - checked_at > CHECK_PERIOD:
                            estimate = await self._wait_for_room(client) + 1
                            checked_at = time.monotonic()
                    self._yielded = index
                yield item_or_request
            if mode == "once" and not lost.is_set():
                self._yielded = max(self._yielded, skip)
                while self._progress() < self._yielded:  # the last ones are being pushed
                    if ledger is not None and ledger.closing:
                        return  # not all pushed: a later worker takes the rest over
                    await asyncio.sleep(self.config.poll_interval)
                await self._patiently(lambda: self._seeding(client, "done", self._progress()))
                self._holding = False
                logger.info("Start requests done: %d", self._yielded,
                            extra={"spider": self.crawler.spider})
        finally:
            if ledger is not None:
                ledger.start_active = False
            if renewer is not None:
                renewer.cancel()
            await client.aclose()

    async def _spider_closed(self, spider: Any, reason: str) -> None:
        """A worker closing (Ctrl-C, SIGTERM, any close) before its start requests are done
        writes its progress and gives the seeding lease up, so another worker takes the rest
        over at once instead of after FLEET_LEASE_TIMEOUT.  It runs after the scheduler's
        last frontier call, so the progress counts every start request that call pushed."""
        if not self._holding:
            return
        self._holding = False
        client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                          is_async=True)
        self._seeding_script = None  # registered with the client process_start closed
        try:
            status, value = await self._seeding(client, "release", self._progress())
        except Exception as exc:  # the lease expires by itself then
            logger.warning("Could not give the start requests' lease up (%s); another worker "
                           "takes them over after FLEET_LEASE_TIMEOUT=%s s", exc,
                           self.config.lease_timeout, extra={"spider": spider})
            return
        finally:
            await client.aclose()
        if status == "ok":
            logger.info("Start requests interrupted (%s) after %s of them: lease given up, "
                        "another worker takes the rest over", reason, value,
                        extra={"spider": spider})

    def _skipped(self) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.set_value("fleet/start/skipped", 1)
