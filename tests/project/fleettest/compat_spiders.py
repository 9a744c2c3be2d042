"""``compat``: the spider of docs/scrapy-compat.md's crawl (tests/e2e/test_scrapy_compat.py).

Plain Scrapy, nothing fleet-specific: ``start_urls`` (a page, two redirect chains of the test
site, a URL that always fails), a ``DEPTH_LIMIT`` in ``custom_settings``, links followed with
request cookies, and a ``spider_idle`` handler that schedules one more request with
``crawler.engine.crawl()`` and keeps the spider open with ``DontCloseSpider``.  Each item
says what its response saw: depth, redirects, the Referer and Cookie headers sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response, TextResponse

#: what the spider_idle handler asks for (a 404 of the test site: fetched, no callback)
IDLE_PATH = "site/p/idle.html"
#: start_urls after the base: the index, 2 redirects (followed with REDIRECT_MAX_TIMES=2),
#: 3 redirects (the third refused), a path the test site answers 500 to
START_PATHS = ("site/", "_hops/1/outside/", "_hops/2/nowhere.html", "fail/always")


class CompatSpider(scrapy.Spider):
    name = "compat"
    custom_settings = {"DEPTH_LIMIT": 2}

    def __init__(self, base: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = base
        self.start_urls = [base + path for path in START_PATHS]
        self.idle_calls = 0

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> CompatSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signal=signals.spider_idle)
        return spider

    def idle(self) -> None:
        self.idle_calls += 1
        if self.idle_calls == 1:
            self.crawler.engine.crawl(scrapy.Request(self.base + IDLE_PATH))
            raise DontCloseSpider

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        headers = response.request.headers if response.request is not None else {}
        yield {
            "url": response.url,
            "depth": response.meta.get("depth"),
            "redirect_times": response.meta.get("redirect_times", 0),
            "parent": response.meta.get("parent"),
            "referer": (headers.get(b"Referer") or b"").decode(),
            "cookie": (headers.get(b"Cookie") or b"").decode(),
        }
        if not isinstance(response, TextResponse):
            return
        for href in response.xpath("//a/@href").getall():
            url = response.urljoin(href).split("#")[0]
            if url.startswith(self.base + "site/"):
                yield scrapy.Request(url, cookies={"fleet": "compat"},
                                     meta={"parent": response.url})
