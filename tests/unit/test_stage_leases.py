"""The lease book's stage hook (frontier/book.py: holds_lease, lost_lease, attach_stored) when
a worker leases again an entry whose lease it lost while its first request was still in
flight (it stalled past FLEET_LEASE_TIMEOUT, and its own expired lease came back to it): each
request answers for its own lease, with no Redis."""

from __future__ import annotations

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.book import LeaseBook
from scrapy_fleet.frontier.leases import Lease


def test_a_request_in_flight_under_a_lost_lease_does_not_answer_for_the_entrys_new_lease():
    crawler = get_crawler(Spider)
    book = LeaseBook(crawler, FleetConfig.from_settings({"FLEET_ROLE": "fetch"}))
    old, new = Lease("1:000000000000005", 1), Lease("1:000000000000005", 2)
    book.prefetch.append((Request("http://a.test/p"), old))
    first = book.take()
    assert first is not None and book.holds_lease(first) and not book.lost_lease(first)
    old.lost = True  # (the pump learns it from a reply)
    book.prefetch.append((Request("http://a.test/p"), new))
    second = book.take()
    assert second is not None
    assert book.lost_lease(first) and not book.holds_lease(first)
    assert book.holds_lease(second) and not book.lost_lease(second)
    # the first request's response comes in: dropped (roles.py), its download told once
    book.download_over(first)
    assert not new.downloaded and book.downloaded == []
    book.finished(first)  # not acknowledged (lost), and the entry still names the new lease
    assert book.done == [] and book.holds_lease(second)
    book.download_over(second)
    book.attach_stored(second, b"stored")
    assert [c[3] for c in new.children] == [b"stored"] and old.children == []
    book.finished(second)
    assert book.done == [new] and not book.holds_lease(second)
    # (counted once, where the pump learns it from a reply: LostLeases.report; finishing the
    # request counted it a second time, 32 against the warning's 16 in a user's trial)
    assert crawler.stats.get_value("fleet/frontier/lease_lost") is None
