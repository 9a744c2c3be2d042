"""Filing a frontier call's reply into the worker's lease book (no I/O): its counts as stats,
the leases it reports lost, the entries it leased decoded into requests.

:class:`ReplyFiler` is the pump's (frontier/pump.py ``FrontierPump.replies``); the pump keeps
the timing of the calls, this the meaning of their replies for the book.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from scrapy_fleet import codec
from scrapy_fleet.errors import CallbackError
from scrapy_fleet.frontier.leases import Lease, Out
from scrapy_fleet.stages import records as stored_responses
from scrapy_fleet.stages.roles import STORED_META_KEY

if TYPE_CHECKING:
    from scrapy_fleet.frontier.book import LeaseBook
    from scrapy_fleet.frontier.lostleases import LostLeases
    from scrapy_fleet.frontier.protocol import CallResult, LeasedEntry

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # one logger for the scheduler


class ReplyFiler:
    """Files replies into *book*; *lost*: where leases reported lost are counted and warned
    of; *request_classes*: the Request classes a leased entry may decode to (codec.py)."""

    def __init__(self, book: LeaseBook, lost: LostLeases,
                 request_classes: tuple[str, ...]) -> None:
        self.book = book
        self.lost = lost
        self.request_classes = request_classes
        self._logged_dupe = False  # the first duplicate is logged, then none

    def account(self, result: CallResult, sent: list[Out],
                tokens: dict[str, set[int]] | None = None) -> None:
        """Count the reply *result* of a call that carried the pushes *sent* (in order) in
        the stats (``fleet/frontier/*``, ``fleet/dupefilter/*``, ``fleet/backpressure/*``,
        ``dupefilter/filtered``: docs/stats.md), and drop the leases it reports lost from the
        prefetch (those given to the downloader are marked lost).  *tokens*: entry id -> the
        fencing tokens the call carried for it (acknowledgements, extensions, reports): a
        lost entry is only the lease of those tokens, never a newer lease of the same entry
        (an entry reclaimed from this worker, stopped, can be leased to it again before the
        old request's stale acknowledgement is answered)."""
        book = self.book
        book.inc("fleet/redis/roundtrips")
        for key, count in (("fleet/frontier/pushed", result.pushed),
                           ("fleet/dupefilter/cached", result.cached),
                           ("fleet/frontier/acked", result.acked),
                           ("fleet/backpressure/deferred", result.deferred),
                           ("fleet/backpressure/resumed", result.resumed),
                           ("fleet/frontier/released", result.released),
                           ("fleet/frontier/reclaimed", result.reclaimed)):
            if count:
                book.inc(key, count)
        if result.duplicates:
            book.inc("dupefilter/filtered", result.duplicates)
            book.inc("fleet/dupefilter/filtered", result.duplicates)
            if not self._logged_dupe:
                first = next((url for (url, *_), flag in zip(sent, result.push_flags,
                                                              strict=False) if not flag), "?")
                logger.debug("Filtered duplicate request: <GET %s> - no more duplicates will be "
                             "shown", first, extra={"spider": book.spider})
                self._logged_dupe = True
        if result.parked:
            book.inc("fleet/backpressure/parked", result.parked)
            logger.debug("Frontier full: %d request(s) parked until the frontier has room "
                         "for the rest of their links", result.parked,
                         extra={"spider": book.spider})
        if result.bloom_full:
            logger.warning("The fleet's Bloom filter is at its last slice; its false-positive "
                           "rate grows from here. Raise FLEET_DUPEFILTER_CAPACITY and purge.",
                           extra={"spider": book.spider})
        lost = set(result.lost)
        if lost:
            self.lost.report(lost)
            known = tokens or {}

            def is_lost(lease: Lease) -> bool:
                return lease.entry_id in lost and (lease.entry_id not in known
                                                   or lease.token in known[lease.entry_id])

            book.prefetch = deque((r, lease) for r, lease in book.prefetch if not is_lost(lease))
            for lease in [lease for _, lease in book.inflight.values()] + book.starting:
                if is_lost(lease):
                    lease.lost = True

    def lease(self, entries: list[LeasedEntry]) -> int:
        """Decode the leased *entries* into the prefetch, or to the start hook
        (``book.on_pushed``) for a pushed request; an entry the spider cannot take goes to
        ``book.callback_failed``, one that cannot be decoded to the dead letters (logged,
        ``fleet/frontier/dead_letter``, the pump poked).  Returns the requests taken."""
        book = self.book
        got = 0
        for entry in entries:
            lease = Lease(entry.entry_id, entry.token)
            lease.payload = entry.payload
            try:
                if stored_responses.is_stored(entry.payload):
                    request, stored = stored_responses.decode(
                        entry.payload, book.spider, self.request_classes)
                    request.meta[STORED_META_KEY] = stored
                else:
                    request = codec.decode(entry.payload, book.spider, self.request_classes)
            except CallbackError as exc:  # a readable request, not one the spider can take
                book.callback_failed(lease, exc)
                continue
            except Exception as exc:  # RequestDecodeError, or anything a Request class raises
                logger.error("Frontier entry %s cannot be used (%s); moved to dead letters",
                             entry.entry_id, exc, extra={"spider": book.spider})
                book.dead.append((lease, f"{type(exc).__name__}: {exc}"[:500]))
                book.inc("fleet/frontier/dead_letter")
                book.poke()
                continue
            if entry.expiries:
                book.inc("fleet/frontier/redelivered")
            if codec.PUSHED_META_KEY in request.meta and book.on_pushed is not None:
                book.starting.append(lease)
                book.on_pushed(request, lease)  # the spider middlewares' start hook first
            else:
                book.prefetch.append((request, lease))
            got += 1
        return got
