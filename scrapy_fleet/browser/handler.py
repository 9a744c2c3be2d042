"""What ``FLEET_PLAYWRIGHT = True`` makes the add-on set, and the abort rule for resources.

With it, the add-on sets (at the add-on's priority, so the project's own values win):

* ``DOWNLOAD_HANDLERS`` for ``http`` and ``https``: scrapy-playwright's
  ``ScrapyPlaywrightDownloadHandler`` (only requests with ``meta["playwright"] = True`` open a
  browser page; the others are downloaded by Scrapy's own handler, as scrapy-playwright does);
* ``TWISTED_REACTOR``: the asyncio reactor scrapy-playwright needs (Scrapy's default since 2.13);
* ``PLAYWRIGHT_ABORT_REQUEST``: :class:`AbortResources` of ``FLEET_PLAYWRIGHT_ABORT`` (default
  images, media and fonts).  A browser's own sub-requests bypass Scrapy's downloader
  middlewares and so the fleet's politeness; aborting what a scraper rarely needs keeps
  them few.  scrapy-playwright counts what is aborted (stat
  ``playwright/request_count/aborted``).

Launch options (``PLAYWRIGHT_LAUNCH_OPTIONS``, ``PLAYWRIGHT_BROWSER_TYPE``, contexts) stay the
project's own settings.  See docs/browser.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scrapy.settings import BaseSettings

#: the scrapy-playwright download handler installed for http and https
HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Playwright's resource types (``Request.resource_type``), from its API documentation
RESOURCE_TYPES = frozenset({
    "document", "stylesheet", "image", "media", "font", "script", "texttrack", "xhr", "fetch",
    "eventsource", "websocket", "manifest", "other",
})
DEFAULT_ABORT = ("image", "media", "font")


class AbortResources:
    """``PLAYWRIGHT_ABORT_REQUEST`` predicate: True (abort) for a browser sub-request whose
    Playwright ``resource_type`` is one of *types*.  The page's own document is never
    aborted."""

    def __init__(self, types: Iterable[str]) -> None:
        self.types = frozenset(types) - {"document"}

    def __call__(self, request: Any) -> bool:
        return getattr(request, "resource_type", None) in self.types

    def __repr__(self) -> str:
        return f"AbortResources({sorted(self.types)!r})"


def abort_types(value: Any) -> Any:
    """``FLEET_PLAYWRIGHT_ABORT`` as a list: a comma-separated string is split; any other value
    is returned as it is (browser/settings.py validates it)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def install(settings: BaseSettings, abort: Iterable[str], priority: str = "addon") -> None:
    """Set the handlers, the reactor and the abort rule (see module docstring) on *settings*,
    unless the project already set them at a higher priority."""
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        if scheme not in handlers:
            handlers[scheme] = HANDLER
    settings.set("DOWNLOAD_HANDLERS", handlers, priority)
    settings.set("TWISTED_REACTOR", ASYNCIO_REACTOR, priority)
    settings.set("PLAYWRIGHT_ABORT_REQUEST", AbortResources(abort), priority)
