"""Spiders for tests/e2e/test_crawl.py and tests/test_scheduler.py."""

from __future__ import annotations

import threading
from typing import Any

import redis
import scrapy
import scrapy.exceptions
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


#: Debian's chromium, as root, on a closed network (never `playwright install`)
CHROMIUM_LAUNCH = {
    "executable_path": "/usr/bin/chromium",
    "headless": True,
    "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync"],
}


class BrowserPagesSpider(scrapy.Spider):
    """Pages whose content JavaScript inserts, rendered by scrapy-playwright through the fleet:
    links are followed with page methods (wait, click, wait), one link with meta=response.meta."""

    name = "browser_pages"
    custom_settings = {"FLEET_PLAYWRIGHT": True, "PLAYWRIGHT_BROWSER_TYPE": "chromium",
                       "PLAYWRIGHT_LAUNCH_OPTIONS": CHROMIUM_LAUNCH,
                       "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": 2, "CONCURRENT_REQUESTS": 2}

    def parse(self, response: Any) -> Any:
        from scrapy_playwright.page import PageMethod

        methods = response.meta.get("playwright_page_methods") or []
        yield {"url": response.url,
               "inserted": response.css("#inserted::text").get(),
               "revealed": response.css("#revealed::text").get(),
               "methods": [pm.method for pm in methods],
               "browser": "playwright" in response.flags,
               "stored": "fleet-stored" in response.flags}
        for href in response.css("a.page::attr(href)").getall():
            yield response.follow(href, meta={"playwright": True, "playwright_page_methods": [
                PageMethod("wait_for_selector", "#inserted"),
                PageMethod("click", "#reveal"),
                PageMethod("wait_for_selector", "#revealed"),
            ]})
        for href in response.css("a.again::attr(href)").getall():
            # the page methods in response.meta hold their results (live objects) by now
            yield response.follow(href, meta=response.meta)


class StagedSpider(scrapy.Spider):
    """A generated site (testsite.generate_site) crawled with a callback that burns CPU
    (``-a burn=MS``): for fetch/parse stages.  Items hold what the page says, never who
    parsed it, so crawls in different roles yield identical items; ``pid`` tells who."""

    name = "staged"
    burn = "0"

    def parse(self, response: Any) -> Any:
        import os
        import time

        deadline = time.process_time() + float(self.burn) / 1000
        while time.process_time() < deadline:
            pass
        if "/site/" not in response.url:
            return
        links = sorted(set(response.css("a::attr(href)").getall()))
        yield {"url": response.url, "status": response.status,
               "title": response.css("title::text").get(),
               "links": links, "class": type(response).__name__,
               "stored": "fleet-stored" in response.flags, "pid": os.getpid()}
        for href in links:
            url = response.urljoin(href)
            if "/site/" in url:
                yield scrapy.Request(url)


class BanError(scrapy.exceptions.IgnoreRequest):
    """What a proxy pool raises after its retries (like scrapy_fleet.proxies.ProxyBanError)."""

    fleet_reason = "proxy/banned"

    def __init__(self, response: Any) -> None:
        super().__init__(f"banned at {response.url}")
        self.response = response


class BanMiddleware:
    """Downloader middleware: a response to a URL with "banned" in it raises BanError from
    process_response (so no process_exception sees it)."""

    def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        if "banned" in request.url:
            raise BanError(response)
        return response


class FailsSpider(scrapy.Spider):
    """Fetches what is pushed, follows nothing; its callback raises on URLs with "boom"; a URL
    with "banned" is banned by BanMiddleware."""

    name = "fails"
    custom_settings = {"DOWNLOADER_MIDDLEWARES": {"fleettest.spiders.BanMiddleware": 590}}

    def parse(self, response: Any) -> Any:
        if "boom" in response.url:
            raise ValueError(f"callback gave up on {response.url}")
        yield {"url": response.url, "status": response.status}


class RobotsProbeSpider(scrapy.Spider):
    """Start requests to the URLs given with ``-a urls=U1,U2,...``; one item per response
    ({url, status}) and one per failure its errback sees ({url, error: the exception's class
    name, message})."""

    name = "robots_probe"

    def __init__(self, urls: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = [u for u in urls.split(",") if u]

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, errback=self.failed)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status}

    def failed(self, failure: Any) -> Any:
        yield {"url": failure.request.url, "error": type(failure.value).__name__,
               "message": str(failure.value)}


class StuckPipeline:
    """An item pipeline that never finishes (awaits forever, the reactor stays free)."""

    async def process_item(self, item: Any) -> Any:
        import asyncio

        await asyncio.sleep(3600)
        return item


class StuckSpider(scrapy.Spider):
    """Fetches what is pushed; its items hang in StuckPipeline, so nothing is acknowledged."""

    name = "stuck"
    custom_settings = {"ITEM_PIPELINES": {"fleettest.spiders.StuckPipeline": 100}}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}


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


class ProxyTicketHeaderMiddleware:
    """A downloader middleware (order 700: after the fleet's proxy middleware, 585, chose the
    exit) that sends the choice's ticket as header ``X-Fleet-Test-Ticket``, which
    tests/proxysite.py logs: tickets count up fleet-wide (one INCR per choice), so the site's
    log gives the order in which the fleet *chose* requests, whatever order they arrived in."""

    def process_request(self, request: Any, spider: Any = None) -> None:
        value = request.meta.get("fleet_proxy_exit")
        if isinstance(value, str) and "|" in value:
            request.headers["X-Fleet-Test-Ticket"] = value.partition("|")[2]
        return None


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


class TagStartMiddleware:
    """A spider middleware that works on start requests only, as many do: it appends "tagged"
    to ``meta["start_tags"]``, drops a request whose meta has ``drop``, and after one whose
    meta names an ``extra`` URL yields a request of its own to it.  Stat ``tagstart/seen``:
    start requests it saw."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Any) -> TagStartMiddleware:
        return cls(crawler)

    async def process_start(self, start: Any) -> Any:
        async for request in start:
            if not isinstance(request, scrapy.Request):
                yield request
                continue
            self.crawler.stats.inc_value("tagstart/seen")
            if request.meta.get("drop"):
                continue
            request.meta["start_tags"] = [*request.meta.get("start_tags", []), "tagged"]
            yield request
            if request.meta.get("extra"):
                yield scrapy.Request(request.meta["extra"], meta={"generated_by": request.url})


class TaggedStartsSpider(scrapy.Spider):
    """Fetches what is pushed, through :class:`TagStartMiddleware`; one item per response
    with the tags its request arrived with."""

    name = "tagged_starts"
    custom_settings = {"SPIDER_MIDDLEWARES": {"fleettest.spiders.TagStartMiddleware": 543}}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "start_tags": response.meta.get("start_tags"),
               "is_start_request": response.meta.get("is_start_request", False),
               "generated_by": response.meta.get("generated_by")}


class SlowParseSpider(scrapy.Spider):
    """Fetches what is pushed; its callback blocks the reactor for ``block`` seconds (given
    with -a), as a slow parse does: the worker's frontier calls stop meanwhile."""

    name = "slow_parse"

    def __init__(self, block: str = "0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block = float(block)

    def parse(self, response: Any) -> Any:
        import time

        time.sleep(self.block)
        yield {"url": response.url}
