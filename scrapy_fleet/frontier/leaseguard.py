"""``FleetLeaseGuardMiddleware``: a leased request leaves for the network only while this
worker may still hold its lease (issue 30; docs/architecture.md, "Recovery in seconds").

After a stall that may have made the worker dead to the partition a request was leased from
(SIGSTOP past ``FLEET_WORKER_DEAD_AFTER``, a frozen VM, that partition's master down), the
frontier may have reclaimed the lease and another worker fetched the page meanwhile
(frontier/liveness.py ``StallGuard``).  The engine takes no such request from the prefetch; this
middleware covers those already given to the downloader: it waits, for a request of a held
partition, until a frontier call has said which leases the worker still holds there
(``fleet/frontier/revalidation_waits``), and does not send one whose lease was taken
(IgnoreRequest, ``fleet/frontier/lost_not_sent``: its new holder fetches it; its
acknowledgement would be refused anyway).  The requests of other partitions pass at once.

The add-on puts it last of the downloader middlewares (:data:`ORDER`), after every one that
may wait (the cookie jar's read from Redis, the politeness turn): a worker stopped while a
request waited there sends it on resuming only after this check.  It costs no I/O.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest

from scrapy_fleet import engine_hooks
from scrapy_fleet.codec import LEASE_META_KEY

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: its place in DOWNLOADER_MIDDLEWARES: after Scrapy's last (HttpCacheMiddleware, 900)
ORDER = 990
#: seconds between two looks while a leased request waits for the revalidation after a stall
POLL = 0.05


class FleetLeaseGuardMiddleware:
    """See the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetLeaseGuardMiddleware:
        return cls(crawler)

    def _inc(self, key: str) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(key)

    async def process_request(self, request: Request, spider: Any = None) -> None:
        """Wait while *request*'s lease partition is held; raise IgnoreRequest for a request
        whose lease was lost (None otherwise: the request goes on)."""
        if not request.meta.get(LEASE_META_KEY):
            return None
        ledger = engine_hooks.ledger_of(self.crawler)
        if ledger is None:
            return None
        if not ledger.send_safe(request):
            self._inc("fleet/frontier/revalidation_waits")
            while not ledger.send_safe(request) and not ledger.closing:
                await asyncio.sleep(POLL)
        if ledger.lost_lease(request):
            self._inc("fleet/frontier/lost_not_sent")
            raise IgnoreRequest("its lease was lost (leased again elsewhere while this worker "
                                "was stalled): not sent")
        return None
