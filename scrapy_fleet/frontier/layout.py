"""The layout version of a crawl's keys: a crawl written by another layout is refused at start.

A crawl's first frontier call (its first push or first worker call) writes the crawl marker
and, with it, ``keys.LAYOUT_VERSION`` into the crawl's ``layout`` key (lua/step_begin.lua).  A
crawl that holds frontier keys but no layout key was written before the key existed (layout
1: the queue ZSET and the ``ehost`` hash), one with another value by another version of the
package: neither is migrated, both are refused with one line that says what to do.
"""

from __future__ import annotations

from typing import Any

from scrapy_fleet.errors import FleetError
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys


class CrawlLayoutError(FleetError, RuntimeError):
    """The crawl's keys were written by another layout of the package (see the module)."""


def _frontier_keys(keys: CrawlKeys) -> list[str]:
    """Keys only a crawl's frontier writes (any of them: the crawl has begun); the queue ZSET
    and ``ehost`` hash of layout 1 by their names (no CrawlKeys attribute builds them now)."""
    return [keys.marker, keys.seq, keys.data, keys.leases, keys.queue_count, keys.queue_index,
            *keys.layout1_keys()]


def _verdict(keys: CrawlKeys, layout: Any, begun: int) -> CrawlLayoutError | None:
    if layout is None and not begun:
        return None  # a new crawl (its first call writes the version)
    if isinstance(layout, bytes):
        layout = layout.decode(errors="replace")
    if layout == str(LAYOUT_VERSION):
        return None
    found = "no layout version" if layout is None else f"layout version {layout}"
    return CrawlLayoutError(
        f"crawl {keys.crawl_id!r} in Redis was written by another version of scrapy-fleet "
        f"({found}; this version reads layout {LAYOUT_VERSION}): finish it with the version "
        f"that started it, or delete it with `scrapy fleet purge`")


def check_sync(client: Any, keys: CrawlKeys) -> None:
    """Refuse a crawl of another layout (blocking client; two commands, three when the crawl
    has begun without a layout: read once more, as a first call writes the layout with the
    keys it creates, atomically, and may have run between the first two).

    Raises:
        CrawlLayoutError: naming the crawl and what to do.
    """
    layout = client.get(keys.layout)
    begun = 0 if layout is not None else client.exists(*_frontier_keys(keys))
    if begun:  # begun between the two reads (another worker's first call)? read it again
        layout = client.get(keys.layout)
    error = _verdict(keys, layout, begun)
    if error is not None:
        raise error


async def check_async(client: Any, keys: CrawlKeys) -> None:
    """:func:`check_sync` with an asyncio client."""
    layout = await client.get(keys.layout)
    begun = 0 if layout is not None else await client.exists(*_frontier_keys(keys))
    if begun:
        layout = await client.get(keys.layout)
    error = _verdict(keys, layout, begun)
    if error is not None:
        raise error
