"""Spiders of the recrawl tests (tests/worker/test_recrawl.py): follow the changing site."""

from __future__ import annotations

from typing import Any

import scrapy


class RecrawlSpider(scrapy.Spider):
    """Starts at -a start=URL, yields one item per page (its URL and paragraph) and follows
    the links of the start page."""

    name = "recrawl"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start] if start else []

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status,
               "text": " ".join(response.css("p:not(.noise)::text").getall())}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
