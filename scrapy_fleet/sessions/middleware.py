"""``FleetCookiesMiddleware``: Scrapy's cookie handling with the jars in Redis, shared by every
worker (docs/sessions.md).

The add-on puts it at 700, in place of Scrapy's ``CookiesMiddleware`` (unless
``FLEET_COOKIES`` is False, or ``COOKIES_ENABLED`` is: then Scrapy's own, per process, or
none).  It is Scrapy's middleware, fed for each request with a jar rebuilt from the fleet's
(sessions/jar.py), so ``meta["cookiejar"]``, ``meta["dont_merge_cookies"]``,
``Request.cookies`` and the public-suffix and domain/path/secure rules behave as in one Scrapy
process:

* ``process_request``: one read of the session's jar (shared by the requests of the session
  that arrive in the same turn of the event loop), then Scrapy's own ``process_request``
  on it (the request's own ``cookies`` accepted into the jar, the ``Cookie`` header set); the
  request's own cookies that were not already stored alike are merged into the fleet's jar
  (one write, only then).
* ``process_response``: an answer without ``Set-Cookie`` costs nothing; else Scrapy's own
  ``process_response`` on an empty recording jar (the stdlib decides which cookies are
  accepted, which deleted), and one atomic merge of those cookies into the fleet's jar,
  acknowledged before the answer goes on: a redirect (600) or a callback's link that follows
  is read with them, whichever worker leases it.

A cookie over ``FLEET_COOKIE_MAX_BYTES`` is not stored: the request fails with
:class:`~scrapy_fleet.sessions.CookieTooLargeError` (failed record ``cookie/too_large``), the
other cookies being stored.  ``COOKIES_DEBUG`` logs the headers with every value hidden
(``redact.cookie_header``).

A partitioned crawl (``FLEET_PARTITIONS`` > 1) splits each session's jar by site (the
registered domain of the request's host: hosts that may share a cookie share it) into the
site's partition, so while one master of a Redis Cluster is down only the requests whose site's
jar is there wait; the others go on (one jar under the crawl's own tag stopped every request).

While Redis is unreachable a request waits for its jar (the fleet's back-off, then again
every ``OUTAGE_WAIT`` seconds) until Redis answers or the worker closes.

Stats: ``fleet/cookies/jars`` (requests given their session's jar), ``reads`` (Redis reads:
the requests of one session that arrive in one turn of the event loop share one),
``writes``, ``stored``, ``deleted``, ``expired``, ``too_large``, ``corrupt`` (stored fields
that could not be read, skipped), ``redis_waits`` (rounds of retries that ended with Redis
still unreachable).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import Request, signals
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.python import to_unicode

from scrapy_fleet import engine_hooks, redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import host_key
from scrapy_fleet.redact import cookie_header
from scrapy_fleet.sessions import CookieTooLargeError
from scrapy_fleet.sessions.jar import CookieStore, FleetCookieJar, cookie_bytes, session_id

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_STAT = "fleet/cookies/"
#: seconds between two rounds of retries while Redis stays unreachable
OUTAGE_WAIT = 1.0
T = TypeVar("T")


class FleetCookiesMiddleware:
    """See the module docstring.  Scrapy's own middleware (:attr:`scrapy`) does the cookie
    work, each call on the jar of the request's session alone.

    Raises:
        NotConfigured: ``COOKIES_ENABLED`` or ``FLEET_COOKIES`` is False.
    """

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        #: Scrapy's middleware; its debug lines would show the values: ours hide them
        self.scrapy = CookiesMiddleware(debug=False)
        self.scrapy.crawler = crawler
        self.crawler = crawler
        self.config = config
        self.log_cookies = crawler.settings.getbool("COOKIES_DEBUG")
        self._store: CookieStore | None = None
        #: (session, site) -> the read that the requests arriving in this turn of the loop
        #: share
        self._reads: dict[tuple[str, str], asyncio.Future[list[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetCookiesMiddleware:
        if not crawler.settings.getbool("COOKIES_ENABLED"):
            raise NotConfigured("COOKIES_ENABLED is False")
        config = FleetConfig.from_settings(crawler.settings)
        if not config.cookies.enabled:
            raise NotConfigured("FLEET_COOKIES is False")
        return cls(crawler, config)

    def _inc(self, key: str, n: int = 1) -> None:
        if n and self.crawler.stats is not None:
            self.crawler.stats.inc_value(_STAT + key, n)

    def store(self) -> CookieStore:
        if self._store is None:
            spider = self.crawler.spider
            assert spider is not None
            keys = CrawlKeys(self.config.key_prefix,
                             self.config.resolve_crawl_id(spider.name))
            client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                              is_async=True)
            self._store = CookieStore(client, keys, self.config.partitions)
        return self._store

    async def _closed(self, spider: Any = None) -> None:
        if self._store is not None:
            await self._store.client.aclose()

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` with the fleet's back-off (one log line per outage); while Redis stays
        unreachable the request waits, never sent without its session's cookies, until the
        worker closes.

        Raises:
            RedisUnavailableError: Redis is unreachable and the worker is closing.
        """
        while True:
            try:
                return await redis_client.call_retrying_async(
                    call, self.config.redis_url, self.config.redis_retries, self.store().client)
            except RedisUnavailableError:
                self._inc("redis_waits")
                if engine_hooks.engine_closing(self.crawler):
                    raise
                await asyncio.sleep(OUTAGE_WAIT)

    def site(self, request: Request) -> str:
        """The site of *request*'s host, whose part of a session's jar it reads and writes:
        "" with one partition (one jar per session); else its registered domain by the
        public suffix list (an IP address or a name without one: the host itself), the
        hosts that may share a cookie (:meth:`CrawlKeys.site_cookie_jar`)."""
        if self.config.partitions <= 1:
            return ""
        return host_key(request.url, "domain")

    async def _load(self, session: str, site: str) -> FleetCookieJar:
        """*session*'s jar for one request to a host of *site*.  Requests of one session and
        site that arrive in the same turn of the event loop share one read, sent in the next
        turn: after each of them arrived, so each sees every merge acknowledged before it
        (never an earlier read)."""
        loop = asyncio.get_running_loop()
        batch = self._reads.get((session, site))
        if batch is None:
            batch = self._reads[(session, site)] = loop.create_future()
            loop.call_soon(self._send_read, session, site, batch)
        self._inc("jars")
        store = self.store()
        corrupt = store.corrupt
        jar = store.jar(await asyncio.shield(batch))
        self._inc("corrupt", store.corrupt - corrupt)
        return jar

    def _send_read(self, session: str, site: str, batch: asyncio.Future[list[Any]]) -> None:
        """Close *session*'s batch for *site* (a later request starts another) and read its
        jar."""
        if self._reads.get((session, site)) is batch:
            del self._reads[(session, site)]
        store = self.store()

        async def read() -> None:
            try:
                reply = await self._call(lambda: store.read(session, site))
            except asyncio.CancelledError:
                batch.cancel()
                raise
            except Exception as exc:  # (the requests of the batch get it)
                batch.set_exception(exc)
                batch.exception()  # retrieved: cancelled requests may have left the batch
                return
            self._inc("reads")
            batch.set_result(reply)

        self._tasks.add(task := asyncio.ensure_future(read()))
        task.add_done_callback(self._tasks.discard)

    async def _save(self, jar: FleetCookieJar, request: Request, session: str) -> None:
        """Merge what *jar* recorded into *session*'s jar (one write, none when nothing
        changed); then refuse the request if a cookie was too large."""
        limit = self.config.cookies.max_bytes
        large = [c for c in jar.stored.values() if cookie_bytes(c) > limit]
        fits = [c for c in jar.stored.values() if cookie_bytes(c) <= limit]
        if fits or jar.cleared:
            store = self.store()
            stored, deleted, expired = await self._call(
                lambda: store.merge(session, fits, jar.cleared, self.site(request)))
            self._inc("writes")
            self._inc("stored", stored)
            self._inc("deleted", deleted)
            self._inc("expired", expired)
        if large:
            self._inc("too_large", len(large))
            names = ", ".join(f"{c.name!r} for {c.domain}{c.path} ({cookie_bytes(c)} bytes)"
                              for c in large)
            raise CookieTooLargeError(
                f"cookie {names} of session {session!r} not stored: larger than "
                f"FLEET_COOKIE_MAX_BYTES={limit} ({request.url})")

    async def process_request(self, request: Request, spider: Any = None) -> None:
        if request.meta.get("dont_merge_cookies", False):
            return None
        key = request.meta.get("cookiejar")
        session = session_id(key)
        jar = await self._load(session, self.site(request))
        self.scrapy.jars[key] = jar  # Scrapy's own handling, on this request's jar only
        try:
            self.scrapy.process_request(request)
        finally:
            del self.scrapy.jars[key]
        await self._save(jar, request, session)
        if self.log_cookies:
            self._log("Sending cookies to: %s", request, request.headers.getlist("Cookie"),
                      "Cookie", False)
        return None

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Request | Response:
        if request.meta.get("dont_merge_cookies", False):
            return response
        set_cookies = response.headers.getlist("Set-Cookie")
        if not set_cookies:
            return response
        key = request.meta.get("cookiejar")
        jar = FleetCookieJar()
        self.scrapy.jars[key] = jar
        try:
            self.scrapy.process_response(request, response)
        finally:
            del self.scrapy.jars[key]
        if self.log_cookies:
            self._log("Received cookies from: %s", response, set_cookies, "Set-Cookie", True)
        await self._save(jar, request, session_id(key))
        return response

    def _log(self, message: str, subject: Any, values: list[bytes], header: str,
             set_cookie: bool) -> None:
        lines = "".join(f"\n{header}: {cookie_header(to_unicode(v, errors='replace'), set_cookie)}"
                        for v in values)
        if lines:
            logger.debug(message + lines, subject, extra={"spider": self.crawler.spider})
