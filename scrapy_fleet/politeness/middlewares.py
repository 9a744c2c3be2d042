"""Downloader middlewares of the fleet: the politeness guard and back-off, shared robots.txt.

Both are enabled by ``scrapy_fleet.Addon`` (docs/politeness.md).

* :class:`FleetPolitenessMiddleware` (order 560, next to the downloader): a request that did
  not come from the frontier (robots.txt fetches, ``engine.download`` calls) takes a token
  from the same per-host GCRA limiter as the frontier's leases, waiting if needed; 429 and
  503 answers and failures to connect put the host on hold for the whole fleet.
* :class:`FleetRobotsTxtMiddleware` (order 100, in place of Scrapy's ``RobotsTxtMiddleware``
  when ``ROBOTSTXT_OBEY`` is True): robots.txt is fetched once per host per
  ``FLEET_ROBOTSTXT_TTL`` for the whole fleet, kept in Redis, and parsed with Protego.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from scrapy_fleet import engine_hooks, outage, redis_client
from scrapy_fleet.codec import LEASE_META_KEY
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys import CrawlKeys
from scrapy_fleet.politeness import hosts as politeness

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.RedisError, ConnectionError, TimeoutError, OSError)
#: the robots middleware of each crawler, for the scheduler's early check
_ROBOTS: weakref.WeakKeyDictionary[Any, FleetRobotsTxtMiddleware] = weakref.WeakKeyDictionary()


def robots_of(crawler: Any) -> FleetRobotsTxtMiddleware | None:
    """The crawler's FleetRobotsTxtMiddleware, if ROBOTSTXT_OBEY enabled it."""
    return _ROBOTS.get(crawler)
#: statuses that put a host on hold (fleet-wide back-off)
BACKOFF_STATUSES = (429, 503)
_STAT = "fleet/politeness/"


def retry_after_seconds(response: Response) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date (RFC 9110
    section 10.2.3).  A date is measured against the response's ``Date`` header when it has
    one (the server's clock), else against this machine's clock.  None when absent/invalid."""
    value = response.headers.get(b"Retry-After")
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    date_header = response.headers.get(b"Date")
    try:
        now = parsedate_to_datetime(date_header.decode("latin-1")).timestamp() \
            if date_header else time.time()
    except (TypeError, ValueError):
        now = time.time()
    return max(0.0, when.timestamp() - now)


class _FleetDownloaderMiddleware:
    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self._politeness: politeness.Politeness | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def _inc(self, key: str, n: int = 1) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(key, n)

    def politeness(self) -> politeness.Politeness:
        if self._politeness is None:
            spider = self.crawler.spider
            assert spider is not None
            keys = CrawlKeys(self.config.key_prefix, self.config.resolve_crawl_id(spider.name))
            client = redis_client.async_client(self.config.redis_url, self.config.redis_timeout)
            self._politeness = politeness.Politeness(client, keys, self.config,
                                                     self.config.worker_id)
        return self._politeness

    def host(self, request: Request) -> str:
        return politeness.host_key(request.url, self.config.host_key)

    def _redis_trouble(self, exc: BaseException, message: str, *args: Any) -> None:
        """A politeness call to Redis failed: counted; a connection failure is an outage,
        logged once for the worker (outage.py), so this line goes to DEBUG then."""
        self._inc(_STAT + "redis_errors")
        level = logging.WARNING
        if isinstance(exc, redis_client.RETRYABLE):
            outage.tracker(self.config.redis_url).failed(exc)
            level = logging.DEBUG
        logger.log(level, message, *args, extra={"spider": self.crawler.spider})


class FleetPolitenessMiddleware(_FleetDownloaderMiddleware):
    """Guard and back-off.  Stats: ``fleet/politeness/guard_waits``,
    ``fleet/politeness/backoff/<status>``, ``fleet/politeness/failures``."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        super().__init__(crawler, config)
        self._failing: set[str] = set()

    async def process_request(self, request: Request, spider: Any = None) -> None:
        try:
            await self._wait_turn(request)
        except _REDIS_ERRORS as exc:
            # never lose a request to a politeness call: go on without it, and say so
            self._redis_trouble(exc, "Politeness check for %s failed (%s); the request goes on",
                                request.url, exc)

    async def _wait_turn(self, request: Request) -> None:
        host = self.host(request)
        if request.meta.get(LEASE_META_KEY):
            # leased from the frontier: its token was taken then, but a 429/503 seen by any
            # worker since may have put the host on hold; every frontier call brings the
            # fleet's holds, so this check needs no round trip of its own
            scheduler = engine_hooks.scheduler_of(self.crawler)
            hold_left = getattr(scheduler, "hold_left", None)
            while hold_left is not None and (hold := hold_left(host)) > 0:
                self._inc(_STAT + "hold_waits")
                await asyncio.sleep(min(hold, 60.0))
            return None
        while True:
            wait = await self.politeness().take(host)
            if wait <= 0:
                return None
            self._inc(_STAT + "guard_waits")
            await asyncio.sleep(min(wait, 60.0))

    def _note_hold(self, host: str, seconds: float) -> None:
        """Tell this worker's scheduler at once (others learn it at their next call)."""
        scheduler = engine_hooks.scheduler_of(self.crawler)
        holds = getattr(scheduler, "holds", None)
        if isinstance(holds, dict):
            holds[host] = max(holds.get(host, 0.0), time.monotonic() + seconds)

    def _download_over(self, request: Request) -> None:
        """The host's concurrency slot of a leased request can go (after any hold is set)."""
        download_over = getattr(engine_hooks.scheduler_of(self.crawler), "download_over", None)
        if download_over is not None and request.meta.get(LEASE_META_KEY):
            download_over(request)

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Response:
        try:
            await self._after_response(request, response)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Back-off bookkeeping for %s failed (%s)", request.url, exc)
        finally:
            self._download_over(request)
        return response

    async def _after_response(self, request: Request, response: Response) -> None:
        host = self.host(request)
        if response.status in BACKOFF_STATUSES:
            retry_after = retry_after_seconds(response)
            hold = await self.politeness().backoff(host, retry_after)
            self._note_hold(host, hold)
            self._failing.add(host)
            self._inc(f"{_STAT}backoff/{response.status}")
            logger.info("%s answered %d: host on hold for %.1f s fleet-wide%s", host,
                        response.status, hold,
                        " (Retry-After)" if retry_after is not None else " (back-off)",
                        extra={"spider": self.crawler.spider})
        elif host in self._failing:
            self._failing.discard(host)
            await self.politeness().success(host)

    async def process_exception(self, request: Request, exception: BaseException,
                                spider: Any = None) -> None:
        try:
            await self._after_exception(request, exception)
        finally:
            self._download_over(request)

    async def _after_exception(self, request: Request, exception: BaseException) -> None:
        if isinstance(exception, IgnoreRequest):
            return None
        host = self.host(request)
        try:
            hold = await self.politeness().backoff(host, None)
            self._note_hold(host, hold)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Back-off bookkeeping for %s failed (%s)", request.url, exc)
            return None
        self._failing.add(host)
        self._inc(_STAT + "failures")
        logger.info("%s failed (%s): host on hold for %.1f s fleet-wide", host,
                    type(exception).__name__, hold, extra={"spider": self.crawler.spider})
        return None


class FleetRobotsTxtMiddleware(_FleetDownloaderMiddleware):
    """Shared robots.txt.  Stats: ``fleet/politeness/robots_disallowed``,
    ``fleet/politeness/robots_fetched``, ``fleet/politeness/robots_hold`` (requests sent back
    to the frontier because their host's robots.txt answered 5xx/429), and Scrapy's
    ``robotstxt/forbidden``.

    Raises:
        NotConfigured: when ``ROBOTSTXT_OBEY`` is False.
    """

    #: seconds to wait for another worker's robots.txt fetch before putting the request back
    WAIT_OTHER = 30.0

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured("ROBOTSTXT_OBEY is False")
        super().__init__(crawler, config)
        _ROBOTS[crawler] = self
        self._parsers: dict[str, tuple[Any, float]] = {}  # host -> (parser or None, expiry)
        self._useragent = crawler.settings.get("ROBOTSTXT_USER_AGENT") or \
            crawler.settings.get("USER_AGENT")

    async def process_request(self, request: Request, spider: Any = None) -> Any:
        if request.meta.get("dont_obey_robotstxt"):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        host = self.host(request)
        try:
            parser = await self._parser(request, host)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Shared robots.txt of %s unavailable (%s); the request goes "
                                "back to the frontier", host, exc)
            parser = "hold"
        if parser == "hold":
            self._inc(_STAT + "robots_hold")
            # back to the frontier (pushed with this request's acknowledgement); the host is
            # on hold there, so it is leased again only after the hold
            return request.replace(dont_filter=True)
        if parser is not None:
            useragent = self._useragent or request.headers.get(b"User-Agent", b"")
            if isinstance(useragent, bytes):
                useragent = useragent.decode("latin-1")
            if not parser.can_fetch(request.url, useragent):
                self._inc(_STAT + "robots_disallowed")
                self._inc("robotstxt/forbidden")
                if request.meta.get(LEASE_META_KEY):
                    try:  # its lease took the host's turn: give it back
                        await self.politeness().refund(host)
                    except _REDIS_ERRORS:
                        pass
                raise IgnoreRequest("Forbidden by robots.txt")
        return None

    async def _parser(self, request: Request, host: str) -> Any:
        cached = self._parsers.get(host)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        p = self.politeness()
        ttl_ms = self.config.robotstxt_ttl * 1000
        deadline = time.monotonic() + self.WAIT_OTHER
        while True:
            entry, now_ms = await p.robots_get(host)
            if entry is not None and now_ms - int(entry.get("at", 0)) < ttl_ms:
                return self._remember(host, entry, now_ms)
            if await p.robots_lock(host):
                return await self._fetch(request, host)
            if time.monotonic() > deadline:
                return "hold"
            await asyncio.sleep(0.2)  # another worker is fetching it

    def _remember(self, host: str, entry: dict[str, Any], now_ms: int) -> Any:
        from protego import Protego

        status = int(entry.get("status", 0))
        expires = time.monotonic() + self.config.robotstxt_ttl - (
            now_ms - int(entry.get("at", now_ms))) / 1000
        if status >= 500 or status == 429 or status == 0:
            # not cached: the hold expires before the TTL, and then it is fetched again
            return "hold"
        parser = None
        if 200 <= status < 300:
            body = entry.get("body", b"")
            parser = Protego.parse(body.decode("utf-8", "replace") if isinstance(
                body, bytes) else str(body))
        self._parsers[host] = (parser, expires)
        return parser

    async def _fetch(self, request: Request, host: str) -> Any:
        from protego import Protego
        from scrapy.http.request import NO_CALLBACK

        url = urlparse_cached(request)
        robots = Request(f"{url.scheme}://{url.netloc}/robots.txt", priority=1000,
                         meta={"dont_obey_robotstxt": True}, callback=NO_CALLBACK)
        status, body, hold, delay = 0, b"", self.config.robotstxt_hold, None
        try:
            response = await _download(self.crawler, robots)
            status, body = response.status, response.body
        except Exception as exc:
            logger.warning("robots.txt of %s could not be fetched (%s): host on hold for "
                           "%.0f s", host, exc, hold, extra={"spider": self.crawler.spider})
        self._inc(_STAT + "robots_fetched")
        if status and status < 500 and status != 429:
            hold = 0.0
            if 200 <= status < 300:
                useragent = self._useragent or "*"
                parsed = Protego.parse(body.decode("utf-8", "replace"))
                cd = parsed.crawl_delay(useragent)
                if cd is not None:
                    delay = min(float(cd), self.config.max_crawl_delay)
        await self.politeness().robots_store(host, status, body, delay, hold)
        entry, now_ms = await self.politeness().robots_get(host)
        assert entry is not None
        parser = self._remember(host, entry, now_ms)
        if delay:
            await asyncio.sleep(delay)  # robots.txt itself was this host's last request
        return parser

    def disallows(self, request: Request) -> bool:
        """True when this worker already knows *request*'s host forbids it (local cache
        only, no I/O): the scheduler drops such links before they reach the frontier."""
        cached = self._parsers.get(self.host(request))
        if cached is None or cached[0] is None or cached[1] <= time.monotonic():
            return False
        useragent = self._useragent or request.headers.get(b"User-Agent", b"")
        if isinstance(useragent, bytes):
            useragent = useragent.decode("latin-1")
        return not cached[0].can_fetch(request.url, useragent)


async def _download(crawler: Crawler, request: Request) -> Response:
    engine = crawler.engine
    if hasattr(engine, "download_async"):
        return await engine.download_async(request)  # Scrapy >= 2.14
    from scrapy.utils.defer import maybe_deferred_to_future

    return await maybe_deferred_to_future(engine.download(request))
