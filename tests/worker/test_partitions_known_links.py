"""A partitioned crawl's known duplicate links (frontier/partdupes.py) against a real
redis-server: a link its page's partition knows is buffered unencoded and left out of the
call there, as on P = 1; one whose partition forgot it while it waited (held part, stale
filter generation) is encoded then and sent, so none is lost."""

from __future__ import annotations

import asyncio

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from support import frontier_payloads, hosts_in_partition, push_row

from scrapy_fleet.frontier.dupecache import StaleDupeCache
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys

KEYS = CrawlKeys("fleet", "pk")
PARTS = 4


class Encoder:
    """The worker's ``LeaseBook.encode_link`` stand-in: counts what it encodes."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

    def __call__(self, request: Request) -> tuple[bytes, str]:
        self.requests.append(request)
        return b"encoded " + request.url.encode(), request.url.split("/")[2]


def lazy(key: bytes, url: str, group: int) -> tuple:
    """A link the book buffered unencoded (a known duplicate): its request, no host."""
    return (key, 0, Request(url), group, "", 0, 0)


def payloads(c: redis.Redis, p: int) -> list[bytes]:
    """The encoded requests of partition *p*'s entries, but its pages'."""
    return sorted(x for x in frontier_payloads(c, KEYS.partition(p, PARTS))
                  if not x.startswith(b"page"))


async def known_link(fr: PartitionedFrontier, host: str, key: bytes = b"") -> tuple:
    """Two pages of *host* (partition 2) leased; the first acknowledged with a link of
    *host* (Bloom key *key*, default a random one), which partition 2's cache learns: (the
    second page's lease, the link's Bloom key)."""
    await fr.call(CallBatch(pushes=[push_row(host, b"page%d" % i) for i in range(2)]))
    fr.home = 2
    a, b = (await fr.call(CallBatch(take=2))).leased
    row = push_row(host, b"link", 1)
    link = (key or row[0], *row[1:])
    r = await fr.call(CallBatch(acks=[(a.entry_id, a.token)], pushes=[link]))
    assert r.push_flags == [1]
    return b, link[0]


def test_a_known_link_of_its_pages_partition_is_left_out_unencoded(redis_url):
    h2 = hosts_in_partition(2, PARTS)[0]
    enc = Encoder()

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), PARTS,
                                 dupe_cache=4000, encode=enc)
        try:
            b, key = await known_link(fr, h2)
            # known in partition 2's cache: for a page of partition 2 only
            assert fr.dupes.knows(key, b.entry_id)
            assert not fr.dupes.knows(key, None) and not fr.dupes.knows(key, "1:x")
            r = await fr.call(CallBatch(acks=[(b.entry_id, b.token)],
                                        pushes=[lazy(key, f"http://{h2}/l", 1)]))
            assert r.acked == 1 and r.push_flags == [0] and r.cached == 1 and r.seen == [0]
        finally:
            await fr.close()

    asyncio.run(main())
    assert enc.requests == []
    assert payloads(redis.Redis.from_url(redis_url), 2) == [b"link"]


def test_a_held_known_link_its_partition_forgot_is_encoded_and_sent(redis_url):
    """A page of partition 2 acknowledged, with a known link, in a call leasing from the
    home (0): its part waits; meanwhile partition 2's cache forgets the link (cleared: a
    purge) and the filter is replaced: the part goes encoded, and the link is pushed."""
    h0, h2 = hosts_in_partition(0, PARTS)[0], hosts_in_partition(2, PARTS)[0]
    c = redis.Redis.from_url(redis_url)
    p2 = KEYS.partition(2, PARTS)
    enc = Encoder()

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(lease_timeout=8.0),
                                 PARTS, dupe_cache=4000, flush_age=60, encode=enc)
        try:
            await fr.call(CallBatch(pushes=[push_row(h0, b"zero%d" % i) for i in range(4)]))
            b, key = await known_link(fr, h2)
            fr.home = 0
            url = f"http://{h2}/l"
            r = await fr.call(CallBatch(acks=[(b.entry_id, b.token)],
                                        pushes=[lazy(key, url, 1)], take=1))
            assert r.acked == 0 and fr.held == 2 and enc.requests == []
            fr.fronts[2].dupes.clear()
            c.delete(p2.bloom_meta, p2.bloom_slice(0))
            fr.flush_now()
            r = await fr.call(CallBatch())
            assert r.acked == 1 and r.pushed == 1 and fr.held == 0
        finally:
            await fr.close()

    asyncio.run(main())
    assert [r.url for r in enc.requests] == [f"http://{h2}/l"]
    assert payloads(c, 2) == [b"encoded http://" + h2.encode() + b"/l", b"link"]


@pytest.mark.parametrize("alone", [False, True])
def test_a_stale_filter_generation_under_a_known_link_sends_it_encoded(redis_url, alone):
    """Partition 2's filter replaced under a known link (what a failover that lost writes
    looks like to its cache): its part of the call is refused before any write.  Beside
    another partition's part it is held, and the next call sends it encoded; alone, nothing
    went through: the client holds nothing and raises StaleDupeCache, as a P = 1 client
    does, and the pump builds its call again (its book encodes the link: the cache forgot
    it)."""
    h0, h2 = hosts_in_partition(0, PARTS)[0], hosts_in_partition(2, PARTS)[0]
    c = redis.Redis.from_url(redis_url)
    p2 = KEYS.partition(2, PARTS)
    enc = Encoder()
    url = f"http://{h2}/l"

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), PARTS,
                                 dupe_cache=4000, encode=enc)
        try:
            await fr.call(CallBatch(pushes=[push_row(h0, b"zero%d" % i) for i in range(4)]))
            b, key = await known_link(fr, h2)
            c.delete(p2.bloom_meta, p2.bloom_slice(0))
            ack = [(b.entry_id, b.token)]
            if alone:
                with pytest.raises(StaleDupeCache):
                    await fr.call(CallBatch(acks=ack, pushes=[lazy(key, url, 1)]))
                assert fr.held == 0 and not fr.dupes.knows(key, b.entry_id)
                encoded = enc(Request(url))
                r = await fr.call(CallBatch(acks=ack, pushes=[(key, 0, encoded[0], 1, h2)]))
            else:
                fr.home = 0
                r = await fr.call(CallBatch(acks=ack, pushes=[lazy(key, url, 1)], take=1))
                assert len(r.leased) == 1 and r.acked == 0 and fr.held == 2
                assert not fr.dupes.knows(key, b.entry_id) and enc.requests == []
                r = await fr.call(CallBatch())
            assert r.acked == 1 and r.pushed == 1 and fr.held == 0
        finally:
            await fr.close()

    asyncio.run(main())
    assert [r.url for r in enc.requests] == [url]
    assert payloads(c, 2) == [b"encoded " + url.encode(), b"link"]
    assert c.hget(p2.stats, "acked") == b"2"


class _Spider(Spider):
    name = "pk"


def test_the_book_leaves_unencoded_only_links_its_pages_partition_knows(redis_url):
    """The worker's LeaseBook on a P = 4 client: a link whose key partition 2's cache holds
    waits unencoded when its page is of partition 2, and is encoded (with its host key) when
    its page is of another partition (a lean push carries it) or it has no page."""
    h2 = hosts_in_partition(2, PARTS)[0]
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": "pk", "FLEET_PARTITIONS": PARTS,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    book = sched.book
    book.spider = _Spider()
    url = f"http://{h2}/l"
    key = sched.df.bloom_key(Request(url))
    fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), PARTS, dupe_cache=4000,
                             encode=book.encode_link)
    sched.pump.frontier = fr  # type: ignore[assignment]

    async def main():
        try:
            b, _ = await known_link(fr, h2, key)
        finally:
            await fr.close()
        return b

    b = asyncio.run(main())
    page, other = Lease(b.entry_id, b.token), Lease("1:x", 1)
    for parent in (page, other, None):
        assert book.buffer(Request(url), key, 0, 0, parent)
    assert type(page.children[0][3]) is Request and page.children[0][4] == ""
    assert other.children[0][3] == book.encode_link(Request(url))[0]  # type: ignore[index]
    assert other.children[0][4] == h2 and type(book.outbox[0][3]) is bytes
