"""The recrawl's spider middleware (docs/recrawl.md, "What changed"): a revisit changed when
what the spider extracts changed.

``FleetRecrawlItems`` (spider middleware, order 950: next to the spider, before the other
middlewares and the pipelines) sees the output of the callback of every tracked page fetched
with a 2xx.  Requests pass at once (the links are followed on every visit); the items are
held until the callback's output ends (sync or async), then the page's item set is signed
(signature.py ``items_digest``, the ``FLEET_RECRAWL_IGNORE_FIELDS`` left out) and the fetch's
outcome is settled by the downloader middleware's :class:`PendingOutcome`: *changed* when the
digest differs from the last visit's (a page without items: its text signature decides).
The settled state is what the page's acknowledgement writes (one frontier call, atomically
with the lease's end).  The held items go to the pipelines when the page changed (or a first
visit), or always with ``FLEET_RECRAWL_ITEMS = "all"`` or ``meta["fleet_recrawl_unchanged"]``;
else they are counted (``fleet/recrawl/items_unchanged``) and dropped.  A callback that raises
settles the outcome on the text and lets the items it yielded go on.

Items sent carry ``fleet_fetched_at`` (ISO 8601, UTC) and ``fleet_signature`` (16 hex digits:
the digest compared) where the item accepts them (a dict, or an Item with those fields).
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from scrapy.exceptions import NotConfigured

from scrapy_fleet.recrawl.settings import recrawl_config
from scrapy_fleet.recrawl.signature import item_digest, items_digest

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

#: meta: True sends a revisit's items to the pipelines even when unchanged, and calls the
#: callback for a 304 too (add 304 to handle_httpstatus_list)
UNCHANGED_META_KEY = "fleet_recrawl_unchanged"
#: private meta: (fetch time, signature) of the version a response is (decided before the
#: callback: a 304 passed on, XML)
VERSION_META_KEY = "_fleet_rv_version"
#: private meta: the :class:`PendingOutcome` of a 2xx fetch, settled by the items
PENDING_META_KEY = "_fleet_rv_pending"


class PendingOutcome(Protocol):
    """A 2xx fetch of a tracked page whose outcome waits for its callback's items."""

    @property
    def settled(self) -> bool:
        """True once :meth:`settle` ran."""

    def settle(self, digest: int | None) -> bool:
        """Decide the outcome from the item set's *digest* (None: no item, the page's text
        decides) and note the page's state for its acknowledgement; returns True when the
        page changed (or was visited for the first time).  Idempotent."""

    def version(self) -> tuple[int, int]:
        """(fetch time, unix seconds; signature) of the version settled."""


def _stamp(item: Any, version: tuple[int, int]) -> Any:
    from itemadapter import ItemAdapter, is_item

    if not is_item(item):
        return item
    adapter = ItemAdapter(item)
    at = datetime.datetime.fromtimestamp(version[0], datetime.timezone.utc).isoformat()
    try:
        adapter["fleet_fetched_at"] = at
        adapter["fleet_signature"] = f"{version[1] & 0xFFFFFFFFFFFFFFFF:016x}"
    except KeyError:
        pass  # an Item without these fields
    return item


#: fields the middleware writes itself, never compared
_OWN_FIELDS = frozenset({"fleet_fetched_at", "fleet_signature"})


class _Page:
    """The items of one response's callback output, held until it ends."""

    def __init__(self, owner: FleetRecrawlItems, response: Response,
                 pending: PendingOutcome) -> None:
        self.owner = owner
        self.pending = pending
        self.send_all = owner.send_all or bool(response.meta.get(UNCHANGED_META_KEY))
        self.held: list[Any] = []
        self.digests: list[int] = []

    def take(self, x: Any) -> bool:
        """Hold *x* when it is an item (True), else let it pass (False)."""
        from itemadapter import is_item

        if not is_item(x):
            return False
        self.held.append(x)
        self.digests.append(item_digest(x, self.owner.ignore))
        return True

    def release(self, failed: bool = False) -> Iterator[Any]:
        """The held items to send, once the outcome is settled (*failed*: the callback
        raised: settled on the text, the items sent)."""
        digest = None if failed or not self.digests else items_digest(self.digests)
        changed = self.pending.settle(digest)
        if changed or failed or self.send_all:
            version = self.pending.version()
            for item in self.held:
                yield _stamp(item, version)
        elif self.held:
            self.owner.inc("items_unchanged", len(self.held))


class FleetRecrawlItems:
    """Spider middleware: settles a tracked page's outcome by its items and sends the items
    of changed pages only (module docstring)."""

    def __init__(self, crawler: Crawler) -> None:
        config = recrawl_config(crawler.settings)
        self.stats: StatsCollector | None = crawler.stats
        self.send_all = config.items == "all"
        self.ignore = config.ignore_fields | _OWN_FIELDS

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetRecrawlItems:
        if not recrawl_config(crawler.settings).enabled:
            raise NotConfigured("FLEET_RECRAWL is off")
        return cls(crawler)

    def inc(self, name: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"fleet/recrawl/{name}", count)

    def _page(self, response: Response) -> _Page | None:
        pending = response.meta.get(PENDING_META_KEY) if response.request else None
        if pending is None or pending.settled:
            return None
        return _Page(self, response, pending)

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Any = None) -> Iterable[Any]:
        page = self._page(response)
        if page is None:
            version = response.meta.get(VERSION_META_KEY) if response.request else None
            for x in result:
                yield _stamp(x, version) if version else x
            return
        try:
            for x in result:
                if not page.take(x):
                    yield x
        except Exception:
            yield from page.release(failed=True)
            raise
        yield from page.release()

    async def process_spider_output_async(self, response: Response,
                                          result: AsyncIterator[Any],
                                          spider: Any = None) -> AsyncIterator[Any]:
        page = self._page(response)
        if page is None:
            version = response.meta.get(VERSION_META_KEY) if response.request else None
            async for x in result:
                yield _stamp(x, version) if version else x
            return
        try:
            async for x in result:
                if not page.take(x):
                    yield x
        except Exception:
            for item in page.release(failed=True):
                yield item
            raise
        for item in page.release():
            yield item

    def process_spider_exception(self, response: Response, exception: BaseException,
                                 spider: Any = None) -> None:
        """A callback that raised before yielding: the outcome is settled on the text."""
        pending = response.meta.get(PENDING_META_KEY) if response.request else None
        if pending is not None and not pending.settled:
            pending.settle(None)
        return None
