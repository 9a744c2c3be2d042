"""Session pools on the requests (docs/sessions.md, "Session pools"): listed by the add-on
when ``FLEET_SESSION_POOL_SIZE`` is given.

``FleetSessionsMiddleware`` (downloader, 545: before the cookies (700), so it names the jar;
after the retries (550) and redirects (600) in ``process_response``, so it sees final answers):

* ``process_request``: a request pinned to a session (``meta["fleet_session"]``: set by a
  draw, copied by Scrapy's redirects and retries, given by the spider, inherited) uses it;
  one pinned to a retired session, or not pinned, draws the least used session of its pool
  (``meta["fleet_session_pool"]``, else its host).  A session that needs a login (new, or a
  failed check) is logged in by the first worker that claims it (sessions/login.py); the
  other requests of that session go back to the frontier, pinned to it and deferred (0.2 s,
  doubling up to 2 s), holding no download slot, until it is active at a new generation (a
  request that did not come from the frontier, or of a closing worker, waits in its worker,
  polling the record).  The request takes one of its session's slots
  (``FLEET_SESSION_CONCURRENCY``, ``FLEET_SESSION_DELAY``: politeness per session, waiting
  in the worker for it) in the draw or pin call itself, which also gives back the slots of
  the answers since the worker's last call (sessions/slots.py), and ``meta["cookiejar"]``
  names the session's fleet jar, ``meta["fleet_session_exit"]`` its bound proxy exit (""
  none yet).
* ``process_response``: a status of ``FLEET_SESSION_RETIRE_STATUSES`` retires the session
  (``status/<code>``); a 2xx answer that fails ``fleet_session_check`` asks one login of the
  session (one per generation across the fleet, lua/sessions.lua) or, without a login,
  retires it (``check``).  Either way the request is sent again (dont_filter), on the new
  generation or on another session: each failure is of a newer generation or another
  session than the last, since the request waits for them; after ``MAX_RETRIES`` (3) its
  answer goes on whatever it is (counted ``kept``).

Requests that skip sessions: ``meta["fleet_session"] = False``, ``dont_merge_cookies``, and
those with the spider's own ``meta["cookiejar"]`` (Scrapy's jars, as without pools).

``FleetSessionsSpiderMiddleware``: with ``FLEET_SESSION_INHERIT`` (default), a request a
callback yields to the same site (host) as its response's session, without a pool or session
of its own, is pinned to that session (and its pool).

Stats (``fleet/sessions/``): ``draws``, ``pinned``, ``redrawn`` (pinned to a retired session),
``logins``, ``login_failed``, ``deferred`` (requests sent back to the frontier to wait for a
login), ``waits`` (requests that waited in the worker for another's login), ``slot_waits``,
``check_failed``, ``retired/<reason>``, ``retried``, ``kept`` (an answer that failed after
``MAX_RETRIES``, passed on), ``inherited``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from scrapy_fleet import engine_hooks, redis_client
from scrapy_fleet.codec import DEFER_META_KEY, LEASE_META_KEY
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions import SessionError
from scrapy_fleet.sessions.login import SessionView, passes, run_login, spider_hook
from scrapy_fleet.sessions.pool import EXIT_META, Drawn, SessionPools, SlotAsk
from scrapy_fleet.sessions.slots import GiveBacks

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: ``meta`` key: ``"<session id>|<ticket>"``, the session slot a request holds
SLOT_META = "fleet_session_slot"
#: ``meta`` key: times a request went back to the frontier to wait for its session's login
DEFERRALS_META = "fleet_session_deferrals"
#: seconds a request waits in the frontier for a login: the first time, and at most
LOGIN_DEFER, LOGIN_DEFER_MAX = 0.2, 2.0

_STAT = "fleet/sessions/"
#: seconds between two reads of a session's record while its login runs elsewhere (max)
POLL = 0.5
#: sessions a request may see retired by failed logins before it fails
MAX_LOGIN_FAILURES = 3
#: times a request is sent again after its session failed it (a failed check: on the next
#: generation; a retiring status: on another session); then its answer goes on as it is
MAX_RETRIES = 3
T = TypeVar("T")


def pool_of(request: Request) -> str:
    """The pool of *request*: ``meta["fleet_session_pool"]``, else its host."""
    pool = request.meta.get("fleet_session_pool")
    return str(pool) if pool else (urlparse_cached(request).hostname or "")


def uses_sessions(request: Request) -> bool:
    meta = request.meta
    if meta.get("dont_merge_cookies") or meta.get("fleet_session") is False:
        return False
    if meta.get("fleet_session_login"):
        return False  # a login's own requests: in the jar its runner named
    return "fleet_session" in meta or "cookiejar" not in meta


class FleetSessionsMiddleware:
    """See the module docstring.

    Raises:
        NotConfigured: ``FLEET_SESSION_POOL_SIZE`` is 0, or the cookie jars are not the
            fleet's (``COOKIES_ENABLED`` or ``FLEET_COOKIES`` False).
    """

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._pools: SessionPools | None = None
        #: session id -> this worker's login of it in progress
        self._logins: dict[str, asyncio.Future[None]] = {}
        #: (session id, generation) whose check passed here already
        self._passed: set[tuple[str, int]] = set()
        crawler.signals.connect(self._closed, signal=signals.spider_closed)
        #: (politeness per session) this worker's slot tickets, and their lifetime (s)
        self._tickets = itertools.count(1)
        self._ticket_ttl = crawler.settings.getfloat("DOWNLOAD_TIMEOUT", 180) + 60
        self._capped = bool(config.sessions.concurrency or config.sessions.delay)
        self._gives = GiveBacks(self._send_gives)
        self._unhook: Callable[[], None] | None = None
        if self._capped:
            crawler.signals.connect(self._left, signal=signals.request_scheduled)
            crawler.signals.connect(self._opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSessionsMiddleware:
        config = FleetConfig.from_settings(crawler.settings)
        if not config.sessions.enabled:
            raise NotConfigured("FLEET_SESSION_POOL_SIZE is 0")
        if not (crawler.settings.getbool("COOKIES_ENABLED") and config.cookies.enabled):
            raise NotConfigured("session pools need the fleet's cookie jars (COOKIES_ENABLED "
                                "and FLEET_COOKIES)")
        return cls(crawler, config)

    def _inc(self, key: str, n: int = 1) -> None:
        if n and self.crawler.stats is not None:
            self.crawler.stats.inc_value(_STAT + key, n)

    def pools(self) -> SessionPools:
        if self._pools is None:
            spider = self.crawler.spider
            assert spider is not None
            keys = CrawlKeys(self.config.key_prefix, self.config.resolve_crawl_id(spider.name))
            client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                              is_async=True)
            login = spider_hook(spider, "fleet_session_login") is not None
            self._pools = SessionPools(client, keys, self.config.sessions, login)
        return self._pools

    def _opened(self, spider: Any = None) -> None:
        self._unhook = engine_hooks.on_scrape(self.crawler, self._scraped)

    async def _closed(self, spider: Any = None) -> None:
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        if self._pools is not None:
            await self._gives.flush()
            await self._pools.client.aclose()

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` with the fleet's back-off; while Redis stays unreachable the request
        waits (as for its cookies), until the worker closes.

        Raises:
            RedisUnavailableError: Redis is unreachable and the worker is closing.
        """
        while True:
            try:
                return await redis_client.call_retrying_async(
                    call, self.config.redis_url, self.config.redis_retries,
                    self.pools().client)
            except RedisUnavailableError:
                self._inc("redis_waits")
                if engine_hooks.engine_closing(self.crawler):
                    raise
                await asyncio.sleep(1.0)

    async def process_request(self, request: Request, spider: Any = None) -> Request | None:
        if not uses_sessions(request):
            return None
        self._give_back(request)  # an earlier attempt's slot (a copy of its meta)
        ticket = f"{self.worker}:{next(self._tickets)}" if self._capped else ""
        session = await self._session_for(request, ticket)
        if session.state == "active":
            session = await self._slot_for(request, session, ticket)
        if session.state != "active":  # its login runs: back to the frontier, deferred
            return self._deferred(request, session)
        request.meta.pop(DEFERRALS_META, None)
        request.meta["fleet_session"] = session.id
        request.meta["fleet_session_generation"] = session.generation
        request.meta["cookiejar"] = session.jar
        request.meta[EXIT_META] = session.exit  # (the proxy middleware binds an unbound one)
        return None

    # -- politeness per session (issue 32 item 5) -----------------------------------------

    def _ask(self, ticket: str) -> SlotAsk | None:
        """The slot work of the next sessions call: take a slot for *ticket* ("" none), and
        give back the slots whose answers came since the last call (they ride on it)."""
        if not self._capped:
            return None
        return SlotAsk(ticket, self._ticket_ttl, self._gives.take())

    async def _send_gives(self, gives: Sequence[str]) -> None:
        pools = self.pools()
        await self._call(lambda: pools.give_all(gives))

    async def _slot_for(self, request: Request, session: Drawn, ticket: str) -> Drawn:
        """*session* (or, when it was retired meanwhile, another) once one of its
        ``FLEET_SESSION_CONCURRENCY`` slots is *request*'s (named *ticket*) and its
        ``FLEET_SESSION_DELAY`` allows: mostly taken by the draw or pin call itself
        (:attr:`Drawn.slot`), else asked for here (``take``); the request waits in the
        worker meanwhile (``fleet/sessions/slot_waits``).  The slot is named in
        ``meta["fleet_session_slot"]`` and given back (:class:`GiveBacks`: with the worker's
        next sessions call, at the latest one turn of the event loop later) when its answer
        reaches this middleware (after the cookies middleware merged its cookies, so the
        next request of the session sends them), when it fails (``process_exception``),
        when it goes (back) to the scheduler (a retry, a redirect: ``request_scheduled``),
        or when the engine gets its final result (``engine_hooks.on_scrape``: an error
        raised by a later middleware's ``process_response``); a dead worker's runs out after
        ``DOWNLOAD_TIMEOUT`` + 60 s."""
        if not self._capped:
            return session
        pools = self.pools()
        waited = False
        while session.slot != "taken":
            if session.slot == "wait":
                if not waited:
                    waited = True
                    self._inc("slot_waits")
                await asyncio.sleep(min(max(session.wait, 0.005), POLL))
            gives = self._gives.take()
            state, wait = await self._call(functools.partial(
                pools.take, session.id, ticket, self._ticket_ttl, gives))
            if state in ("taken", "wait"):
                session = dataclasses.replace(session, slot=state, wait=wait)
                continue
            # retired meanwhile: pinned to it, the request redraws (a slot taken with it)
            request.meta["fleet_session"] = session.id
            session = await self._session_for(request, ticket)
            if session.state != "active":
                return session  # (deferred while its login runs)
        request.meta[SLOT_META] = f"{session.id}|{ticket}"
        return session

    def _give_back(self, request: Request) -> None:
        """Give back *request*'s session slot, if it holds one (out of its meta now: a copy
        made later has none)."""
        slot = request.meta.pop(SLOT_META, None)
        if isinstance(slot, str) and "|" in slot:
            self._gives.add(slot)

    def _scraped(self, result: Any, request: Request) -> None:
        """The engine got *request*'s final result (a Response, or the Failure of a download
        that failed for good, after every downloader middleware: one raised in
        ``process_response`` after the download, say): its slot, if this middleware's own
        ``process_response`` did not see the answer, is free."""
        self._give_back(request)

    def _left(self, request: Request, spider: Any = None) -> None:
        """A request went (back) to the scheduler: its session slot is free."""
        self._give_back(request)

    async def process_exception(self, request: Request, exception: BaseException,
                                spider: Any = None) -> None:
        self._give_back(request)
        return None

    def _deferrable(self, request: Request) -> bool:
        """Can *request* wait for its session's login in the frontier (a lease of the
        fleet's scheduler, a worker not closing)?"""
        return bool(request.meta.get(LEASE_META_KEY)) and \
            engine_hooks.ledger_of(self.crawler) is not None and \
            not engine_hooks.engine_closing(self.crawler)

    def _deferred(self, request: Request, session: Drawn) -> Request:
        """*request* back to the frontier (pushed with its lease's acknowledgement), pinned
        to *session*, due again in 0.2, 0.4, ... up to :data:`LOGIN_DEFER_MAX` seconds (its
        n-th deferral): it holds no download slot while the session's login runs on any
        worker (``fleet/sessions/deferred``)."""
        n = int(request.meta.get(DEFERRALS_META, 0) or 0)
        self._inc("deferred")
        again = request.replace(dont_filter=True)
        again.meta[DEFERRALS_META] = n + 1
        again.meta["fleet_session"] = session.id
        again.meta[DEFER_META_KEY] = min(LOGIN_DEFER_MAX, LOGIN_DEFER * 2 ** min(n, 8))
        return again

    async def _first(self, request: Request, ticket: str) -> Drawn:
        """The session *request* is pinned to, else one drawn from its pool; the same call
        takes a slot for *ticket* and gives back what is pending (:meth:`_ask`)."""
        pools = self.pools()
        sid = request.meta.get("fleet_session")
        if sid:
            ask = self._ask(ticket)
            drawn = await self._call(lambda: pools.pin(str(sid), ask))
            if drawn.state == "unknown":
                raise SessionError(f"{request.url}: meta['fleet_session']={sid!r}: no such "
                                   "session in this crawl", "session/unknown")
            if drawn.state != "retired":
                self._inc("pinned")
                return drawn
            self._inc("redrawn")
        self._inc("draws")
        ask = self._ask(ticket)
        return await self._call(lambda: pools.draw(pool_of(request), ask))

    async def _session_for(self, request: Request, ticket: str = "") -> Drawn:
        """An active session for *request* (see the module docstring).

        Raises:
            SessionError: pinned to an unknown session; the logins of
                :data:`MAX_LOGIN_FAILURES` sessions failed.
        """
        try:
            drawn = await self._first(request, ticket)
        except ValueError as exc:  # not a session id
            raise SessionError(f"{request.url}: {exc}", "session/unknown") from None
        failures, waited = 0, 0.0
        while drawn.state != "active":
            if drawn.state == "retired":
                failures += 1
                if failures >= MAX_LOGIN_FAILURES:
                    raise SessionError(f"{request.url}: the logins of {failures} sessions of "
                                       f"pool {pool_of(request)!r} failed",
                                       "session/login_failed")
                self._inc("redrawn")
                drawn = await self._call(lambda: self.pools().draw(pool_of(request)))
                continue
            if drawn.state in ("new", "relogin"):
                drawn = await self._login(drawn, request)
                continue
            # a leased request goes back to the frontier while the login runs (deferred, it
            # holds no download slot); another waits here, as a closing worker's does (at
            # FLEET_DRAIN_TIMEOUT its leases go back to the frontier, the request with them;
            # a failed record here would lose it)
            if self._deferrable(request):
                return Drawn(drawn.id, "wait", drawn.generation)
            if not waited:
                self._inc("waits")
            waited = min(POLL, waited * 2 or 0.05)
            await asyncio.sleep(waited)
            drawn = await self._call(functools.partial(self.pools().state, drawn.id))
        return drawn

    async def _login(self, drawn: Drawn, request: Request) -> Drawn:
        """Log *drawn* in if this worker wins its claim; its state after (``wait``: another
        worker's login, or this worker's for another request, is running)."""
        pools = self.pools()
        running = self._logins.get(drawn.id)
        if running is not None and self._deferrable(request):
            return Drawn(drawn.id, "wait", drawn.generation)
        if running is not None:
            await asyncio.shield(running)
            return await self._call(lambda: pools.state(drawn.id))
        claim = await self._call(lambda: pools.claim(drawn.id, self.worker))
        if claim.state != "claimed":
            return claim
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._logins[drawn.id] = done
        try:
            view = SessionView(drawn.id, pool_of(request), claim.generation)
            ok, reason = await run_login(self.crawler, view)
            after = await self._call(lambda: pools.done(drawn.id, self.worker, ok, reason))
        finally:
            del self._logins[drawn.id]
            done.set_result(None)
        if after.state == "active":
            self._inc("logins")
            logger.info("session %s logged in (generation %d)", drawn.id, after.generation)
        elif after.state == "retired":
            self._inc("login_failed")
            self._inc("retired/" + reason)
            logger.warning("session %s retired: its login failed (%s)", drawn.id, reason)
        return after if after.state != "lost" else Drawn(drawn.id, "wait", after.generation)

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Request | Response:
        self._give_back(request)  # (its cookies were merged at 700, before this)
        meta = request.meta
        sid = meta.get("fleet_session")
        if not sid or meta.get("fleet_session_login") or not uses_sessions(request):
            return response
        pools = self.pools()
        sid, generation = str(sid), int(meta.get("fleet_session_generation", 0))
        if response.status in self.config.sessions.retire_statuses:
            reason = f"status/{response.status}"
            if await self._call(lambda: pools.retire(sid, reason)):
                self._inc("retired/" + reason)
            return self._retry(request, response, redraw=True)
        check = spider_hook(self.crawler.spider, "fleet_session_check")
        if check is None or not 200 <= response.status < 300:
            return response
        if passes(check, response):
            if (sid, generation) not in self._passed:
                self._passed.add((sid, generation))
                await self._call(lambda: pools.passed(sid, generation))
            return response
        self._inc("check_failed")
        if pools.login:
            after = await self._call(lambda: pools.relogin(sid, generation))
            if after.state == "retired":
                self._inc("retired/check")
            return self._retry(request, response, redraw=after.state == "retired")
        if await self._call(lambda: pools.retire(sid, "check")):
            self._inc("retired/check")
        return self._retry(request, response, redraw=True)

    def _retry(self, request: Request, response: Response,
               redraw: bool) -> Request | Response:
        """*request* once more (on its session's next generation, or on another session
        when *redraw*); after :data:`MAX_RETRIES` its answer goes on as it is."""
        retries = int(request.meta.get("fleet_session_retries", 0))
        if retries >= MAX_RETRIES:
            self._inc("kept")
            return response
        self._inc("retried")
        retry = request.replace(dont_filter=True)
        retry.meta["fleet_session_retries"] = retries + 1
        if redraw:
            for key in ("fleet_session", "fleet_session_generation", "cookiejar", EXIT_META):
                retry.meta.pop(key, None)
        return retry


class FleetSessionsSpiderMiddleware:
    """Requests yielded from a session's response, to the same pool, keep that session
    (``FLEET_SESSION_INHERIT``); see the module docstring."""

    def __init__(self, inherit: bool) -> None:
        self.inherit = inherit
        self.inherited = 0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSessionsSpiderMiddleware:
        config = FleetConfig.from_settings(crawler.settings).sessions
        if not (config.enabled and config.inherit):
            raise NotConfigured("no session pools, or FLEET_SESSION_INHERIT is False")
        mw = cls(config.inherit)
        mw.stats = crawler.stats
        return mw

    stats: Any = None

    def _pin(self, response: Response, x: Any) -> Any:
        parent = getattr(response, "request", None)
        if not isinstance(x, Request) or parent is None:
            return x
        sid = parent.meta.get("fleet_session")
        if not sid or parent.meta.get("fleet_session_login") or "fleet_session" in x.meta \
                or "cookiejar" in x.meta or x.meta.get("dont_merge_cookies"):
            return x
        if "fleet_session_pool" in x.meta:
            if pool_of(x) != pool_of(parent):
                return x
        elif urlparse_cached(x).hostname != urlparse_cached(parent).hostname:
            return x  # another site: its own pool
        elif "fleet_session_pool" in parent.meta:
            x.meta["fleet_session_pool"] = parent.meta["fleet_session_pool"]
        x.meta["fleet_session"] = sid
        if self.stats is not None:
            self.stats.inc_value(_STAT + "inherited")
        return x

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Any = None) -> Iterable[Any]:
        for x in result:
            yield self._pin(response, x)

    async def process_spider_output_async(self, response: Response, result: AsyncIterator[Any],
                                          spider: Any = None) -> AsyncIterator[Any]:
        async for x in result:
            yield self._pin(response, x)
