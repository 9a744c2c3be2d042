"""Spider middleware deciding which worker consumes the spider's start requests.

Every worker runs the same spider, so by default each would schedule the spider's start
requests (``start_urls``, ``start()``), which are ``dont_filter=True`` in Scrapy and so would
be crawled once per worker.  ``FLEET_START_REQUESTS`` chooses:

* ``"once"`` (default): the first worker of the crawl (``SET NX`` on the crawl's ``seeded``
  key) consumes them; the others skip them.  The mark lasts until ``scrapy fleet purge``.
* ``"always"``: every worker consumes them, as plain Scrapy would.
* ``"never"``: no worker does; all work comes from ``scrapy fleet push``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from scrapy_fleet import redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys import CrawlKeys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class FleetStartMiddleware:
    """See module docstring.  Stat: ``fleet/start/skipped`` (1 when this worker skipped)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetStartMiddleware:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    async def _won_seeding(self) -> bool:
        spider = self.crawler.spider
        assert spider is not None
        keys = CrawlKeys(self.config.key_prefix, self.config.resolve_crawl_id(spider.name))
        client = redis_client.async_client(self.config.redis_url, self.config.redis_timeout)
        try:
            await redis_client.ping_async(client, self.config.redis_url)
            won = await client.set(keys.seeded, self.config.worker_id, nx=True)
            if won:
                return True
            holder = await client.get(keys.seeded)
            logger.info("Start requests already consumed by worker %s; this worker skips them "
                        "(FLEET_START_REQUESTS='once')",
                        holder.decode() if isinstance(holder, bytes) else holder or "?",
                        extra={"spider": spider})
            return False
        finally:
            await client.aclose()

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        mode = self.config.start_requests
        if mode == "never" or (mode == "once" and not await self._won_seeding()):
            if self.crawler.stats is not None:
                self.crawler.stats.set_value("fleet/start/skipped", 1)
            return
        async for item_or_request in start:
            yield item_or_request
