"""``FleetProxyMiddleware``: every request through an exit of the fleet's pool, chosen in
Redis, judged after the answer (docs/proxies.md).

Order 585 (the add-on's): its ``process_request`` runs after the politeness middleware (560)
and before Scrapy's ``HttpProxyMiddleware`` (750), which turns ``meta["proxy"]`` into the
``Proxy-Authorization`` header; its ``process_response`` sees the answer after redirects
(600) and decompression (590), before the politeness back-off (560) and Scrapy's retries
(550); its ``process_exception`` sees a failure before the politeness middleware, so a dead
proxy never puts the *site* on hold.

It never sets ``download_slot``: Scrapy's slot and the fleet's politeness stay keyed by the
site, so a site's rate and concurrency caps hold whatever exits carry the traffic.

Meta keys: ``fleet_proxy_session`` (in: sticky session key), ``fleet_proxy_exit`` (set:
``"<exit id>|<ticket>"``, ticket 0 once judged), ``fleet_proxy_retries`` (set: exits that
banned or failed the request so far), ``fleet_proxy_tried`` (set: their ids, which the
next choice avoids while another exit may carry it), ``fleet_proxy_timeouts`` (set).
A ``meta["proxy"]`` set by the user (without ``fleet_proxy_exit``) wins: the request goes as
the user says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from scrapy_fleet import engine_hooks, redis_client
from scrapy_fleet.codec import LEASE_META_KEY
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.politeness.hosts import host_key
from scrapy_fleet.proxies import EXIT_META, ProxyBanError
from scrapy_fleet.proxies.pool import (
    Choice,
    Gone,
    ProxyPool,
    Report,
    Wait,
    describe,
    host_port,
)
from scrapy_fleet.proxies.verdicts import Verdict, VerdictRules, build_policy
from scrapy_fleet.sessions import SessionError
from scrapy_fleet.sessions.pool import EXIT_META as SESSION_EXIT_META
from scrapy_fleet.sessions.pool import ExitBindings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_fleet.frontier.ledger import LeaseLedger

logger = logging.getLogger(__name__)

SESSION_META = "fleet_proxy_session"
RETRIES_META = "fleet_proxy_retries"
TIMEOUTS_META = "fleet_proxy_timeouts"
TRIED_META = "fleet_proxy_tried"
#: times a request's session lost its exit (retired); at MAX_EXITS_LOST it fails
EXITS_LOST_META = "fleet_session_exits_lost"
MAX_EXITS_LOST = 3
_STAT = "fleet/proxy/"
_REDIS_ERRORS = (redis.RedisError, ConnectionError, TimeoutError, OSError)
#: longest single sleep of a request waiting for an exit (it asks again after it)
MAX_WAIT_STEP = 5.0
#: seconds a verdict may wait for the next choice to carry it
REPORT_DELAY = 0.05
#: a waiting request checks this often (seconds) whether the worker drains
DRAIN_CHECK = 0.5
#: the pool has no exit that may carry a request (lua/proxies.lua's reasons): a WARNING,
#: repeated at most every NO_EXIT_LOG_EVERY seconds
NO_EXIT_WHY = {"dead": "every exit is dead", "empty": "no exit, or every one drained"}
NO_EXIT_LOG_EVERY = 60.0


def _exit_of(request: Request) -> tuple[str, int] | None:
    value = request.meta.get(EXIT_META)
    if not isinstance(value, str) or "|" not in value:
        return None
    pid, _, ticket = value.partition("|")
    return pid, int(ticket) if ticket.isdigit() else 0


def _fleet_session(request: Request) -> str:
    """The fleet session (pool) of *request*, "" none."""
    sid = request.meta.get("fleet_session")
    return sid if isinstance(sid, str) else ""


def _strip_proxy(request: Request) -> None:
    """Forget the exit of a previous attempt (its URL and credentials header)."""
    request.meta.pop("proxy", None)
    request.meta.pop("_auth_proxy", None)
    request.headers.pop(b"Proxy-Authorization", None)


class FleetProxyMiddleware:
    """Chooses an exit per request (one round trip) and reports its verdict.

    Stats: ``fleet/proxy/verdict/<ok|ban|rate_limited|proxy_dead|site_error>``,
    ``fleet/proxy/reason/<verdict>/<reason>``, ``fleet/proxy/chosen``, ``probes``,
    ``rechecks``, ``retries``, ``gave_up``, ``gave_up/<verdict>``, ``waits``,
    ``waits/<why>``, ``session/rebound``, ``user_proxy``, ``redis_errors``, ``roundtrips``.

    Raises:
        NotConfigured: neither ``FLEET_PROXIES`` nor ``FLEET_PROXY_POOL`` is set.
    """

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        if config.proxy is None or not config.proxy.enabled:
            raise NotConfigured("FLEET_PROXIES and FLEET_PROXY_POOL are not set")
        self.crawler = crawler
        self.config = config
        self.proxy = config.proxy
        self.rules = VerdictRules(config.proxy)
        self.policy = build_policy(config.proxy.ban_policy, crawler)
        self._pool: ProxyPool | None = None
        self._seeded: asyncio.Future[None] | None = None
        self._pending: list[Report] = []
        self._flush_task: asyncio.Task[None] | None = None
        self._last_wait_log: dict[tuple[str, str], float] = {}
        self._bindings: ExitBindings | None = None
        crawler.signals.connect(self._closed, signal=signals.spider_closed)
        crawler.signals.connect(self._downloaded, signal=signals.response_downloaded)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetProxyMiddleware:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    # -- helpers ---------------------------------------------------------------------------

    def _inc(self, key: str, n: int = 1) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(_STAT + key, n)

    def pool(self) -> ProxyPool:
        if self._pool is None:
            spider = self.crawler.spider
            assert spider is not None
            name = self.proxy.pool_name(self.config.resolve_crawl_id(spider.name))
            client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                              is_async=True)
            self._pool = ProxyPool(client, ProxyPoolKeys(self.config.key_prefix, name),
                                   self.proxy)
        return self._pool

    async def _ensure_seeded(self) -> None:
        if self._seeded is None:
            self._seeded = asyncio.get_running_loop().create_future()
            try:
                added = await self.pool().seed(self.proxy.proxies)
            except BaseException as exc:
                fut, self._seeded = self._seeded, None
                fut.set_exception(exc)
                fut.exception()  # retrieved: the next request tries again
                raise
            logger.info("Proxy pool %r: %d exit(s) in FLEET_PROXIES (%s), %d new to the pool",
                        self.pool().keys.pool, len(self.proxy.proxies),
                        ", ".join(describe(u) for u in self.proxy.proxies) or "none", added,
                        extra={"spider": self.crawler.spider})
            self._seeded.set_result(None)
        else:
            await asyncio.shield(self._seeded)

    def site(self, request: Request) -> str:
        return host_key(request.url, self.config.politeness.host_key)

    def _queue(self, report: Report) -> None:
        """Let *report* ride with the next choice, or go by itself within REPORT_DELAY."""
        self._pending.append(report)
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.ensure_future(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(REPORT_DELAY)
        await self._flush()

    async def _flush(self) -> None:
        reports, self._pending = self._pending, []
        if not reports:
            return
        try:
            self._inc("roundtrips")
            await self.pool().report(reports)
        except _REDIS_ERRORS as exc:
            self._inc("redis_errors")
            logger.warning("Proxy verdicts not stored (%s); they go with the next call", exc,
                           extra={"spider": self.crawler.spider})
            self._pending[:0] = reports

    async def _closed(self, spider: Any = None) -> None:
        if self._flush_task is not None and not self._flush_task.done():
            self._flush_task.cancel()
        if self._pool is not None:
            await self._flush()
            await self._pool.client.aclose()

    # -- choice ----------------------------------------------------------------------------

    async def process_request(self, request: Request, spider: Any = None) -> Request | None:
        previous = _exit_of(request)
        if previous is None and "proxy" in request.meta:
            self._inc("user_proxy")  # the user's own proxy (or None: direct) wins
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        if previous is not None:
            pid, ticket = previous
            if ticket:  # answered, but not judged here: a redirect (judged by its target)
                self._queue(Report(ticket, pid, self.site(request), "ok", True))
            _strip_proxy(request)
        while True:  # fail closed: without the pool, the request waits
            try:
                await self._ensure_seeded()
                break
            except _REDIS_ERRORS as exc:
                self._inc("redis_errors")
                self._log_wait("", "redis", f"Proxy pool unavailable ({exc}); requests wait "
                               "(never sent without a proxy)")
                await asyncio.sleep(1.0)
        site = self.site(request)
        fleet_session = _fleet_session(request)
        if fleet_session:
            choice = await self._session_choice(request, site, fleet_session)
            if isinstance(choice, Gone):
                return await self._exit_gone(request, fleet_session, choice.reason)
        else:
            session = request.meta.get(SESSION_META)
            choice = await self._choose(request, site, None if session is None else str(session))
            assert isinstance(choice, Choice)
        request.meta["proxy"] = choice.url
        request.meta[EXIT_META] = f"{choice.exit_id}|{choice.ticket}"
        self._inc("chosen")
        if choice.kind == 1:
            self._inc("probes")
            logger.info("Probing exit %s for %s with %s (its cool-down ended; one probe for "
                        "the fleet)", describe(choice.url), site, request.url,
                        extra={"spider": spider})
        elif choice.kind == 2:
            self._inc("rechecks")
            logger.info("Re-checking dead exit %s", describe(choice.url),
                        extra={"spider": spider})
        if choice.rebound:
            self._inc("session/rebound")
            logger.warning("Sticky session %r re-bound from exit %s to %s: the old exit may "
                           "not carry requests to %s now (banned, cooling down, dead, "
                           "drained or removed)", session, choice.rebound,
                           describe(choice.url), site, extra={"spider": spider})
        return None

    # -- fleet sessions bound to their exit (issue 32 item 3, docs/sessions.md) -------------

    def bindings(self) -> ExitBindings:
        if self._bindings is None:
            spider = self.crawler.spider
            assert spider is not None
            keys = CrawlKeys(self.config.key_prefix, self.config.resolve_crawl_id(spider.name))
            self._bindings = ExitBindings(self.pool().client, keys)
        return self._bindings

    async def _session_choice(self, request: Request, site: str, sid: str) -> Choice | Gone:
        """The exit of session *sid*: its bound exit (or :class:`Gone`), else the exit chosen
        for it now, bound to it in its record (the first binding of the fleet wins: when
        another worker's won, this choice is given back and the bound exit taken)."""
        bound = str(request.meta.get(SESSION_EXIT_META) or "")
        if bound:
            return await self._choose(request, site, None, only=bound)
        choice = await self._choose(request, site, None)
        assert isinstance(choice, Choice)
        while True:
            try:
                after = await self.bindings().bind(sid, choice.exit_id)
                break
            except _REDIS_ERRORS as exc:
                self._inc("redis_errors")
                self._log_wait(site, "redis", f"Binding session {sid} to its exit failed "
                               f"({exc}); the request waits")
                await asyncio.sleep(1.0)
        if after.state in ("retired", "unknown") or after.exit == choice.exit_id:
            if after.exit == choice.exit_id:
                self._inc("session/bound")
                return choice
            self._queue(Report(choice.ticket, choice.exit_id, site, "release", False))
            return Gone("retired")
        self._queue(Report(choice.ticket, choice.exit_id, site, "release", False))
        request.meta[SESSION_EXIT_META] = after.exit
        return await self._choose(request, site, None, only=after.exit)

    async def _retire_session(self, sid: str, reason: str) -> None:
        try:
            if await self.bindings().retire(sid, reason):
                self._inc(f"session/retired/{reason}")
                logger.warning("Session %s retired (%s): its exit can no longer carry it, and "
                               "a session is never re-bound", sid, reason,
                               extra={"spider": self.crawler.spider})
        except _REDIS_ERRORS as exc:  # its next request finds the exit gone again
            self._inc("redis_errors")
            logger.warning("Session %s not retired (%s): %s", sid, reason, exc,
                           extra={"spider": self.crawler.spider})

    async def _exit_gone(self, request: Request, sid: str, reason: str) -> Request:
        """Session *sid*'s exit can no longer carry *request*: the session is retired and
        the request goes back to the frontier, to draw another session of its pool (the
        sessions middleware redraws for a request pinned to a retired session); a login's
        request, or one whose sessions lost their exit :data:`MAX_EXITS_LOST` times, fails.

        Raises:
            SessionError: ``session/<reason>`` for a login's request, ``session/no_exit``.
        """
        if reason != "retired":
            await self._retire_session(sid, reason)
        _strip_proxy(request)
        request.meta.pop(EXIT_META, None)
        lost = int(request.meta.get(EXITS_LOST_META, 0) or 0) + 1
        if request.meta.get("fleet_session_login"):
            raise SessionError(f"{request.url}: the exit of session {sid} can no longer carry "
                               f"its login ({reason})", f"session/{reason}")
        if lost >= MAX_EXITS_LOST:
            self._inc("session/no_exit")
            raise SessionError(f"{request.url}: the sessions of {lost} draws lost their exit "
                               f"(last {sid}: {reason})", "session/no_exit")
        self._download_over(request)
        retry = request.replace(dont_filter=True)
        retry.meta[EXITS_LOST_META] = lost
        retry.meta.pop(SESSION_EXIT_META, None)
        retry.priority = request.priority + 1
        return retry

    async def _choose(self, request: Request, site: str, session: str | None,
                      only: str | None = None) -> Choice | Gone:
        """Ask until an exit is free: never sends the request without one (fail closed).

        While it waits the scheduler knows why (its heartbeat state ``no_exit`` when the
        pool has no exit that may carry it); once the worker drains (SIGTERM) a request
        that only waited is given back to the frontier at once (IgnoreRequest here; its
        lease released, never acknowledged), not waited on until FLEET_DRAIN_TIMEOUT."""
        ledger = engine_hooks.ledger_of(self.crawler)
        try:
            return await self._choose_or_wait(request, site, session, ledger, only)
        finally:
            if ledger is not None:
                ledger.note_exit_wait(request, None)

    async def _choose_or_wait(self, request: Request, site: str, session: str | None,
                              ledger: LeaseLedger | None,
                              only: str | None = None) -> Choice | Gone:
        while True:
            reports, self._pending = self._pending, []
            try:
                self._inc("roundtrips")
                tried = request.meta.get(TRIED_META)
                result = await self.pool().choose(
                    site, session, reports, tried if isinstance(tried, list) else None, only)
            except _REDIS_ERRORS as exc:
                self._pending[:0] = reports
                self._inc("redis_errors")
                self._log_wait(site, "redis", f"Proxy choice for {site} failed ({exc}); the "
                               "request waits (never sent without a proxy)")
                await asyncio.sleep(1.0)
                continue
            if isinstance(result, (Choice, Gone)):
                return result
            assert isinstance(result, Wait)
            self._inc("waits")
            self._inc(f"waits/{result.why}")
            if ledger is not None:
                ledger.note_exit_wait(request, result.why)
            if result.why in NO_EXIT_WHY:
                self._log_wait("*", "no_exit", f"No live exit in proxy pool "
                               f"{self.pool().keys.pool!r} ({NO_EXIT_WHY[result.why]}): "
                               f"requests wait (never sent without a proxy), e.g. to {site}; "
                               "`scrapy fleet proxies list` shows the exits, `proxies add` "
                               "adds some", level=logging.WARNING, every=NO_EXIT_LOG_EVERY)
            else:
                self._log_wait(site, result.why,
                               f"No exit may carry requests to {site} now ({result.why}); "
                               f"waiting {result.seconds:.1f} s (never sent without a proxy)")
            await self._sleep_unless_draining(min(max(result.seconds, 0.01), MAX_WAIT_STEP),
                                              request, ledger)

    async def _sleep_unless_draining(self, seconds: float, request: Request,
                                     ledger: LeaseLedger | None) -> None:
        """Sleep *seconds*, in steps of DRAIN_CHECK at most; once the worker drains, give
        *request* back to the frontier and raise IgnoreRequest (the engine drops it)."""
        until = time.monotonic() + seconds
        while True:
            if ledger is not None and ledger.draining and ledger.give_back(request):
                self._inc("given_back")
                logger.info("Worker draining: %s only waited for a proxy exit; its lease goes "
                            "back to the frontier", request.url,
                            extra={"spider": self.crawler.spider})
                raise IgnoreRequest("waited for a proxy exit while the worker drained: "
                                    "given back to the frontier")
            left = until - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, DRAIN_CHECK))

    def _log_wait(self, site: str, why: str, message: str, level: int = logging.INFO,
                  every: float = 30.0) -> None:
        """Log *message* at *level*, at most once per *every* seconds per (site, why)."""
        now = time.monotonic()
        if now - self._last_wait_log.get((site, why), -1e9) >= every:
            self._last_wait_log[(site, why)] = now
            logger.log(level, message, extra={"spider": self.crawler.spider})

    # -- verdicts --------------------------------------------------------------------------

    def _count(self, verdict: Verdict) -> None:
        self._inc(f"verdict/{verdict.kind}")
        self._inc(f"reason/{verdict.kind}/{verdict.reason}")

    def _judged(self, request: Request) -> tuple[str, int] | None:
        """The exit and ticket of a request carried by the pool and not judged yet."""
        current = _exit_of(request)
        if current is None or not current[1]:
            return None
        request.meta[EXIT_META] = f"{current[0]}|0"
        return current

    def _downloaded(self, response: Response, request: Request, spider: Any = None) -> None:
        """A 3xx is judged as it arrives (``response_downloaded``, before the middlewares):
        Scrapy's RedirectMiddleware (600) turns it into a new request this middleware never
        sees as an answer, and that request may be dropped as a duplicate."""
        if 300 <= response.status < 400:
            current = self._judged(request)
            if current is not None:
                self._count(Verdict("ok", f"status:{response.status}"))
                self._queue(Report(current[1], current[0], self.site(request), "ok", True))
                _strip_proxy(request)  # the redirect's copy (into the frontier) has no secret

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Request | Response:
        current = self._judged(request)
        if current is None:
            return response
        pid, ticket = current
        site = self.site(request)
        verdict = self.policy.response_verdict(request, response, site) or \
            self.rules.response_verdict(request, response)
        self._count(verdict)
        address = host_port(str(request.meta.get("proxy") or ""))
        _strip_proxy(request)  # copies (Scrapy's retries) carry no credentials
        report = Report(ticket, pid, site, verdict.kind, True)
        if verdict.kind in ("ban", "proxy_dead"):
            await self._report_now(report)
            await self._session_lost_exit(request, verdict)
            return self._retry_or_fail(request, verdict, f"{pid} {address}")
        self._queue(report)
        return response

    async def process_exception(self, request: Request, exception: BaseException,
                                spider: Any = None) -> Request | None:
        current = self._judged(request)
        if current is None:
            return None
        pid, ticket = current
        site = self.site(request)
        timed_out_elsewhere = int(request.meta.get(TIMEOUTS_META, 0) or 0) > 0
        verdict = self.policy.exception_verdict(request, exception, site) or \
            self.rules.exception_verdict(request, exception, timed_out_elsewhere)
        address = host_port(str(request.meta.get("proxy") or ""))
        _strip_proxy(request)
        if verdict is None:
            self._queue(Report(ticket, pid, site, "release", False))
            return None
        self._count(verdict)
        report = Report(ticket, pid, site, verdict.kind, False)
        if verdict.kind == "proxy_dead":
            await self._report_now(report)
            await self._session_lost_exit(request, verdict)
            if "Connect" not in verdict.reason and "Tunnel" not in verdict.reason and \
                    "Resolve" not in verdict.reason:
                request.meta[TIMEOUTS_META] = int(request.meta.get(TIMEOUTS_META, 0) or 0) + 1
            return self._retry_or_fail(request, verdict, f"{pid} {address}")
        self._queue(report)
        return None  # site_error: the politeness back-off and Scrapy's retries take it

    async def _session_lost_exit(self, request: Request, verdict: Verdict) -> None:
        """A ban (or a dead exit) on a fleet session's request retires the session at once
        (``exit_banned``/``exit_dead``): its retry draws another one, never through another
        exit with these cookies."""
        sid = _fleet_session(request)
        if sid:
            await self._retire_session(sid, "exit_banned" if verdict.kind == "ban"
                                       else "exit_dead")
            request.meta.pop(SESSION_EXIT_META, None)

    async def _report_now(self, report: Report) -> None:
        """A ban or a dead exit is known to the fleet before the request is retried."""
        reports, self._pending = [*self._pending, report], []
        try:
            self._inc("roundtrips")
            await self.pool().report(reports)
        except _REDIS_ERRORS as exc:
            self._inc("redis_errors")
            logger.warning("Proxy verdict not stored (%s); it goes with the next call", exc,
                           extra={"spider": self.crawler.spider})
            self._pending[:0] = reports

    def _retry_or_fail(self, request: Request, verdict: Verdict, exit_label: str) -> Request:
        retries = int(request.meta.get(RETRIES_META, 0) or 0)
        self._download_over(request)
        if retries >= self.proxy.max_retries:
            self._inc("gave_up")
            self._inc(f"gave_up/{verdict.kind}")
            reason = ("proxy_ban" if verdict.kind == "ban" else "proxy_dead") + ":max_retries"
            logger.warning("Gave up on %s: %s through %d exit(s) (last %s, %s)", request.url,
                           "banned" if verdict.kind == "ban" else "failed", retries + 1,
                           exit_label, verdict.reason, extra={"spider": self.crawler.spider})
            raise ProxyBanError(f"{request.url}: {verdict.kind} through {retries + 1} exit(s) "
                                f"(last {exit_label}, {verdict.reason})", fleet_reason=reason)
        self._inc("retries")
        retry = request.replace(dont_filter=True)
        retry.meta[RETRIES_META] = retries + 1
        pid = exit_label.split(" ", 1)[0]
        tried = [t for t in retry.meta.get(TRIED_META) or [] if isinstance(t, str)]
        retry.meta[TRIED_META] = [*tried, pid][-16:]
        retry.priority = request.priority + 1
        return retry

    def _download_over(self, request: Request) -> None:
        """The request's host slot goes back to the fleet now (the politeness middleware does
        it for answers it sees; a request retried here goes back to the frontier)."""
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None and request.meta.get(LEASE_META_KEY):
            ledger.download_over(request)
