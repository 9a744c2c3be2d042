"""Downloader middlewares of the fleet: the politeness guard and back-off, shared robots.txt.

Both are enabled by ``scrapy_fleet.Addon`` (docs/politeness.md).

* :class:`FleetPolitenessMiddleware` (order 560, next to the downloader): a request that did
  not come from the frontier (robots.txt fetches, ``engine.download`` calls) takes a token
  from the same per-host GCRA limiter as the frontier's leases, waiting if needed; 429 and
  503 answers and failures to connect put the host on hold for the whole fleet.
* :class:`FleetRobotsTxtMiddleware` (order 100, in place of Scrapy's ``RobotsTxtMiddleware``
  when ``ROBOTSTXT_OBEY`` is True): robots.txt is fetched once per origin (scheme, host,
  port; RFC 9309) per ``FLEET_ROBOTSTXT_TTL`` for the whole fleet, kept in Redis, and parsed
  with Protego; an origin whose robots.txt fails is tried again by one worker after a
  growing wait, its requests waiting in the frontier, and given up after
  ``FLEET_ROBOTSTXT_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from scrapy_fleet import engine_hooks, outage, redis_client
from scrapy_fleet.codec import DEFER_META_KEY, LEASE_META_KEY
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import CrawlDelayTooLong, RobotsTxtUnavailable
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.politeness.memory import CapacityMemory
from scrapy_fleet.politeness.reports import (  # noqa: F401 (exported)
    CLEAN,
    NEITHER,
    OVERLOAD,
    exception_report,
    response_report,
    retry_after_seconds,
)
from scrapy_fleet.proxies import exit_id

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.RedisError, ConnectionError, TimeoutError, OSError)
#: the robots middleware of each crawler, for the scheduler's early check
_ROBOTS: weakref.WeakKeyDictionary[Any, FleetRobotsTxtMiddleware] = weakref.WeakKeyDictionary()


def robots_of(crawler: Any) -> FleetRobotsTxtMiddleware | None:
    """The crawler's FleetRobotsTxtMiddleware, if ROBOTSTXT_OBEY enabled it."""
    return _ROBOTS.get(crawler)
#: seconds a request waits for Redis in the politeness guard before asking again (doubling)
_GUARD_FIRST_WAIT, _GUARD_MAX_WAIT = 0.1, 5.0
#: statuses that put a host on hold (fleet-wide back-off)
BACKOFF_STATUSES = (429, 503)
_STAT = "fleet/politeness/"


class _FleetDownloaderMiddleware:
    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self._politeness: politeness.Politeness | None = None
        crawler.signals.connect(self._close_client, signal=signals.spider_closed)

    async def _close_client(self, spider: Any = None) -> None:
        """Close the Redis client at the spider's end: left to the garbage collector, each of
        its connections raised a ``ResourceWarning`` (an error under ``-W error``)."""
        await self._before_close()
        if self._politeness is not None:
            await self._politeness.client.aclose()

    async def _before_close(self) -> None:
        """What a middleware still writes at the spider's end (nothing by default)."""

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
            keys = self.config.crawl_keys(spider.name)  # (in its crawl group, if any)
            client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                              is_async=True)
            self._politeness = politeness.Politeness(
                client, keys, self.config, self.config.worker_id,
                on_call=lambda: self._inc(_STAT + "redis_calls"))
        return self._politeness

    def host(self, request: Request) -> str:
        return politeness.host_key(request.url, self.config.politeness.host_key)

    def _redis_trouble(self, exc: BaseException, message: str, *args: Any) -> None:
        """A politeness call to Redis failed: counted; a connection failure is an outage,
        logged once for the worker (outage.py), so this line goes to DEBUG then."""
        self._inc(_STAT + "redis_errors")
        level = logging.WARNING
        if isinstance(exc, redis_client.RETRYABLE):
            outage.tracker(self.config.redis_url).failed(exc)
            level = logging.DEBUG
        logger.log(level, message, *args, extra={"spider": self.crawler.spider})


def host_failures(names: list[Any]) -> tuple[type[BaseException], ...]:
    """The exception classes that are a host's failures (Scrapy's ``RETRY_EXCEPTIONS``: a
    connection refused, a timeout, a name that does not resolve, ...): only these put a host
    on hold; a name that cannot be imported is skipped (RetryMiddleware reports it)."""
    from scrapy.utils.misc import load_object

    found: list[type[BaseException]] = []
    for name in names:
        try:
            cls = load_object(name) if isinstance(name, str) else name
        except (ImportError, NameError, ValueError, AttributeError):
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


class FleetPolitenessMiddleware(_FleetDownloaderMiddleware):
    """Guard and back-off.  Stats: ``fleet/politeness/guard_waits``,
    ``fleet/politeness/guard_redis_waits``, ``fleet/politeness/backoff/<status>``,
    ``fleet/politeness/failures`` (a host's failures: :func:`host_failures`),
    ``fleet/politeness/request_errors`` (other exceptions: the request's own, no hold)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        super().__init__(crawler, config)
        self._failing: set[str] = set()
        self._host_failures = host_failures(crawler.settings.getlist("RETRY_EXCEPTIONS"))
        self._adaptive = config.politeness.adaptive
        self._memory: CapacityMemory | None = None

    async def process_request(self, request: Request, spider: Any = None) -> None:
        """Fail closed: while the politeness call fails (Redis unreachable), the request
        waits here, with back-off (0.1 s doubling to 5 s), and asks again; it is never sent
        without its turn.  Stats: ``fleet/politeness/guard_redis_waits``."""
        host = self.host(request)
        await self._remember(lambda m: m.recall(host))
        delay = _GUARD_FIRST_WAIT
        while True:
            try:
                await self._wait_turn(request)
                return None
            except _REDIS_ERRORS as exc:
                self._inc(_STAT + "guard_redis_waits")
                self._redis_trouble(exc, "Politeness check for %s failed (%s); the request waits "
                                    "for its turn (never sent without it)", request.url, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _GUARD_MAX_WAIT)

    async def _wait_turn(self, request: Request) -> None:
        host = self.host(request)
        if request.meta.get(LEASE_META_KEY):
            # leased from the frontier: its token was taken then, but a 429/503 seen by any
            # worker since may have put the host on hold; every frontier call brings the
            # fleet's holds, so this check needs no round trip of its own
            ledger = engine_hooks.ledger_of(self.crawler)
            while ledger is not None and (hold := ledger.hold_left(host)) > 0:
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
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None:
            ledger.note_hold(host, seconds)

    def _download_over(self, request: Request,
                       report: tuple[int, int, str] | None = None) -> None:
        """The host's concurrency slot of a leased request can go (after any hold is set),
        with the download's *report* for the host's adaptive controller, and the proxy exit
        it went through (its latency is the exit's: lua/adaptive.lua)."""
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None and request.meta.get(LEASE_META_KEY):
            ledger.download_over(request, (*report, exit_id(request.meta))
                                 if report is not None and self._adaptive.enabled else None)

    async def _remember(self, step: Callable[[CapacityMemory], Awaitable[None]]) -> None:
        """A step of the learned capacities kept across crawls (memory.py), when the
        controller and FLEET_ADAPTIVE_MEMORY are on; a Redis error is reported, not raised."""
        if self._memory is None:
            if not (self._adaptive.enabled and self._adaptive.memory > 0):
                return
            self._memory = CapacityMemory(self.politeness(), self.config.key_prefix,
                                          self._adaptive.memory, self._adaptive.window, self._inc)
        try:
            await step(self._memory)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Learned capacities not recalled or kept (%s)", exc)

    async def _before_close(self) -> None:
        await self._remember(lambda m: m.close())

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Response:
        report = response_report(request, response, self._adaptive)
        try:
            await self._after_response(request, response)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Back-off bookkeeping for %s failed (%s)", request.url, exc)
        finally:
            self._download_over(request, report)
        await self._remember(lambda m: m.after(self.host(request), report[0] == OVERLOAD))
        return response

    async def _after_response(self, request: Request, response: Response) -> None:
        host = self.host(request)
        retry_after = retry_after_seconds(response)
        if self._adaptive.enabled and retry_after is None and self.config.politeness.host_interval \
                and response.status in self._adaptive.overload_statuses:
            # the host's controller lowers its rate (lua/adaptive.lua): no hold, which would
            # idle the host and then let it go at full speed again (a fleet without a rate or
            # delay has no ceiling to adapt under: its hosts are held as before)
            self._inc(f"{_STAT}overload/{response.status}")
            return None
        if response.status in BACKOFF_STATUSES:
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
        report = None if isinstance(exception, IgnoreRequest) else \
            exception_report(request, exception)
        try:
            await self._after_exception(request, exception)
        finally:
            self._download_over(request, report)
        if report is not None:
            await self._remember(lambda m: m.after(self.host(request), report[0] == OVERLOAD))

    async def _after_exception(self, request: Request, exception: BaseException) -> None:
        if isinstance(exception, IgnoreRequest):
            return None
        if not isinstance(exception, self._host_failures):
            # the request's own fault (a URL or meta value the downloader refuses before
            # it connects): not the host's; FleetFailureWatch records it as failed
            self._inc(_STAT + "request_errors")
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


class _RobotsState:
    """What this worker knows of one origin's robots.txt, until ``until`` (monotonic s):
    ``kind`` "rules" (``value``: a Protego parser, or None: allow all), "wait" (its robots.txt
    failed: no new attempt before ``until``), "gone" (``value``: the failure message) or
    "skip" (``value``: its Crawl-delay, s, over FLEET_SKIP_CRAWL_DELAY_OVER)."""

    __slots__ = ("kind", "until", "value")

    def __init__(self, kind: str, value: Any, until: float) -> None:
        self.kind = kind
        self.value = value
        self.until = until


class FleetRobotsTxtMiddleware(_FleetDownloaderMiddleware):
    """Shared robots.txt, per origin (``scheme://host:port``, RFC 9309).

    Stats: ``fleet/politeness/robots_fetched`` (robots.txt fetches by this worker, for the
    fleet), ``fleet/politeness/robots_failed`` (those that gave no usable answer: none, 5xx,
    429), ``fleet/politeness/robots_hold`` (requests sent back to wait in the frontier until
    their origin's next robots.txt attempt), ``fleet/politeness/robots_unreachable`` (requests
    failed with :class:`~scrapy_fleet.errors.RobotsTxtUnavailable` after
    ``FLEET_ROBOTSTXT_MAX_ATTEMPTS``), ``fleet/politeness/robots_disallowed`` and Scrapy's
    ``robotstxt/forbidden``, ``fleet/politeness/redis_calls`` (politeness round trips).

    Raises:
        NotConfigured: when ``ROBOTSTXT_OBEY`` is False.
    """

    #: seconds to wait for another worker's robots.txt fetch before putting the request back
    WAIT_OTHER = 30.0
    #: seconds a request waits in the frontier when robots.txt cannot be looked up (Redis
    #: error, or another worker's fetch outlasted WAIT_OTHER)
    RETRY_LATER = 2.0
    #: seconds the fetch lock of an origin lasts unless its holder renews it
    LOCK_TTL = 30.0

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        if not crawler.settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured("ROBOTSTXT_OBEY is False")
        super().__init__(crawler, config)
        _ROBOTS[crawler] = self
        self._states: dict[str, _RobotsState] = {}  # origin -> what this worker knows
        self._gone_logged: set[str] = set()
        #: origin -> this worker's fetch under way: its other requests wait for it, no I/O
        self._fetching: dict[str, asyncio.Future[_RobotsState]] = {}
        self._fetches = itertools.count(1)
        self._useragent = crawler.settings.get("ROBOTSTXT_USER_AGENT") or \
            crawler.settings.get("USER_AGENT")

    async def process_request(self, request: Request, spider: Any = None) -> Any:
        if request.meta.get("dont_obey_robotstxt"):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        origin = politeness.robots_origin(request.url)
        if not origin:
            return None
        try:
            state = await self._state(request, origin)
        except _REDIS_ERRORS as exc:
            self._redis_trouble(exc, "Shared robots.txt of %s unavailable (%s); the request goes "
                                "back to the frontier", origin, exc)
            state = _RobotsState("wait", None, time.monotonic() + self.RETRY_LATER)
        if state.kind == "wait":
            return self._send_back(request, state.until - time.monotonic())
        if state.kind == "gone":
            return await self._give_up(request, origin, str(state.value))
        if state.kind == "skip":
            return await self._skip(request, origin, state.value)
        parser = state.value
        if parser is not None:
            useragent = self._useragent or request.headers.get(b"User-Agent", b"")
            if isinstance(useragent, bytes):
                useragent = useragent.decode("latin-1")
            if not parser.can_fetch(request.url, useragent):
                self._inc(_STAT + "robots_disallowed")
                self._inc("robotstxt/forbidden")
                if request.meta.get(LEASE_META_KEY):
                    try:  # its lease took the host's turn: give it back
                        await self.politeness().refund(self.host(request))
                    except _REDIS_ERRORS:
                        pass
                raise IgnoreRequest("Forbidden by robots.txt")
        return None

    def _send_back(self, request: Request, seconds: float) -> Request:
        """Back to the frontier (pushed with this request's acknowledgement), to wait there
        *seconds* among the deferred entries: no worker holds it or spins on it meanwhile, and
        its host's other requests (other origins) go on."""
        self._inc(_STAT + "robots_hold")
        again = request.replace(dont_filter=True)
        again.meta[DEFER_META_KEY] = max(0.05, seconds + 0.05)  # due just after the attempt
        return again

    async def _give_up(self, request: Request, origin: str, message: str) -> None:
        self._inc(_STAT + "robots_unreachable")
        if origin not in self._gone_logged:
            self._gone_logged.add(origin)
            logger.error("%s; its requests fail with RobotsTxtUnavailable (errback) and go to "
                         "the dead letters (scrapy fleet dead) (logged once per origin)",
                         message, extra={"spider": self.crawler.spider})
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None and request.meta.get(LEASE_META_KEY):
            ledger.dead_letter(request, message)
        raise RobotsTxtUnavailable(message, origin)

    async def _skip(self, request: Request, origin: str, delay: float) -> None:
        """FLEET_SKIP_CRAWL_DELAY_OVER: *origin* asks a Crawl-delay of *delay* s, more than
        that: the request goes to the dead letters (reason ``crawl_delay``), not sent."""
        self._inc(_STAT + "crawl_delay_skipped")
        limit = self.config.politeness.skip_crawl_delay_over
        message = f"robots.txt of {origin} asks Crawl-delay {delay:g} s " \
                  f"(over FLEET_SKIP_CRAWL_DELAY_OVER = {limit:g} s)"
        if origin not in self._gone_logged:
            self._gone_logged.add(origin)
            logger.warning("%s: its requests go to the dead letters, reason crawl_delay "
                           "(logged once per origin)", message,
                           extra={"spider": self.crawler.spider})
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None and request.meta.get(LEASE_META_KEY):
            ledger.dead_letter(request, "crawl_delay")
        raise CrawlDelayTooLong(message, origin, delay)

    async def _state(self, request: Request, origin: str) -> _RobotsState:
        state = self._states.get(origin)
        if state is not None and state.until > time.monotonic():
            return state
        fetching = self._fetching.get(origin)
        if fetching is not None:
            return await asyncio.shield(fetching)
        p = self.politeness()
        deadline = time.monotonic() + self.WAIT_OTHER
        pause = 0.2
        while True:
            fetching = self._fetching.get(origin)
            if fetching is not None:  # another request of this worker took the lock meanwhile
                return await asyncio.shield(fetching)
            owner = f"{self.config.worker_id}/{next(self._fetches)}"
            taken, entry, now_ms = await p.robots_lock(origin, self.LOCK_TTL, owner)
            if not taken:
                state = self._read(origin, entry, now_ms)
                if state is not None:
                    return state
            else:
                future: asyncio.Future[_RobotsState] = asyncio.get_running_loop().create_future()
                self._fetching[origin] = future
                try:
                    state = await self._fetch(request, origin, owner)
                except BaseException as exc:
                    future.set_exception(exc)
                    future.exception()  # retrieved: the waiters, if any, get it too
                    raise
                else:
                    future.set_result(state)
                    return state
                finally:
                    self._fetching.pop(origin, None)
            if time.monotonic() > deadline:
                return _RobotsState("wait", None, time.monotonic() + self.RETRY_LATER)
            await asyncio.sleep(pause)  # another worker is fetching it
            pause = min(pause * 1.5, 2.0)

    def _read(self, origin: str, entry: dict[str, Any] | None,
              now_ms: int) -> _RobotsState | None:
        """The state an entry of the fleet gives (kept locally while it holds), or None: a
        robots.txt attempt is due (no entry, expired, or a failed one whose wait is over)."""
        from protego import Protego

        if entry is None:
            return None
        at = _int(entry.get("at"))
        age_ms = now_ms - at
        ttl_ms = self.config.politeness.robotstxt_ttl * 1000
        if age_ms >= ttl_ms:
            return None
        now = time.monotonic()
        expires = now + (ttl_ms - age_ms) / 1000
        status = _int(entry.get("status"))
        if _int(entry.get("gone")):
            error = _text(entry.get("err")) or "no answer"
            fails = _int(entry.get("fails"))
            message = (f"robots.txt of {origin} could not be fetched in {fails} attempt(s) "
                       f"(FLEET_ROBOTSTXT_MAX_ATTEMPTS; last: {error})")
            state = _RobotsState("gone", message, expires)
        elif status == 0 or status >= 500 or status == 429:
            next_ms = _int(entry.get("next"))
            if next_ms <= now_ms:
                return None
            state = _RobotsState("wait", None, now + (next_ms - now_ms) / 1000)
        else:
            parser = None
            if 200 <= status < 300:
                body = entry.get("body", b"")
                parser = Protego.parse(body.decode("utf-8", "replace") if isinstance(
                    body, bytes) else str(body))
            delay = self._skipped_delay(parser)
            state = _RobotsState("rules", parser, expires) if delay is None else \
                _RobotsState("skip", delay, expires)
        self._states[origin] = state
        return state

    def _skipped_delay(self, parser: Any) -> float | None:
        """The Crawl-delay (s) of robots.txt rules *parser* when it is over
        FLEET_SKIP_CRAWL_DELAY_OVER (the host is skipped), else None."""
        limit = self.config.politeness.skip_crawl_delay_over
        delay = parser.crawl_delay(self._useragent or "*") if limit is not None else None
        return float(delay) if delay is not None and float(delay) > limit else None  # type: ignore[operator]

    async def _fetch(self, request: Request, origin: str, owner: str) -> _RobotsState:
        from protego import Protego
        from scrapy.http.request import NO_CALLBACK

        url = urlparse_cached(request)
        # one attempt is one request: the fleet's growing waits between attempts take the
        # place of Scrapy's retries (which would also lengthen the host's back-off 3-fold)
        robots = Request(f"{url.scheme}://{url.netloc}/robots.txt", priority=1000,
                         meta={"dont_obey_robotstxt": True, "dont_retry": True},
                         callback=NO_CALLBACK)
        status, body, delay, error, retry_after = 0, b"", None, "", None
        renew = asyncio.ensure_future(self._renew_lock(origin, owner))
        try:
            response = await _download(self.crawler, robots)
            status, body = response.status, response.body
            if status >= 500 or status == 429:
                error = f"HTTP {status}"
                retry_after = retry_after_seconds(response)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            renew.cancel()
        self._inc(_STAT + "robots_fetched")
        if 200 <= status < 300:
            useragent = self._useragent or "*"
            parsed = Protego.parse(body.decode("utf-8", "replace"))
            cd = parsed.crawl_delay(useragent)
            if cd is not None and self._skipped_delay(parsed) is None:  # (skipped: no spacing)
                cap = self.config.politeness.max_crawl_delay  # (None: no cap)
                delay = float(cd) if cap is None else min(float(cd), cap)
        entry, now_ms = await self.politeness().robots_store(
            origin, self.host(request), status, body, delay, error, retry_after)
        state = self._read(origin, entry, now_ms)
        if error:
            self._inc(_STAT + "robots_failed")
            if state is not None and state.kind == "wait":
                limit = self.config.politeness.robotstxt_max_attempts
                logger.warning("robots.txt of %s could not be fetched (%s; attempt %d%s): its "
                               "requests wait %.1f s in the frontier, then one worker tries "
                               "again", origin, error, _int(entry.get("fails")),
                               f" of {limit}" if limit else "", state.until - time.monotonic(),
                               extra={"spider": self.crawler.spider})
        if state is None:  # FLEET_ROBOTSTXT_HOLD = 0: tried again at the next lease
            state = _RobotsState("wait", None, time.monotonic())
        if delay:
            await asyncio.sleep(delay)  # robots.txt itself was this host's last request
        return state

    async def _renew_lock(self, origin: str, owner: str) -> None:
        """Keep the fetch lock while the fetch lasts (the guard may wait out the host's
        back-off, Scrapy may retry): no second worker fetches meanwhile, and a worker that
        dies lets another one take over within ``LOCK_TTL``."""
        while True:
            await asyncio.sleep(self.LOCK_TTL / 3)
            try:
                await self.politeness().robots_lock(origin, self.LOCK_TTL, owner)
            except _REDIS_ERRORS:
                pass

    def disallows(self, request: Request) -> bool:
        """True when this worker already knows *request*'s origin forbids it (local cache
        only, no I/O): the scheduler drops such links before they reach the frontier."""
        state = self._states.get(politeness.robots_origin(request.url))
        if state is None or state.kind != "rules" or state.value is None \
                or state.until <= time.monotonic():
            return False
        useragent = self._useragent or request.headers.get(b"User-Agent", b"")
        if isinstance(useragent, bytes):
            useragent = useragent.decode("latin-1")
        return not state.value.can_fetch(request.url, useragent)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


async def _download(crawler: Crawler, request: Request) -> Response:
    engine = crawler.engine
    if hasattr(engine, "download_async"):
        return await engine.download_async(request)  # Scrapy >= 2.14
    from scrapy.utils.defer import maybe_deferred_to_future

    return await maybe_deferred_to_future(engine.download(request))
