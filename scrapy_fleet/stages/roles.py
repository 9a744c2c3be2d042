"""What ``FLEET_ROLE`` changes in a worker: fetch workers store responses, parse workers
parse stored ones (docs/stages.md).

Both roles hook one place, the engine's ``downloader.fetch`` (engine_hooks.wrap_fetch):

* **fetch**: a leased request is downloaded through the whole downloader middleware chain
  (politeness, proxies, retries, redirects, cookies); its final response is encoded
  (stages/records.py) and attached to the request's lease as a push of host ``~parse``, so
  the acknowledgement of the request and the stored response reach Redis in one atomic
  frontier call.  The engine then gets the response with a request whose callback does
  nothing (and that lets every status through), so no spider code runs here: the callback
  and its spider middlewares run in the parse worker.  A download failure (no response) runs
  the request's errback here.  Responses that cannot be stored are parsed here instead: a
  live page in meta (``playwright_include_page``), meta that cannot be encoded, or a record
  bigger than ``FLEET_MAX_STORED_RESPONSE`` (unless ``FLEET_LARGE_RESPONSE = "fail"``).
* **parse** (and **all**, for stored responses it leases): the scheduler decodes the stored
  response with its request; the hook returns it instead of downloading, so neither the
  downloader middlewares nor the site see it again, and Scrapy's scraper runs the callback
  (or errback) through the spider middlewares.  The stored response's entry is acknowledged
  with the requests its callback yielded, in one call, when the engine is done with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.internet import defer

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.browser import pagemethods
from scrapy_fleet.errors import FleetError, RequestEncodeError
from scrapy_fleet.stages import records

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_fleet.config import FleetConfig

logger = logging.getLogger(__name__)

#: meta key of a leased request whose response is stored (set by the scheduler, never stored)
STORED_META_KEY = codec.PRIVATE_META_PREFIX + "stored"


class StoredResponseTooLarge(FleetError, IgnoreRequest):
    """A fetch worker's response is bigger than ``FLEET_MAX_STORED_RESPONSE`` and
    ``FLEET_LARGE_RESPONSE = "fail"``: the request's errback gets this failure."""

    fleet_reason = "response_too_large"


def _stored(response: Response, **kwargs: Any) -> list[Any]:
    """The callback of a response a fetch worker stored: its parse worker runs the real one."""
    return []


class StageScheduler(Protocol):
    """What the hook needs of the worker's lease book (frontier/book.py's ``LeaseBook``,
    which the scheduler builds it with), so that this module does not import it back."""

    config: FleetConfig
    crawler: Crawler
    spider: Spider | None

    def inc(self, key: str, count: int = 1) -> None:
        """Add *count* to the Scrapy stat *key*."""

    def holds_lease(self, request: Request) -> bool:
        """True while *request* is one of this worker's leases."""

    def lost_lease(self, request: Request) -> bool:
        """True when *request* was one of this worker's leases and that lease is lost."""

    def attach_stored(self, request: Request, payload: bytes) -> None:
        """Send *payload* (a stored response) with the acknowledgement of *request*."""


class StageRole:
    """The hook of one worker (see module docstring); built by the scheduler at open."""

    def __init__(self, scheduler: StageScheduler) -> None:
        self.scheduler = scheduler
        self.config = scheduler.config.stages
        self.role = self.config.role
        self._logged: set[str] = set()
        self._uninstall: Any = None
        #: the response queue (stored responses, bytes) as of the last frontier call
        self.response_queue = (0, 0)
        #: a fetch worker leases nothing while True
        self.queue_full = False

    def install(self) -> None:
        self._uninstall = engine_hooks.wrap_fetch(self.scheduler.crawler, self._fetch)

    def uninstall(self) -> None:
        if self._uninstall is not None:
            self._uninstall()
            self._uninstall = None

    def note_response_queue(self, queue: tuple[int, int]) -> None:
        """A fetch worker stops leasing while the response queue is full
        (``FLEET_RESPONSE_QUEUE_MAX`` stored responses or ``FLEET_RESPONSE_QUEUE_BYTES``) and
        goes on below 90 % of both: back pressure from the parse workers."""
        self.response_queue = queue
        if self.role != "fetch":
            return
        count, size = queue
        full = (count >= self.config.response_queue_max
                or size >= self.config.response_queue_bytes)
        low = (count < 0.9 * self.config.response_queue_max
               and size < 0.9 * self.config.response_queue_bytes)
        if full and not self.queue_full:
            self.scheduler.inc("fleet/stages/response_queue_full")
            logger.info("Response queue full (%d stored, %d bytes): this fetch worker leases "
                        "no more until the parse workers catch up", count, size,
                        extra={"spider": self.scheduler.spider})
        if full:
            self.queue_full = True
        elif low:
            self.queue_full = False

    def _fetch(self, fetch: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
        stored = request.meta.pop(STORED_META_KEY, None)
        if isinstance(stored, records.StoredResponse):
            self.scheduler.inc("fleet/stages/parsed_stored")
            self.scheduler.inc("fleet/stages/parsed_stored_bytes", stored.size)
            return defer.succeed(stored.response(request))
        d = fetch(request, *args, **kwargs)
        if self.role == "fetch":
            d.addCallback(self._store, request)
        return d

    def _parse_here(self, why: str, message: str, request: Request) -> None:
        self.scheduler.inc(f"fleet/stages/parsed_locally/{why}")
        if why not in self._logged:
            self._logged.add(why)
            logger.warning("Fetch worker parses <%s %s> itself: %s (logged once)",
                           request.method, request.url, message,
                           extra={"spider": self.scheduler.spider})

    def _store(self, result: Any, request: Request) -> Any:
        if isinstance(result, Response) and self.scheduler.lost_lease(request):
            # leased again elsewhere (this worker stalled past FLEET_LEASE_TIMEOUT): its new
            # holder fetches and stores it; parsed here, its page would be itemised twice
            self.scheduler.inc("fleet/stages/lease_lost")
            if result.request is None:
                result.request = request
            if pagemethods.close_page_of(result.request.meta):
                self.scheduler.inc("fleet/browser/page_closed")
            return self._stub(result)
        if not isinstance(result, Response) or not self.scheduler.holds_lease(request):
            return result  # a redirect or retry (a Request), or not a leased request
        if result.request is None:
            result.request = request
        if result.request.meta.get("playwright_include_page"):
            self._parse_here("live_page", "its browser page is kept open for the callback "
                             "(playwright_include_page)", request)
            return result
        try:
            payload = records.encode(result, self.scheduler.spider)
        except RequestEncodeError as exc:
            self._parse_here("unencodable", str(exc), request)
            return result
        if len(payload) > self.config.max_stored_response:
            if self.config.large_response == "fail":
                self.scheduler.inc("fleet/stages/too_large")
                raise StoredResponseTooLarge(
                    f"response of {request.url} is {len(payload)} bytes stored, over "
                    f"FLEET_MAX_STORED_RESPONSE={self.config.max_stored_response}")
            self._parse_here("too_large", f"{len(payload)} bytes stored is over "
                             f"FLEET_MAX_STORED_RESPONSE={self.config.max_stored_response}",
                             request)
            return result
        self.scheduler.attach_stored(request, payload)
        self.scheduler.inc("fleet/stages/stored")
        self.scheduler.inc("fleet/stages/stored_bytes", len(payload))
        return self._stub(result)

    @staticmethod
    def _stub(result: Response) -> Response:
        """*result* with a request whose callback does nothing (every status let through):
        the engine finishes it here, the spider's callback runs in a parse worker."""
        request = result.request
        assert request is not None
        stub = request.replace(callback=_stored, errback=None, cb_kwargs={},
                               meta={**request.meta, "handle_httpstatus_all": True})
        return result.replace(request=stub)
