"""frontier/replies.py ReplyFiler.account over a real LeaseBook (no I/O): a reply's lost
entries are the leases of the tokens the call carried, never a newer lease of the same entry
(a worker stopped past FLEET_WORKER_DEAD_AFTER gets an entry it held leased to it again
before the old request's stale acknowledgement is answered: dropping the new lease left it
held in Redis by a live worker that no longer knew it, and the fleet never went idle)."""

from __future__ import annotations

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.book import LeaseBook
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.lostleases import LostLeases
from scrapy_fleet.frontier.protocol import CallBatch, CallResult
from scrapy_fleet.frontier.pump import sent_tokens
from scrapy_fleet.frontier.records import Ack
from scrapy_fleet.frontier.replies import ReplyFiler


class _Spider(Spider):
    name = "tokens"


def _filer() -> tuple[ReplyFiler, LeaseBook]:
    crawler = get_crawler(_Spider, settings_dict={"FLEET_REDIS_URL": "redis://127.0.0.1:1/0"})
    crawler.stats.open_spider()
    book = LeaseBook(crawler, FleetConfig.from_settings(crawler.settings))
    lost = LostLeases(lambda key, n: None, 60.0, lambda: None)
    return ReplyFiler(book, lost, (Request,)), book


def _result(lost: list[str]) -> CallResult:
    fields = {name: 0 for name in CallResult.__dataclass_fields__}
    fields.update(leased=[], lost=lost, push_flags=[], refused=[])
    return CallResult(**{k: v for k, v in fields.items()
                         if CallResult.__dataclass_fields__[k].init})


def test_a_lost_entry_drops_only_the_lease_of_the_token_the_call_carried():
    filer, book = _filer()
    old_inflight, new_prefetched = Lease("000000000000025", 7), Lease("000000000000025", 12)
    other = Lease("000000000000026", 8)
    book.inflight = {1: (Request("http://h/25"), old_inflight)}
    book.prefetch.extend([(Request("http://h/25"), new_prefetched),
                          (Request("http://h/26"), other)])
    batch = CallBatch(acks=[Ack("000000000000025", 7)])
    filer.account(_result(["000000000000025"]), [], sent_tokens(batch))
    assert old_inflight.lost
    assert [lease for _, lease in book.prefetch] == [new_prefetched, other]


def test_a_lost_entry_the_call_carried_no_token_for_is_dropped_by_its_id():
    filer, book = _filer()
    lease = Lease("000000000000030", 3)
    book.prefetch.append((Request("http://h/30"), lease))
    filer.account(_result(["000000000000030"]), [], sent_tokens(CallBatch()))
    assert list(book.prefetch) == []
