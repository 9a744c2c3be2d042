"""The example project's ``docs`` spider for plain Scrapy (the throughput baseline).

``scrapy runspider bench/plain_docs.py -a start=URL`` inside example_project/: the same
``parse`` code as ``scrapy crawl docs``, only with ``start_urls`` taken from ``-a start=``
(several URLs separated by commas: one per host of a many-host site; the fleet version
gets its start URLs from ``scrapy fleet push`` instead), and a start
request that goes through the dupefilter like a pushed one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy
from example_project.spiders.docs import DocsSpider


class PlainDocsSpider(DocsSpider):
    name = "docs"

    def __init__(self, start: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not start:
            raise ValueError("pass the start URL with -a start=URL")
        self.start_urls = start.split(",")

    async def start(self) -> AsyncIterator[Any]:
        # Not dont_filter (Scrapy's default for start_urls): the fleet pushes its start URL
        # through the dupefilter too, so both sides crawl the index page exactly once.
        for url in self.start_urls:
            yield scrapy.Request(url)
