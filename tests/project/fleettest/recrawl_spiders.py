"""Spiders of the recrawl tests (tests/worker/test_recrawl.py): follow the changing site."""

from __future__ import annotations

import time
from typing import Any

import scrapy
from scrapy.spiders import SitemapSpider


class RecrawlSpider(scrapy.Spider):
    """Starts at -a start=URL, yields one item per page (its URL and paragraph) and follows
    the links of the start page; with -a errbacks=1 the links have an errback, which yields
    an item {"url", "errback": the failure's exception class}; with -a stamp=1 each item has
    a ``fetched_at`` (a field that changes at every visit: FLEET_RECRAWL_IGNORE_FIELDS)."""

    name = "recrawl"

    def __init__(self, start: str = "", errbacks: str = "", stamp: str = "",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start] if start else []
        self.errbacks = bool(errbacks)
        self.stamp = bool(stamp)

    def parse(self, response: Any) -> Any:
        item = {"url": response.url, "status": response.status,
                "text": " ".join(response.css("p:not(.noise)::text").getall())}
        if self.stamp:
            item["fetched_at"] = time.time()
        yield item
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse,
                                  errback=self.failed if self.errbacks else None)

    def failed(self, failure: Any) -> Any:
        yield {"url": failure.request.url, "errback": failure.type.__name__}


class RecrawlSitemapSpider(SitemapSpider):
    """Reads the sitemap -a sitemap=URL (revisited every -a every=SECONDS, meta
    ``fleet_recrawl``) and yields one item per page it lists (sitemap <lastmod>, issue 22)."""

    name = "recrawl_sitemap"

    def __init__(self, sitemap: str = "", every: str = "1", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sitemap_urls = [sitemap] if sitemap else []
        self.every = float(every)

    async def start(self) -> Any:
        for url in self.sitemap_urls:
            yield scrapy.Request(url, callback=self._parse_sitemap,
                                 meta={"fleet_recrawl": self.every})

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status}
