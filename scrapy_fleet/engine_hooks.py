"""The only place that touches Scrapy engine internals (checked against Scrapy 2.13-2.19).

Scrapy has no signal for "this request's callback output is fully handled".  The engine
keeps every request it got from the scheduler in ``engine._slot.inprogress`` until its
download, its callback, the scheduling of the requests it yielded (``engine.crawl`` is
synchronous into ``Scheduler.enqueue_request``) and the item pipelines of the items it yielded
are all done, and then calls ``engine._slot.remove_request(request)``.  That call is the
fleet's acknowledgement point.  Redirects and other requests returned by downloader
middlewares go through ``engine.crawl`` before the original is removed, too.

The second hook wakes the engine when leases arrive, instead of waiting for its 5 s heartbeat.
Pushed start requests meet the spider middlewares' ``process_start`` through the middleware
manager's method list (:func:`process_start`), as the engine's start requests do.
The crawl tests (tests/e2e/test_crawl.py: every page acknowledged once, children before their
parent's ack, the idle worker woken at once) fail if a Scrapy release changes either one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.crawler import Crawler

from scrapy_fleet.errors import FleetError

if TYPE_CHECKING:
    from scrapy_fleet.frontier.ledger import LeaseLedger


class UnsupportedScrapyError(FleetError, RuntimeError):
    """This Scrapy's engine lacks the internals the fleet hooks into."""


def _engine_slot(crawler: Crawler) -> Any:
    engine = crawler.engine
    slot = getattr(engine, "_slot", None)
    if slot is None or not callable(getattr(slot, "remove_request", None)) or not hasattr(
            slot, "nextcall"):
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot hook into this Scrapy's engine (no _slot.remove_request); "
            "supported: Scrapy 2.13 to 2.19")
    return slot


def on_request_done(crawler: Crawler, callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(request)`` each time the engine has finished with a request.

    Must be called while the engine slot exists (from ``Scheduler.open``).  Returns a
    function that removes the hook.

    Raises:
        UnsupportedScrapyError: the engine has no slot with ``remove_request``.
    """
    slot = _engine_slot(crawler)
    original = slot.remove_request

    def remove_request(request: Any) -> None:
        try:
            callback(request)
        finally:
            original(request)

    slot.remove_request = remove_request

    def uninstall() -> None:
        if slot.remove_request is remove_request:
            slot.remove_request = original

    return uninstall


def running_engine(crawler: Crawler | None) -> Any:
    """The crawler's engine, or None before it exists (Scrapy 2.19's ``Crawler.engine``
    raises RuntimeError then)."""
    if crawler is None:
        return None
    try:
        return crawler.engine
    except RuntimeError:
        return None


def active_downloads(crawler: Crawler | None) -> int:
    """Requests the crawler's downloader is downloading now (0 when no engine runs)."""
    downloader = getattr(running_engine(crawler), "downloader", None)
    return len(getattr(downloader, "active", ()) or ())


def engine_closing(crawler: Crawler | None) -> bool:
    """Has the crawler's running engine begun to close its spider (SIGTERM, idle close,
    ``CloseSpider``)?  False when no engine runs."""
    slot = getattr(running_engine(crawler), "_slot", None)
    return slot is not None and getattr(slot, "closing", None) is not None


async def download(crawler: Crawler, request: Any) -> Any:
    """*request* downloaded through the downloader middlewares only (redirects followed),
    as Scrapy's robots.txt middleware fetches robots.txt: ``engine.download_async``
    (Scrapy >= 2.14), else the Deferred of ``engine.download``.  Returns the Response.

    Raises:
        Exception: the download's own error (a Twisted/HTTP error, ``IgnoreRequest``).
    """
    from scrapy.utils.defer import maybe_deferred_to_future

    engine = crawler.engine
    if hasattr(engine, "download_async"):
        return await engine.download_async(request)
    return await maybe_deferred_to_future(engine.download(request))  # pragma: no cover


def scheduler_of(crawler: Crawler | None) -> Any:
    """The scheduler of the crawler's running engine, or None."""
    slot = getattr(running_engine(crawler), "_slot", None)
    return getattr(slot, "scheduler", None)


#: crawler -> (the lease ledger its fleet scheduler published (frontier/ledger.py), that
#: scheduler)
_LEDGERS: weakref.WeakKeyDictionary[Any, tuple[LeaseLedger, Any]] = weakref.WeakKeyDictionary()


def publish_ledger(crawler: Crawler, ledger: LeaseLedger, scheduler: Any = None) -> None:
    """Called once by the fleet's scheduler when it opens: *ledger* (its lease book) is what
    :func:`ledger_of` gives the crawler's other components while *scheduler* (default: the
    ledger itself) is the running engine's scheduler."""
    _LEDGERS[crawler] = (ledger, ledger if scheduler is None else scheduler)


def ledger_of(crawler: Crawler | None) -> LeaseLedger | None:
    """The lease ledger of the crawler's running engine: the one its scheduler published,
    when that is the fleet's; None otherwise (no engine yet, closed, or another
    scheduler)."""
    if crawler is None:
        return None
    published = _LEDGERS.get(crawler)
    if published is None or scheduler_of(crawler) is not published[1]:
        return None
    return published[0]


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to call ``next_request()`` soon (no-op once the engine is closing)."""
    engine = crawler.engine
    slot = getattr(engine, "_slot", None)
    if slot is not None and getattr(slot, "closing", None) is None:
        slot.nextcall.schedule()


def wrap_fetch(crawler: Crawler, wrapper: Callable[..., Any]) -> Callable[[], None]:
    """Route the engine's downloads through ``wrapper(fetch, request, *args)``, which returns
    a Deferred like ``engine.downloader.fetch`` (the downloader middleware chain and the
    download) does: the one place stages hook in (stages/roles.py).  The engine gives each
    request it got from the scheduler to ``downloader.fetch`` (Scrapy 2.13 to 2.19).

    Returns a function that undoes it.

    Raises:
        UnsupportedScrapyError: the engine has no ``downloader.fetch``.
    """
    downloader: Any = getattr(running_engine(crawler), "downloader", None)
    original = getattr(downloader, "fetch", None)
    if original is None:
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot hook into this Scrapy's downloader (no engine.downloader."
            "fetch); FLEET_ROLE needs Scrapy 2.13 or later")

    def fetch(request: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, request, *args, **kwargs)

    downloader.fetch = fetch

    def uninstall() -> None:
        if downloader.fetch is fetch:
            downloader.fetch = original

    return uninstall


def gate_sends(crawler: Crawler, gate: Callable[[Any], Any]) -> Callable[[], None]:
    """Make every download wait for ``await gate(request)`` right before its handler sends it
    (after the downloader middlewares and the downloader slot's queue: nothing is between it
    and the wire), the crawl control's hold (frontier/control.py).  Scrapy 2.19 calls
    ``downloader.handlers.download_request_async(request)``; 2.13 to 2.18
    ``download_request(request[, spider])``, which returns a Deferred.

    Returns a function that undoes it.

    Raises:
        UnsupportedScrapyError: the engine's downloader has neither.
    """
    from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future

    handlers: Any = getattr(getattr(running_engine(crawler), "downloader", None), "handlers",
                            None)
    name = next((n for n in ("download_request_async", "download_request")
                 if callable(getattr(handlers, n, None))), None)
    if name is None:
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot hook into this Scrapy's download handlers (no "
            "downloader.handlers.download_request); supported: Scrapy 2.13 to 2.19")
    original = getattr(handlers, name)

    async def gated(request: Any, *args: Any, **kwargs: Any) -> Any:
        await gate(request)
        result = original(request, *args, **kwargs)
        return await (result if name == "download_request_async"
                      else maybe_deferred_to_future(result))

    def send(request: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "download_request_async":
            return gated(request, *args, **kwargs)
        return deferred_from_coro(gated(request, *args, **kwargs))

    setattr(handlers, name, send)

    def uninstall() -> None:
        if getattr(handlers, name, None) is send:
            setattr(handlers, name, original)

    return uninstall


def on_scrape(crawler: Crawler, callback: Callable[[Any, Any], None]) -> Callable[[], None]:
    """Call ``callback(result, request)`` each time the downloader hands a final result to the
    scraper: a Response, or the Failure of a download that failed for good (after the
    downloader middlewares, retries included, and whichever middleware raised it).

    Scrapy has no signal for a failed download; the engine hands every final result to
    ``engine.scraper.enqueue_scrape(result, request)`` (Scrapy 2.13-2.19), which this wraps.
    Must be called while the engine exists (``spider_opened``).  Returns a function that
    removes the hook.  *callback* must not raise (its exceptions are logged and ignored).

    Raises:
        UnsupportedScrapyError: the engine has no scraper with ``enqueue_scrape``.
    """
    scraper: Any = getattr(running_engine(crawler), "scraper", None)
    original = getattr(scraper, "enqueue_scrape", None)
    if not callable(original):
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot hook into this Scrapy's scraper (no enqueue_scrape); "
            "supported: Scrapy 2.13 to 2.19")

    def enqueue_scrape(result: Any, request: Any) -> Any:
        try:
            callback(result, request)
        except Exception:  # never lose a response to the bookkeeping of failures
            import logging

            logging.getLogger(__name__).exception("Fleet failure bookkeeping failed")
        return original(result, request)

    wrapped = "enqueue_scrape" in vars(scraper)  # another hook's, installed before
    scraper.enqueue_scrape = enqueue_scrape

    def uninstall() -> None:
        if scraper.enqueue_scrape is enqueue_scrape:
            if wrapped:
                scraper.enqueue_scrape = original
            else:
                del scraper.enqueue_scrape

    return uninstall


#: crawler attribute: why its process must exit with a non-zero status
_FAILED_ATTR = "_fleet_exit_failure"


def fail_exit_status(crawler: Crawler, reason: str) -> None:
    """Make ``scrapy crawl`` exit with status 1 once this crawl is over (*reason*: why, kept
    as ``crawler._fleet_exit_failure``; the first reason is kept).

    Scrapy sets a non-zero exit status only when a crawl "failed to bootstrap", which it
    decides after the crawl by ``not crawler.spider`` (``CrawlerProcess._crawl`` and
    ``AsyncCrawlerProcess._done``, Scrapy 2.13-2.19).  So once the spider is closed (its
    ``spider_closed`` handlers have been called, the stats dumped) the crawler's spider is
    dropped, on the next turn of the event loop.  In a process that runs crawls otherwise
    (``CrawlerRunner``, tests) nothing else changes.
    """
    import asyncio

    from scrapy import signals

    if getattr(crawler, _FAILED_ATTR, None):
        return
    setattr(crawler, _FAILED_ATTR, reason)

    def drop_spider() -> None:
        crawler.spider = None

    def spider_closed() -> None:
        asyncio.get_event_loop().call_soon(drop_spider)

    crawler.signals.connect(spider_closed, signal=signals.spider_closed, weak=False)


def close_spider(crawler: Crawler, reason: str) -> Any:
    """Ask the running engine to close the spider with *reason*; returns the asyncio task
    (None when no engine runs or it is closing already)."""
    import asyncio

    engine = running_engine(crawler)
    if engine is None or getattr(engine, "spider", None) is None:
        return None

    async def close() -> None:
        try:
            closer = getattr(engine, "close_spider_async", None)  # Scrapy >= 2.14
            if closer is not None:
                await closer(reason=reason)
            else:
                from scrapy.utils.defer import maybe_deferred_to_future

                await maybe_deferred_to_future(engine.close_spider(engine.spider, reason))
        except Exception:
            import logging

            logging.getLogger(__name__).exception("Could not close the spider (%s)", reason)

    return asyncio.ensure_future(close())


def _middleware_manager(crawler: Crawler) -> Any:
    scraper = getattr(running_engine(crawler), "scraper", None)
    manager = getattr(scraper, "spidermw", None)
    if manager is None or not hasattr(manager, "methods"):
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot reach this Scrapy's spider middlewares (no engine.scraper."
            "spidermw.methods); supported: Scrapy 2.13 to 2.19")
    return manager


async def process_start(crawler: Crawler, requests: list[Any], skip: type) -> list[Any]:
    """Pass *requests* through the spider middlewares' start hook as Scrapy passes the
    spider's start requests (``SpiderMiddlewareManager.process_start``, Scrapy 2.13-2.19:
    each middleware's ``process_start(start)``, an async iterator in and out, from the
    innermost to the outermost), leaving out the middlewares that are instances of *skip*.
    Returns everything the chain yields (requests and items), in order; it is empty when the
    middlewares dropped them all.

    Raises:
        UnsupportedScrapyError: the engine has no spider middleware manager.
        Exception: whatever a middleware raises.
    """
    import inspect

    manager = _middleware_manager(crawler)

    async def source() -> Any:
        for request in requests:
            yield request

    start: Any = source()
    for method in manager.methods.get("process_start", ()):
        if isinstance(getattr(method, "__self__", None), skip):
            continue
        start = method(start)
        if inspect.isawaitable(start):  # as Scrapy's _process_chain allows
            start = await start
    return [output async for output in start]


async def process_start_item(crawler: Crawler, item: Any) -> None:
    """Send *item*, yielded by a start hook (:func:`process_start`), to the item pipelines as
    the engine sends an item of the spider's ``start()`` (no response); returns once they
    are done with it (``Scraper.start_itemproc_async``, Scrapy 2.14+; ``start_itemproc``
    before).

    Raises:
        UnsupportedScrapyError: the engine has no scraper that takes items.
    """
    from scrapy.utils.defer import maybe_deferred_to_future

    scraper = getattr(running_engine(crawler), "scraper", None)
    process = getattr(scraper, "start_itemproc_async", None)
    if callable(process):
        await process(item, response=None)
        return
    process = getattr(scraper, "start_itemproc", None)
    if not callable(process):
        raise UnsupportedScrapyError(
            "scrapy_fleet cannot hand a start item to this Scrapy's item pipelines (no "
            "engine.scraper.start_itemproc); supported: Scrapy 2.13 to 2.19")
    await maybe_deferred_to_future(process(item, response=None))


#: SitemapSpider's own reading of a sitemap's body (Scrapy 2.11+), and the attribute that
#: says it is wrapped (:func:`on_sitemap_entries`)
_SITEMAP_BODY, _SITEMAP_NOTE_ATTR = "_get_sitemap_body", "_fleet_sitemap_note"


def on_sitemap_entries(spider: Any, note: Callable[[Any, dict[str, Any]], None]) -> bool:
    """Have *note(response, entry)* called with each entry (a dict: ``loc``, ``lastmod``...)
    of each sitemap *spider* parses, while it parses it: a ``SitemapSpider``'s own
    ``_parse_sitemap`` (Scrapy 2.11+) reads the body with ``_get_sitemap_body`` (an XML
    response's body, a gzipped one gunzipped within ``download_maxsize`` and warned of past
    ``download_warnsize``, the body of a URL ending in ``.xml`` or ``.xml.gz``) and passes
    the parsed entries through ``sitemap_filter``, in one synchronous call.  Both are wrapped
    on the instance (once), so that a sitemap is read and parsed once, by the spider.  False
    when *spider* is not a SitemapSpider.

    Raises:
        FleetError: this Scrapy's SitemapSpider has no such method (not a supported Scrapy).
    """
    from scrapy.spiders import SitemapSpider

    if not isinstance(spider, SitemapSpider):
        return False
    if getattr(spider, _SITEMAP_NOTE_ATTR, None) is not None:
        return True
    read = getattr(spider, _SITEMAP_BODY, None)
    if read is None:
        raise FleetError("scrapy_fleet cannot read this Scrapy's sitemaps (no "
                         "SitemapSpider._get_sitemap_body); use a supported Scrapy release")
    reading: list[Any] = [None]  # the response whose body the spider read last
    own_filter = spider.sitemap_filter

    def get_sitemap_body(response: Any) -> bytes | None:
        reading[0] = response
        return read(response)  # type: ignore[no-any-return]

    def sitemap_filter(entries: Any) -> Any:
        response, reading[0] = reading[0], None

        def noted() -> Any:
            for entry in entries:
                if response is not None:
                    note(response, entry)
                yield entry
        return own_filter(noted())

    setattr(spider, _SITEMAP_BODY, get_sitemap_body)
    spider.sitemap_filter = sitemap_filter  # type: ignore[method-assign]
    setattr(spider, _SITEMAP_NOTE_ATTR, note)
    return True


#: the command :func:`running_command` found at its first call (a one-item list: found)
_COMMAND: list[str | None] = []


def running_command() -> str | None:
    """The ``scrapy`` command this process runs (``crawl``, ``fleet``...), or None when it is
    not run by Scrapy's command line.

    Scrapy's command line (``scrapy.cmdline.execute``, 2.13-2.19) instantiates the class of
    every command of the ``scrapy.commands`` entry points at each run, whatever the command,
    before it parses the arguments: so the fleet's command class is built by ``scrapy crawl``
    too, and this is how it learns which command runs (the first argument that is not an
    option, as Scrapy picks it).  Scrapy then pops that name from ``sys.argv``, so the answer
    of the first call (the fleet command's ``__init__``) is kept for the later ones (the
    add-on's).
    """
    import sys

    if _COMMAND:
        return _COMMAND[0]
    argv = sys.argv
    if not argv or not argv[0].replace("\\", "/").endswith(("scrapy", "scrapy/__main__.py")):
        return None
    names = [a for a in argv[1:] if not a.startswith("-")]
    _COMMAND.append(names[0] if names else None)
    return _COMMAND[0]
