"""Spiders for tests/test_crawl.py and tests/test_scheduler.py."""

from __future__ import annotations

import threading
from typing import Any

import redis
import scrapy
from parsel import Selector


class CodecTroubleSpider(scrapy.Spider):
    """Yields requests the frontier cannot store next to one it can."""

    name = "codec_trouble"

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
        if response.meta.get("second"):
            return
        yield scrapy.Request(response.urljoin("p/1.html"), callback=lambda r: None)
        yield scrapy.Request(response.urljoin("p/2.html"), meta={"sel": Selector(text="<a/>")})
        yield scrapy.Request(response.urljoin("p/3.html"), meta={"lock": threading.Lock()})
        yield scrapy.Request(response.urljoin("p/4.html"), meta={"second": True})


class AckProbePipeline:
    """Records, while an item is in the pipeline, whether its request is still leased."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    @classmethod
    def from_crawler(cls, crawler: Any) -> AckProbePipeline:
        return cls(crawler.settings["FLEET_REDIS_URL"])

    async def process_item(self, item: Any) -> Any:
        import asyncio

        await asyncio.sleep(0.5)  # an item pipeline that takes its time
        item["leased_in_pipeline"] = self.client.zcard("fleet:{ack_probe}:leases")
        item["acked_in_pipeline"] = int(self.client.hget("fleet:{ack_probe}:stats", "acked") or 0)
        return item


class AckProbeSpider(scrapy.Spider):
    name = "ack_probe"
    custom_settings = {"ITEM_PIPELINES": {"fleettest.spiders.AckProbePipeline": 100},
                       "FLEET_PREFETCH": 1, "CONCURRENT_REQUESTS": 1}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}


class StartsSpider(scrapy.Spider):
    """A plain spider with start_urls (given with -a start=URL)."""

    name = "starts"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [start]

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}


class ManyStartsSpider(scrapy.Spider):
    """Yields ``n`` start requests to pages of ``base`` (given with -a)."""

    name = "many_starts"

    def __init__(self, base: str = "", n: str = "100", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base = base
        self.n = int(n)

    async def start(self) -> Any:
        for i in range(self.n):
            yield scrapy.Request(f"{self.base}site/p/{i}.html")

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}


class FetchSpider(scrapy.Spider):
    """Fetches what is pushed, follows nothing: one item per response."""

    name = "fetch"

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status}


class ProxyPagesSpider(scrapy.Spider):
    """Follows the links of tests/proxysite.py; each item says which egress carried the page
    (the site echoes the client address), the download slot and the exit; an errback item
    records requests given up on (with the exception's ``fleet_reason``)."""

    name = "proxy_pages"

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status,
               "addr": response.css("#addr::text").get(),
               "challenge": b"challenge-platform" in response.body,
               "slot": self.crawler.engine.downloader.get_slot_key(response.request),
               "download_slot_meta": response.meta.get("download_slot"),
               "exit": response.meta.get("fleet_proxy_exit")}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, errback=self.failed)

    def failed(self, failure: Any) -> Any:
        yield {"failed": failure.request.url, "error": type(failure.value).__name__,
               "fleet_reason": getattr(failure.value, "fleet_reason", None)}


class TinyproxyAuthPolicy:
    """A ban policy (FLEET_PROXY_BAN_POLICY) for Debian's tinyproxy 1.11, which refuses bad
    proxy credentials with 401 + ``Server: tinyproxy`` instead of 407: the exit's fault."""

    def response_verdict(self, request: Any, response: Any, site: str) -> Any:
        from scrapy_fleet.proxies.verdicts import Verdict

        if response.status == 401 and response.headers.get(b"Server", b"").startswith(
                b"tinyproxy"):
            return Verdict("proxy_dead", "tinyproxy:401")
        return None  # don't know: the settings' rules decide

    def exception_verdict(self, request: Any, exception: BaseException, site: str) -> Any:
        return None
