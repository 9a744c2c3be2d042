"""Fleet-wide duplicate filter: a scalable Bloom filter in Redis, shared by every worker.

Inside :class:`~scrapy_fleet.frontier.scheduler.FleetScheduler` the check-and-add runs in the
same Lua call that pushes the new requests (one round trip for a whole batch).  Used with any other
scheduler, :meth:`RedisBloomDupeFilter.request_seen` runs ``bloom_add.lua`` itself (one
blocking round trip per request).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import msgpack
from scrapy.dupefilters import BaseDupeFilter

from scrapy_fleet import lua, redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.fingerprint import fast_bloom_key, is_default_fingerprinter
from scrapy_fleet.keys.crawl import CrawlKeys

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: seconds a cached script reply is kept for a repeated call
OP_TTL_MS = 300_000


class RedisBloomDupeFilter(BaseDupeFilter):
    """Bloom-filter dupefilter; fingerprints from ``crawler.request_fingerprinter``.

    Capacity (fingerprints) and error rate (probability) come from
    ``FLEET_DUPEFILTER_CAPACITY`` and ``FLEET_DUPEFILTER_ERROR_RATE``; the filter grows by
    slices past its capacity (see bloom.py).  Stats: ``dupefilter/filtered`` (Scrapy's) and
    ``fleet/dupefilter/filtered``.
    """

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.fingerprinter = crawler.request_fingerprinter
        #: Scrapy's own fingerprinter: the key of a plain GET comes from the URL alone
        #: (fingerprint.url_bloom_key, cached per URL)
        self._by_url = is_default_fingerprinter(self.fingerprinter.fingerprint)
        self.debug = crawler.settings.getbool("DUPEFILTER_DEBUG")
        self.logdupes = True
        self._keys: CrawlKeys | None = None
        self._client: Any = None
        self._script: Any = None
        self._prev_op = "-"

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisBloomDupeFilter:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def bloom_key(self, request: Request) -> bytes:
        """12-byte Bloom key of *request*: ``bloom.bloom_key`` of its fingerprint (for a
        plain GET under Scrapy's default fingerprinter the same bytes from
        ``fingerprint.url_bloom_key``, remembered per URL)."""
        if self._by_url:
            key = fast_bloom_key(request)
            if key is not None:
                return key
        return bloom_key(self.fingerprinter.fingerprint(request))

    def keys_for(self, spider_name: str) -> CrawlKeys:
        if self._keys is None:
            crawl_id = self.config.resolve_crawl_id(spider_name)
            self._keys = CrawlKeys(self.config.key_prefix, crawl_id)
        return self._keys

    def request_seen(self, request: Request) -> bool:
        """Blocking check-and-add (one round trip); True when the request was seen before."""
        spider = self.crawler.spider
        keys = self.keys_for(spider.name if spider else "default")
        if self._client is None:
            self._client = redis_client.make_client(self.config.redis_url,
                                                    self.config.redis_timeout)
            self._script = lua.load(self._client, "bloom_add.lua")
        op = uuid.uuid4().hex
        args = [self.config.dupefilter.capacity, self.config.dupefilter.error_rate, OP_TTL_MS,
                self.bloom_key(request)]
        ks = keys.bloom_add_keys(op, self._prev_op)
        reply = redis_client.call_retrying(lambda: self._script(keys=ks, args=args),
                                           self.config.redis_url, self.config.redis_retries)
        self._prev_op = op
        return not msgpack.unpackb(reply, raw=True)[0]

    def log(self, request: Request, spider: Spider) -> None:
        """Log the first duplicate (or each one with DUPEFILTER_DEBUG) and count it."""
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request},
                         extra={"spider": spider})
        elif self.logdupes:
            logger.debug("Filtered duplicate request: %(request)s - no more duplicates will be "
                         "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                         {"request": request}, extra={"spider": spider})
            self.logdupes = False
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("dupefilter/filtered")
            stats.inc_value("fleet/dupefilter/filtered")

    def close(self, reason: str) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
