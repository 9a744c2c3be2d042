"""Spiders of the partition tests (tests/worker/test_partitions.py, issue 21)."""

from __future__ import annotations

from typing import Any

import scrapy


class FanoutSpider(scrapy.Spider):
    """One item per page.  The start page (``-a start=URL``) links to ``n`` pages spread over
    the hosts ``-a hosts=BASE,BASE...`` (base URLs); those pages link to nothing."""

    name = "fanout"

    def __init__(self, start: str = "", hosts: str = "", n: str = "10", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.hosts = [h.rstrip("/") for h in hosts.split(",") if h]
        self.n = int(n)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
        if response.url in self.start_urls:
            for i in range(self.n):
                yield scrapy.Request(f"{self.hosts[i % len(self.hosts)]}/site/p/{i}.html")
