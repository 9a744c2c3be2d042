"""``FleetFailureWatch``: notices the requests that fail for good and files their records.

Enabled by ``scrapy_fleet.Addon`` (``EXTENSIONS``).  It watches:

* every final download result (``engine_hooks.on_scrape``): the Failure of a download that
  failed after the retries, whichever middleware raised it (an ``IgnoreRequest`` counts only
  when it carries a ``fleet_reason``, like ``proxies.ProxyBanError``: robots.txt and offsite
  refusals are decisions, not failures), and a Response whose status the spider does not
  handle, decided by Scrapy's own ``HttpErrorMiddleware`` (when it is enabled): the one that
  would raise ``HttpError`` for it, errback or not;
* ``spider_error``: a callback or errback that raised;
* ``item_error``: an item pipeline that raised (anything but ``DropItem``) for an item the
  callback yielded: its request fails (``item/<exception class>``), as its item was not
  written; the request's other items were written (sinks are idempotent: a retry writes
  them again).  Every item error counts in ``fleet/items/failed``.

The first failure of a request is kept (an errback that raises after a failed download does
not replace the download's reason).  The scheduler sends the record with the request's
acknowledgement (``FleetScheduler.note_failure``), so it is stored exactly once, or not at
all when the request is not acknowledged (its lease was lost: another worker fetches it).
Stats: ``fleet/failed/noted``, ``fleet/failed/noted/<reason>`` and ``fleet/items/failed``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.misc import build_from_crawler
from twisted.python.failure import Failure

from scrapy_fleet import engine_hooks
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.failures.record import FailureRecord, reason_for
from scrapy_fleet.politeness import hosts as politeness

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_HTTPERROR = "scrapy.spidermiddlewares.httperror.HttpErrorMiddleware"


def _httperror_enabled(crawler: Crawler) -> bool:
    from scrapy.utils.conf import build_component_list

    listed = build_component_list(crawler.settings.getwithbase("SPIDER_MIDDLEWARES"))
    return any(c == _HTTPERROR or getattr(c, "__module__", "") + "." + getattr(
        c, "__qualname__", "") == _HTTPERROR for c in listed)


class FleetFailureWatch:
    """See module docstring."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        from scrapy.spidermiddlewares.httperror import HttpErrorMiddleware

        self.crawler = crawler
        self.config = config
        self._uninstall: Any = None
        self._httperror = build_from_crawler(HttpErrorMiddleware, crawler) \
            if _httperror_enabled(crawler) else None
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)
        crawler.signals.connect(self._spider_error, signal=signals.spider_error)
        crawler.signals.connect(self._item_error, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetFailureWatch:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def _opened(self, spider: Any) -> None:
        self._uninstall = engine_hooks.on_scrape(self.crawler, self._scraped)

    def _closed(self, spider: Any) -> None:
        if self._uninstall is not None:
            self._uninstall()
            self._uninstall = None

    # -- what failed ----------------------------------------------------------------------

    def _scraped(self, result: Any, request: Request) -> None:
        if isinstance(result, Failure):
            exc = result.value
            if exc is None or (isinstance(exc, IgnoreRequest)
                               and not getattr(exc, "fleet_reason", None)):
                return
            response = getattr(exc, "response", None)
            status = response.status if isinstance(response, Response) else 0
            self._note(request, reason_for(exc, "download"), str(exc) or type(exc).__name__,
                       status)
        elif isinstance(result, Response) and self._httperror is not None \
                and not 200 <= result.status < 300:
            from scrapy.spidermiddlewares.httperror import HttpError

            if result.request is None:
                result.request = request
            try:
                self._httperror.process_spider_input(result)
            except HttpError:
                self._note(request, f"http/{result.status}",
                           f"HTTP status {result.status} not handled", result.status)

    def _spider_error(self, failure: Failure, response: Any, spider: Any) -> None:
        request = getattr(response, "request", None)
        if request is None:
            return
        exc = failure.value
        if exc is None:
            return
        status = response.status if isinstance(response, Response) else 0
        self._note(request, reason_for(exc, "spider"), str(exc) or type(exc).__name__, status)

    def _item_error(self, item: Any, response: Any, spider: Any, failure: Failure) -> None:
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("fleet/items/failed")
        # the item's source: a Response, or the Failure an errback got (Scrapy sets its
        # .request); an item from start() has none, and no request to fail
        request = getattr(response, "request", None)
        exc = failure.value
        if request is None or exc is None:
            return
        status = response.status if isinstance(response, Response) else 0
        self._note(request, reason_for(exc, "item"),
                   f"item not written: {type(exc).__name__}: {exc}", status)

    def _note(self, request: Request, reason: str, message: str, status: int) -> None:
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is None:
            return
        record = FailureRecord(
            url=request.url, method=request.method, reason=reason, message=message,
            status=int(status or 0), attempts=int(request.meta.get("retry_times", 0) or 0) + 1,
            worker=self.config.worker_id,
            host=politeness.host_key(request.url, self.config.politeness.host_key))
        if ledger.note_failure(request, record.encode()):
            stats = self.crawler.stats
            if stats is not None:
                stats.inc_value("fleet/failed/noted")
                stats.inc_value(f"fleet/failed/noted/{reason}")
            logger.debug("Request failed for good (%s, %d attempt(s)): <%s %s>", reason,
                         record.attempts, request.method, request.url,
                         extra={"spider": self.crawler.spider})
