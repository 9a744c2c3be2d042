"""Sitemaps' ``<lastmod>`` for the recrawl (docs/recrawl.md): a tracked URL that a sitemap
says was modified after its last fetch is due at once.

``FleetSitemapLastmod`` (spider middleware, enabled by the add-on with ``FLEET_RECRAWL``) notes
the entries of each sitemap a ``SitemapSpider`` parses as the spider parses it (its own reading
and parsing, once: engine_hooks.on_sitemap_entries) and gives each request the spider yields
for a ``<loc>`` with a ``<lastmod>`` the private meta :data:`LASTMOD_META_KEY` (epoch
seconds, never stored with the request).  The scheduler pushes it with the request
(frontier/book.py): a URL the Bloom filter knows and the schedule holds is made due at once
when the lastmod is newer than its last fetch + 1 s (lua/step_revisit.lua).  A sitemap is a
tracked page itself: it is fetched again at its own interval, and a changed one yields its
links (and their lastmods) again.

Stats: ``fleet/recrawl/lastmod`` (requests given one), ``fleet/recrawl/lastmod_invalid``
(a ``<lastmod>`` that is not a W3C datetime, or more than a day ahead: ignored).
"""

from __future__ import annotations

import datetime
import re
import weakref
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured

from scrapy_fleet import engine_hooks
from scrapy_fleet.recrawl.settings import recrawl_config

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response

#: private meta (not stored with the request, codec.PRIVATE_META_PREFIX): the sitemap
#: ``<lastmod>`` of a request, epoch seconds
LASTMOD_META_KEY = "_fleet_lastmod"

#: a lastmod further ahead than this (seconds) is a site's error: ignored (it would make the
#: URL due at every fetch of its sitemap)
FUTURE_SLACK = 86400

# W3C datetime (https://www.w3.org/TR/NOTE-datetime): YYYY, YYYY-MM, YYYY-MM-DD,
# YYYY-MM-DDThh:mm[:ss[.s]]TZD; also what sitemaps write besides: a space for the T, no TZD
# (UTC), +hhmm / +hh, lowercase t / z
_W3C = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?"
    r"\s*([Zz]|[+-]\d{2}(?::?\d{2})?)?)?)?)?")


def parse_lastmod(text: str | None, now: float | None = None) -> int | None:
    """*text* (a sitemap's ``<lastmod>``) as epoch seconds (UTC when it has no zone), or None
    when it is not a W3C datetime, is before 1970, or more than :data:`FUTURE_SLACK` ahead of
    *now* (default: the clock).  Never raises."""
    m = _W3C.fullmatch((text or "").strip())
    if m is None:
        return None
    year, month, day, hour, minute, second, _, zone = m.groups()
    tz = datetime.timezone.utc
    if zone and zone not in "Zz":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
        if offset >= datetime.timedelta(hours=24):
            return None
        tz = datetime.timezone(sign * offset)
    try:
        at = datetime.datetime(int(year), int(month or 1), int(day or 1), int(hour or 0),
                               int(minute or 0), int(second or 0), tzinfo=tz)
    except ValueError:
        return None
    seconds = int(at.timestamp())
    limit = (now if now is not None else datetime.datetime.now().timestamp()) + FUTURE_SLACK
    return seconds if 0 < seconds <= limit else None


class Lastmods:
    """The ``<lastmod>`` of one sitemap's entries, added one by one (:meth:`add`): ``found``
    ``{<loc> as a Request URL: epoch seconds}`` and ``invalid``, how many were not valid
    (:func:`parse_lastmod`, against the clock when the first was added)."""

    __slots__ = ("found", "invalid", "now")

    def __init__(self) -> None:
        self.found: dict[str, int] = {}
        self.invalid = 0
        self.now = datetime.datetime.now().timestamp()

    def add(self, entry: dict[str, Any]) -> None:
        from w3lib.url import safe_url_string

        loc, text = entry.get("loc"), entry.get("lastmod")
        if not loc or text is None:
            return
        at = parse_lastmod(text, self.now)
        if at is None:
            self.invalid += 1
        else:
            self.found[safe_url_string(loc)] = at


def sitemap_lastmods(body: bytes) -> tuple[dict[str, int], int]:
    """``{<loc> as a Request URL: lastmod}`` of a sitemap (urlset or sitemapindex) *body*, and
    how many ``<lastmod>`` were invalid.  A body that is not a sitemap gives ({}, 0).  (For
    tools and tests: a worker notes the entries of the spider's own parse instead.)"""
    from scrapy.utils.sitemap import Sitemap

    try:
        entries = list(Sitemap(body))
    except Exception:  # (lxml: what the spider itself will report as an invalid sitemap)
        return {}, 0
    lastmods = Lastmods()
    for entry in entries:
        lastmods.add(entry)
    return lastmods.found, lastmods.invalid


class FleetSitemapLastmod:
    """Spider middleware: requests a ``SitemapSpider`` yields from a sitemap carry their
    ``<lastmod>`` (module docstring).  Raises NotConfigured when ``FLEET_RECRAWL`` is off."""

    def __init__(self, crawler: Crawler) -> None:
        from scrapy import signals

        self.crawler = crawler
        #: response -> the lastmods of the sitemap the spider parsed from it, until the
        #: requests it yielded are marked
        self._found: weakref.WeakKeyDictionary[Any, Lastmods] = weakref.WeakKeyDictionary()
        crawler.signals.connect(self._opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetSitemapLastmod:
        if not recrawl_config(crawler.settings).enabled:
            raise NotConfigured("FLEET_RECRAWL is off")
        return cls(crawler)

    def _opened(self, spider: Any) -> None:
        engine_hooks.on_sitemap_entries(spider, self._note)

    def _note(self, response: Response, entry: dict[str, Any]) -> None:
        """An entry of the sitemap the spider is parsing from *response*."""
        lastmods = self._found.get(response)
        if lastmods is None:
            lastmods = self._found[response] = Lastmods()
        lastmods.add(entry)

    def _lastmods(self, response: Response) -> dict[str, int]:
        lastmods = self._found.pop(response, None)
        if lastmods is None:
            return {}
        if lastmods.invalid and self.crawler.stats is not None:
            self.crawler.stats.inc_value("fleet/recrawl/lastmod_invalid", lastmods.invalid)
        return lastmods.found

    def _mark(self, x: Any, found: dict[str, int]) -> Any:
        from scrapy import Request

        if isinstance(x, Request) and x.url in found:
            x.meta[LASTMOD_META_KEY] = found[x.url]
            if self.crawler.stats is not None:
                self.crawler.stats.inc_value("fleet/recrawl/lastmod")
        return x

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Any = None) -> Iterable[Any]:
        found = self._lastmods(response)
        for x in result:
            yield self._mark(x, found) if found else x

    async def process_spider_output_async(self, response: Response, result: AsyncIterator[Any],
                                          spider: Any = None) -> AsyncIterator[Any]:
        found = self._lastmods(response)
        async for x in result:
            yield self._mark(x, found) if found else x
