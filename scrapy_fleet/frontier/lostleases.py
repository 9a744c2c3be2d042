"""A worker's lost leases: the ``fleet/frontier/lease_lost`` counts and their warning lines
(docs/stats.md), for :class:`~scrapy_fleet.frontier.pump.FrontierPump`.  No I/O.

A lease the frontier reports lost was leased again elsewhere (it expired), or the crawl was
purged.  One sent in a call that failed without a reply (Redis unreachable) is *unsure*: a
call sent again with its op id gets its cached reply, so such a lease comes back lost only
when that cached reply had expired (FleetParams.op_ttl, 300 s: the call ran before the
connection broke and ran again) or when the outage outlasted FLEET_LEASE_TIMEOUT; it is
counted in ``fleet/frontier/lease_lost/outage`` and said lost to the outage, not to a stall.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from scrapy_fleet.frontier.protocol import OP_TTL_MS

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # (the pump's logger)


class LostLeases:
    """Counts and warns of the leases a worker's calls report lost.

    *inc(stat, count)*: adds to the worker's Scrapy stat; *lease_timeout*: FLEET_LEASE_TIMEOUT
    and *dead_after*: FLEET_WORKER_DEAD_AFTER (0: no death delay), named in the warnings (a
    stalled worker's leases are taken back after the shorter of the two); *spider*: the
    ``extra`` of the log lines (read at each line).
    """

    def __init__(self, inc: Callable[[str, int], None], lease_timeout: float,
                 spider: Callable[[], Any], dead_after: float = 0.0) -> None:
        self._inc = inc
        self._lease_timeout = lease_timeout
        self._dead_after = dead_after
        self._spider = spider
        self.total = 0  #: leases reported lost so far
        #: entry ids sent in a call that failed without a reply, not answered since
        self.unsure: set[str] = set()

    def unanswered(self, entry_ids: Iterable[str]) -> None:
        """The call carrying *entry_ids* failed without a reply: it may have run."""
        self.unsure.update(entry_ids)

    def answered(self, entry_ids: Iterable[str]) -> None:
        """A call carrying *entry_ids* got its reply (after :meth:`report` of it)."""
        if self.unsure:
            self.unsure.difference_update(entry_ids)

    def report(self, lost: set[str]) -> None:
        """Count the leases *lost* (entry ids) one reply reported, and warn: those of a call
        that failed without a reply at once, as lost to the outage; the others the first
        five times, then at each 100th."""
        if not lost:
            return
        self._inc("fleet/frontier/lease_lost", len(lost))
        self.total += len(lost)
        to_outage = lost & self.unsure
        if to_outage:
            self._inc("fleet/frontier/lease_lost/outage", len(to_outage))
            logger.warning(
                "%d lease(s) reported lost after a Redis outage (%d so far): the call "
                "that carried them failed without a reply, so either it ran before the "
                "connection broke and was sent again after its cached reply expired "
                "(%d s: those requests were acknowledged then and are not fetched again) or "
                "the outage outlasted FLEET_LEASE_TIMEOUT=%s s (they are fetched again); not "
                "a stall of this worker", len(to_outage), self.total, OP_TTL_MS // 1000,
                self._lease_timeout, extra={"spider": self._spider()})
            self.unsure -= to_outage
        others = len(lost) - len(to_outage)
        if others and (self.total - len(lost) < 5  # (the first ones, then each 100th)
                       or (self.total - len(lost)) // 100 != self.total // 100):
            logger.warning(
                "%d lease(s) lost (%d so far): their requests were leased again elsewhere "
                "(%s), or the crawl was purged / Redis lost its data; those pages may be "
                "fetched again and their links are left to the new holder", others,
                self.total, self._why_taken(), extra={"spider": self._spider()})

    def _why_taken(self) -> str:
        """Why a live worker's leases are leased again: the delay(s) that apply."""
        expired = f"or Redis was out, longer than FLEET_LEASE_TIMEOUT={self._lease_timeout} s"
        if self._dead_after <= 0:
            return f"this worker stalled, {expired}?"
        return (f"this worker was silent (stopped, frozen) longer than FLEET_WORKER_DEAD_AFTER"
                f"={self._dead_after} s and taken for dead, or it stalled, {expired}?")
