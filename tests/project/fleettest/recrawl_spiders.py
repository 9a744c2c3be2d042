"""Spiders of the recrawl tests (tests/worker/test_recrawl.py): follow the changing site."""

from __future__ import annotations

from typing import Any

import scrapy


class RecrawlSpider(scrapy.Spider):
    """Starts at -a start=URL, yields one item per page (its URL and paragraph) and follows
    the links of the start page; with -a errbacks=1 the links have an errback, which yields
    an item {"url", "errback": the failure's exception class}."""

    name = "recrawl"

    def __init__(self, start: str = "", errbacks: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start] if start else []
        self.errbacks = bool(errbacks)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status,
               "text": " ".join(response.css("p:not(.noise)::text").getall())}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse,
                                  errback=self.failed if self.errbacks else None)

    def failed(self, failure: Any) -> Any:
        yield {"url": failure.request.url, "errback": failure.type.__name__}
