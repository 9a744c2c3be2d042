"""A worker without ``FLEET_RECRAWL`` on a crawl that has a revisit schedule is refused at
start (docs/recrawl.md): it would fetch every due revisit as a plain GET (no validators, so
duplicate items) and acknowledge it without a record, which drops it from the schedule.

The crawl's mode is not stored: the schedule itself (``fleet:{<crawl>}:rvn``, the tracked
URLs of each partition) is the evidence.  fixed and adaptive workers may share a crawl (a
record carries its own interval), though docs/recrawl.md asks for one value per crawl."""

from __future__ import annotations

from typing import Any

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.protocol import as_int
from scrapy_fleet.keys.crawl import CrawlKeys


def tracked(client: Any, keys: CrawlKeys, parts: int) -> int:
    """URLs the crawl's revisit schedule holds, summed over its *parts* partitions (one GET
    each, blocking client)."""
    return sum(int(as_int(client.get(k.revisit_count), 0) or 0)
               for k in keys.all_partitions(parts))


def check_sync(client: Any, keys: CrawlKeys, parts: int) -> None:
    """Refuse a worker with ``FLEET_RECRAWL=off`` when the crawl has URLs scheduled for
    revisits (call it only for such a worker).

    Raises:
        FleetConfigError: one line naming the crawl, the count and what to do.
    """
    n = tracked(client, keys, parts)
    if n > 0:
        raise FleetConfigError(
            f"crawl {keys.crawl_id!r} has {n} URLs scheduled for revisits: start this worker "
            "with FLEET_RECRAWL (fixed or adaptive, as the crawl's other workers), or purge "
            "the crawl")
