"""``FleetSpiderMiddleware``: who consumes start requests, their back pressure, and which
request found which link.

Start requests.  Every worker runs the same spider, so by default each would schedule the
spider's start requests (``start_urls``, ``start()``), which are ``dont_filter=True`` in Scrapy
and so would be crawled once per worker.  ``FLEET_START_REQUESTS`` chooses:

* ``"once"`` (default): the first worker of the crawl (``SET NX`` on the crawl's ``seeded``
  key) consumes them; the others skip them.  The mark lasts until ``scrapy fleet purge``.
* ``"always"``: every worker consumes them, as plain Scrapy would.
* ``"never"``: no worker does; all work comes from ``scrapy fleet push``.

Start requests are consumed lazily: while the frontier holds ``FLEET_QUEUE_MAX`` entries or
more, the middleware stops reading them until the frontier is below the low watermark.

Links.  For each request the spider's callback yields, the middleware tells the scheduler
which leased request found it, so the link travels with that request's acknowledgement.
It must be the outermost spider middleware (order 0, set by the add-on), so that it sees the
requests the other middlewares let through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_fleet import engine_hooks, redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier import frontier_size
from scrapy_fleet.keys import CrawlKeys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)

#: seconds between two checks of the frontier's size while reading start requests, at most
CHECK_PERIOD = 0.5


class FleetSpiderMiddleware(BaseSpiderMiddleware):
    """See module docstring.  Stats: ``fleet/start/skipped`` (1 when this worker skipped the
    start requests), ``fleet/backpressure/start_paused`` (pauses of the start requests)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        super().__init__(crawler)
        self.config = config

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSpiderMiddleware:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def get_processed_request(self, request: Request,
                              response: Response | None) -> Request | None:
        if response is not None:
            scheduler = engine_hooks.scheduler_of(self.crawler)
            note = getattr(scheduler, "note_parent", None)
            if note is not None:
                note(request, response.request)
        return request

    def _keys(self) -> CrawlKeys:
        spider = self.crawler.spider
        assert spider is not None
        return CrawlKeys(self.config.key_prefix, self.config.resolve_crawl_id(spider.name))

    async def _won_seeding(self, client: Any) -> bool:
        keys = self._keys()
        won = await client.set(keys.seeded, self.config.worker_id, nx=True)
        if won:
            return True
        holder = await client.get(keys.seeded)
        logger.info("Start requests already consumed by worker %s; this worker skips them "
                    "(FLEET_START_REQUESTS='once')",
                    holder.decode() if isinstance(holder, bytes) else holder or "?",
                    extra={"spider": self.crawler.spider})
        return False

    def _local(self) -> int:
        """Requests this worker buffered but has not pushed yet."""
        scheduler = engine_hooks.scheduler_of(self.crawler)
        return int(getattr(scheduler, "outbox_size", 0))

    async def _wait_for_room(self, client: Any) -> int:
        """Return the frontier's size (with this worker's unpushed requests) at once when it
        is below FLEET_QUEUE_MAX, else once it is below the low watermark."""
        import asyncio

        queue_max, low = self.config.queue_max, self.config.queue_low
        assert queue_max is not None and low is not None
        size = await frontier_size(client, self._keys()) + self._local()
        if size < queue_max:
            return size
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value("fleet/backpressure/start_paused")
        logger.info("Frontier full (%d >= FLEET_QUEUE_MAX=%d): start requests paused until it "
                    "is below %d", size, queue_max, low, extra={"spider": self.crawler.spider})
        while size >= low:
            await asyncio.sleep(self.config.poll_interval)
            size = await frontier_size(client, self._keys()) + self._local()
        logger.info("Frontier at %d: start requests resumed", size,
                    extra={"spider": self.crawler.spider})
        return size

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        mode = self.config.start_requests
        if mode == "never":
            self._skipped()
            return
        client = redis_client.async_client(self.config.redis_url, self.config.redis_timeout)
        try:
            await redis_client.ping_async(client, self.config.redis_url)
            if mode == "once" and not await self._won_seeding(client):
                self._skipped()
                return
            queue_max = self.config.queue_max
            estimate, checked_at = 0, 0.0
            async for item_or_request in start:
                if isinstance(item_or_request, Request) and queue_max is not None:
                    # the size seen at the last check plus what was yielded since: check
                    # Redis again before that estimate could pass the bound
                    estimate += 1
                    if estimate >= queue_max or time.monotonic() - checked_at > CHECK_PERIOD:
                        estimate = await self._wait_for_room(client) + 1
                        checked_at = time.monotonic()
                yield item_or_request
        finally:
            await client.aclose()

    def _skipped(self) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.set_value("fleet/start/skipped", 1)
