"""A spider that fetches the pushed pages and follows nothing (bench_backpressure part b).

``scrapy runspider bench/drain_spider.py -s FLEET_CRAWL_ID=urls1m ...`` inside
example_project/ (the project's settings, so the fleet add-on, apply): no start URLs, one
small item per fetched page, no links, so every page fetched is one entry pushed by the
push helper and the fleet-wide counters add up exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.http import Response


class DrainSpider(scrapy.Spider):
    name = "drain"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "status": response.status}
