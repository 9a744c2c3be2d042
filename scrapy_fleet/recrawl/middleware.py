"""The recrawl's worker side (docs/recrawl.md): conditional GET and the outcome of a fetch.

``FleetRecrawlMiddleware`` (downloader middleware, order 540: after the retries (550) and
redirects (600) are decided and the body is decompressed (590)) is enabled by the add-on
when ``FLEET_RECRAWL`` is not ``off``:

* ``process_request``: a revisit (its request carries its state, meta ``fleet_rv``) sends
  the validators of the version it saw, verbatim: ``If-None-Match`` (the ETag) and
  ``If-Modified-Since`` (the Last-Modified the server sent; RFC 9110: If-None-Match wins);
* ``process_response``: a 304 to a revisit is *unchanged*: it does not reach the callback
  (``RevisitUnchanged``, an ``IgnoreRequest``, so no failure is recorded; nor does it reach
  the request's errback: it is a success) unless the request's meta has
  ``fleet_recrawl_unchanged = True``.  A 2xx reaches the callback: its outcome waits for
  the callback's items (:class:`Outcome`, settled by recrawl/items.py: changed when the
  page's item set changed; a page without items by its text signature, signature.py),
  noted meanwhile as its text says (what stays if the callback's output is never seen).
  XML (a sitemap, a feed) is decided here by a hash of its bytes, as a 304: an unchanged
  one does not reach the callback.  The new state and the next interval
  (recrawl/schedule.py) go to the scheduler (``LeaseLedger.note_revisit``), which writes
  them with the request's acknowledgement (after the callback's output is handled).
  404/410 ``FLEET_RECRAWL_GONE_AFTER`` times in a row drop a URL from the schedule; other
  final answers and download errors keep it scheduled at its interval (its failure is
  recorded like any request's).

``FleetRecrawlItems`` (spider middleware, recrawl/items.py) settles the outcome by the items
and sends the items of changed pages only.

An invalid ``meta["fleet_recrawl"]`` (neither False nor seconds > 0: None, 0, NaN, "abc") is
one WARNING naming the URL and the value; the page is processed and tracked at the default
interval (``fleet/recrawl/invalid_meta``).

Stats: ``fleet/recrawl/{tracked,changed,unchanged,not_modified,gone,dropped,failed,invalid_meta,
items_unchanged}``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest, NotConfigured

from scrapy_fleet import engine_hooks
from scrapy_fleet.errors import FleetError
from scrapy_fleet.recrawl.budget import HostBudgets, history_bucket
from scrapy_fleet.recrawl.items import (
    PENDING_META_KEY,
    UNCHANGED_META_KEY,
    VERSION_META_KEY,
    FleetRecrawlItems,
)
from scrapy_fleet.recrawl.schedule import (
    CHANGED,
    FAILED,
    FIRST,
    GONE,
    NOT_MODIFIED,
    RECRAWL_META_KEY,
    STATE_META_KEY,
    UNCHANGED,
    State,
    invalid_wanted,
    next_interval,
    observe,
    opted_out,
    wanted_interval,
)
from scrapy_fleet.recrawl.settings import RecrawlConfig, recrawl_config
from scrapy_fleet.recrawl.signature import is_data, response_signature, same_version

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = [
    "UNCHANGED_META_KEY",
    "FleetRecrawlItems",
    "FleetRecrawlMiddleware",
    "Outcome",
    "RevisitUnchanged",
]

logger = logging.getLogger(__name__)


class RevisitUnchanged(FleetError, IgnoreRequest):
    """A revisit found the page unchanged (304, or the same signature): neither its callback
    nor its errback is called (recorded as a revisit, not a failure)."""


def _header(response: Response, name: bytes) -> str | None:
    value = response.headers.get(name)
    return value.decode("latin-1") if value else None


class FleetRecrawlMiddleware:
    """Downloader middleware of the recrawl (module docstring).  Raises NotConfigured when
    ``FLEET_RECRAWL`` is ``off``."""

    def __init__(self, crawler: Crawler, config: RecrawlConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        #: the hosts' budgets (adaptive with FLEET_RECRAWL_BUDGET > 0), made at the first use
        self.budgets: HostBudgets | None = None
        self._budgeted = config.mode == "adaptive" and config.budget > 0
        if self._budgeted:
            from scrapy import signals

            crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetRecrawlMiddleware:
        config = recrawl_config(crawler.settings)
        if not config.enabled:
            raise NotConfigured("FLEET_RECRAWL is off")
        return cls(crawler, config)

    async def _closed(self, spider: Spider | None = None) -> None:
        if self.budgets is None:
            return
        budgets, self.budgets = self.budgets, None
        await budgets.close()
        await budgets.client.aclose()

    def _budgets(self) -> HostBudgets | None:
        """The hosts' budgets, None when off (or before the spider is known)."""
        if not self._budgeted or self.crawler.spider is None:
            return None
        if self.budgets is None:
            from scrapy_fleet import redis_client
            from scrapy_fleet.config import FleetConfig

            fleet = FleetConfig.from_settings(self.crawler.settings)
            keys = fleet.crawl_keys(self.crawler.spider.name)
            client = redis_client.make_client(fleet.redis_url, fleet.redis_timeout,
                                              is_async=True)
            self.budgets = HostBudgets(fleet, keys, client)
        return self.budgets

    def _host(self, request: Request) -> str:
        from scrapy_fleet.politeness.hosts import host_key

        return host_key(request.url, self.config.host_key)

    def _bucket(self, request: Request, state: State | None) -> tuple[int, float] | None:
        """The budget bucket *state* counts in now and its rate (None: not counted: no
        budget, a first visit, or a page with its own interval)."""
        if not self._budgeted or state is None or state.fetched <= 0 \
                or wanted_interval(request.meta) is not None:
            return None
        return history_bucket(state.history, self.config.for_host(self._host(request)).interval)

    def inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"fleet/recrawl/{name}")

    @staticmethod
    def _state(request: Request) -> State | None:
        """The state of a revisit (None for a first visit, or a request redirected from its
        URL: the target is another page)."""
        if request.meta.get("redirect_urls"):
            return None
        return State.from_meta(request.meta.get(STATE_META_KEY))

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if opted_out(request.meta):
            return
        state = self._state(request)
        if state is None:
            return
        if state.etag and b"If-None-Match" not in request.headers:
            request.headers[b"If-None-Match"] = state.etag.encode("latin-1")
        if state.last_modified and b"If-Modified-Since" not in request.headers:
            request.headers[b"If-Modified-Since"] = state.last_modified.encode("latin-1")

    def schedule(self, request: Request, state: State | None,
                  old: tuple[int, float] | None = None) -> tuple[int, float] | None:
        """Note *state* (None: not revisited) for *request*'s acknowledgement at its next
        interval, moving the page from budget bucket *old*; returns the bucket it counts in
        now."""
        if state is not None and invalid_wanted(request.meta):
            self.inc("invalid_meta")
            logger.warning("Invalid meta[%r]=%r for %s (False, or seconds > 0): tracked at "
                           "the default interval", RECRAWL_META_KEY,
                           request.meta[RECRAWL_META_KEY], request.url,
                           extra={"crawler": self.crawler})
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is None:
            return old
        budgets = self._budgets()
        if state is None:
            if ledger.note_revisit(request, None) and budgets is not None and old is not None:
                budgets.move(self._host(request), old, None)
                budgets.maybe_sync()
                return None
            return old
        config = self.config
        host = self._host(request) if config.host_intervals or budgets is not None else ""
        if config.host_intervals:
            config = config.for_host(host)
        wanted = wanted_interval(request.meta)
        price = budgets.price(host) if budgets is not None else None
        prior = budgets.prior(host) if budgets is not None else None
        interval = next_interval(config, state, wanted, price, prior)
        state.interval = interval
        noted = ledger.note_revisit(request, state.to_meta(), float(interval))
        if budgets is not None and noted:
            new = None if wanted is not None else history_bucket(state.history, config.interval)
            budgets.move(host, old, new)
            budgets.maybe_sync()
            return new
        return old

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        if opted_out(request.meta):
            self.schedule(request, None)
            return response
        state = self._state(request)
        old = self._bucket(request, state)
        status = response.status
        now = int(time.time())
        if status == 304 and state is not None:
            observe(state, now, changed=False)
            state.gone, state.last = 0, NOT_MODIFIED
            state.etag = _header(response, b"ETag") or state.etag
            state.last_modified = _header(response, b"Last-Modified") or state.last_modified
            self.schedule(request, state, old)
            self.inc("not_modified")
            return self._unchanged(request, response, state)
        if 200 <= status < 300:
            outcome = Outcome(self, request, response, state, old, now)
            if not is_data(response):
                request.meta[PENDING_META_KEY] = outcome  # settled by FleetRecrawlItems
                return response
            changed = outcome.settle(None)
            request.meta[VERSION_META_KEY] = outcome.version()
            if not changed:
                return self._unchanged(request, response, outcome.state)
            return response
        if state is None:
            return response  # a first visit that failed: not tracked
        if status in (404, 410):
            state.gone, state.last = state.gone + 1, GONE
            if state.gone >= self.config.gone_after:
                self.inc("gone")
                self.schedule(request, None, old)
                return response
        else:
            state.last = FAILED
            self.inc("failed")
        # kept at its interval (its history unchanged: this fetch saw no version)
        self._keep(request, state)
        return response

    def _keep(self, request: Request, state: State) -> None:
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is not None:
            interval = state.interval or max(1, round(self.config.interval))
            ledger.note_revisit(request, state.to_meta(), float(interval))

    def _unchanged(self, request: Request, response: Response, state: State) -> Response:
        if request.meta.get(UNCHANGED_META_KEY):
            request.meta[VERSION_META_KEY] = (state.fetched, state.signature or 0)
            return response
        # A revisit that found the page unchanged is a success, not a failure: the request's
        # errback is not called (as for a request the dupefilter drops).  Scrapy calls the
        # errback with an IgnoreRequest raised here, so the request (done: an unchanged
        # revisit is final, never retried) loses its errback first; without an errback the
        # scraper drops an IgnoreRequest silently.
        request.errback = None
        raise RevisitUnchanged(f"revisit of {request.url}: unchanged")

    def process_exception(self, request: Request, exception: BaseException,
                          spider: Spider | None = None) -> None:
        if isinstance(exception, IgnoreRequest) or opted_out(request.meta):
            return None  # a decision (robots.txt, offsite, given back): not rescheduled here
        state = self._state(request)
        if state is not None:
            state.last = FAILED
            self.inc("failed")
            self._keep(request, state)
        return None



class Outcome:
    """The outcome of a 2xx fetch of a tracked page (recrawl/items.py ``PendingOutcome``):
    noted at once as its text signature says, settled by the callback's items."""

    def __init__(self, mw: FleetRecrawlMiddleware, request: Request, response: Response,
                 state: State | None, old: tuple[int, float] | None, now: int) -> None:
        self.mw, self.request, self.now = mw, request, now
        self.first = state is None
        self.before = State() if state is None else replace(state, history=list(state.history))
        self.before.etag = _header(response, b"ETag")
        self.before.last_modified = _header(response, b"Last-Modified")
        self.before.gone = 0
        self.text = response_signature(response, mw.config.near_duplicates)
        self.settled = False
        self.bucket = old
        self.changed = self._note(self.text, mw.config.near_duplicates)

    def _note(self, signature: int, near: bool) -> bool:
        state = replace(self.before, history=list(self.before.history))
        old = state.signature
        changed = self.first or (not same_version(old, signature) if near
                                 else old != signature)
        observe(state, self.now, changed)
        state.signature = signature
        state.last = FIRST if self.first else CHANGED if changed else UNCHANGED
        self.state = state
        self.bucket = self.mw.schedule(self.request, state, self.bucket)
        return changed

    def settle(self, digest: int | None) -> bool:
        if not self.settled:
            self.settled = True
            if digest is not None:
                self.changed = self._note(digest, near=False)
            self.mw.inc("tracked" if self.first else "changed" if self.changed
                         else "unchanged")
        return self.changed

    def version(self) -> tuple[int, int]:
        return self.now, self.state.signature or 0
