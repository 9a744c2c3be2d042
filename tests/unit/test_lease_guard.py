"""frontier/leaseguard.py FleetLeaseGuardMiddleware over a real LeaseBook (no I/O): a leased
request of a held partition waits for the revalidation, one whose lease was lost is not sent,
the other partitions' requests pass at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.test import get_crawler

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.book import LeaseBook
from scrapy_fleet.frontier.leaseguard import FleetLeaseGuardMiddleware
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.routing import entry_ref


class _Spider(Spider):
    name = "guard"


def _setup() -> tuple[FleetLeaseGuardMiddleware, LeaseBook, set[int]]:
    crawler = get_crawler(_Spider, settings_dict={"FLEET_REDIS_URL": "redis://127.0.0.1:1/0",
                                                  "FLEET_PARTITIONS": 2})
    crawler.stats.open_spider()
    book = LeaseBook(crawler, FleetConfig.from_settings(crawler.settings))
    held: set[int] = set()
    book.held_parts = lambda: set(held)
    crawler.engine = SimpleNamespace(_slot=SimpleNamespace(scheduler=book, closing=None))
    engine_hooks.publish_ledger(crawler, book)
    return FleetLeaseGuardMiddleware.from_crawler(crawler), book, held


def _leased(book: LeaseBook, p: int, n: int) -> tuple[Request, Lease]:
    request, lease = Request(f"http://h{p}/{n}"), Lease(entry_ref(p, f"{n:015d}"), 1)
    book.prefetch.append((request, lease))
    assert book.take() is request  # (in flight: given to the downloader)
    return request, lease


def _stat(mw: FleetLeaseGuardMiddleware, name: str) -> int:
    return int(mw.crawler.stats.get_value("fleet/frontier/" + name, 0))


def test_a_held_partitions_request_waits_and_a_lost_one_is_not_sent():
    mw, book, held = _setup()
    kept, _ = _leased(book, 0, 1)
    lost, lost_lease = _leased(book, 0, 2)
    other, _ = _leased(book, 1, 3)
    held.add(0)

    async def main() -> None:
        waiting = [asyncio.ensure_future(mw.process_request(r)) for r in (kept, lost)]
        assert await mw.process_request(other) is None  # (partition 1 is not held)
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiting)  # (held: not sent)
        lost_lease.lost = True  # the revalidating call's reply: that lease was taken
        held.clear()
        assert await waiting[0] is None
        with pytest.raises(IgnoreRequest):
            await waiting[1]

    asyncio.run(main())
    assert (_stat(mw, "revalidation_waits"), _stat(mw, "lost_not_sent")) == (2, 1)
    # a request without a lease (not from the frontier) is never held
    held.add(0)
    assert asyncio.run(mw.process_request(Request("http://h0/x"))) is None


def test_the_engine_takes_the_other_partitions_requests_in_order_while_one_is_held():
    _, book, _ = _setup()
    queued = [(Request(f"http://h/{n}"), Lease(entry_ref(p, f"{n:015d}"), 1))
              for n, p in enumerate((0, 1, 0, 1))]
    book.prefetch.extend(queued)
    assert book.take({0}) is queued[1][0]
    assert book.take({0}) is queued[3][0]
    assert book.take({0}) is None
    assert [r for r, _ in book.prefetch] == [queued[0][0], queued[2][0]]
    assert queued[1][0].meta[codec.LEASE_META_KEY] == entry_ref(1, f"{1:015d}")
    assert book.take() is queued[0][0]
