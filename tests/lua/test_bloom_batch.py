"""The frontier call's Bloom reads and writes in batches (lua/bloom.lua, issue 12) against a
real redis-server: two identical new links in one call make one entry, a batched lookup
answers as one-by-one lookups do, and a filter of the classic layout is read as it was
written and gets a generation."""

from __future__ import annotations

import math

from scrapy import Request
from support import link_entry as entry

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import CLASSIC, bloom_key, slice_params
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def admin_for(url: str, cache: int = 0, crawl: str = "s") -> FrontierAdmin:
    return FrontierAdmin(url, crawl, params=FrontierParams(), dupe_cache=cache)


def stat(admin: FrontierAdmin, name: str) -> int:
    return int(admin.client.hget(admin.keys.stats, name) or 0)


def test_two_identical_new_links_in_one_call_make_one_entry(redis_url):
    admin = admin_for(redis_url)
    admin.push([entry("http://h.test/root")])
    leased = admin.call(CallBatch(take=1), worker="w").leased[0]
    links = [entry("http://h.test/new", 1), entry("http://h.test/other", 1),
             entry("http://h.test/new", 1)]
    result = admin.call(CallBatch(acks=[(leased.entry_id, leased.token)], pushes=links),
                        worker="w")
    assert result.push_flags == [1, 1, 0]
    assert (result.pushed, result.duplicates, result.seen) == (2, 1, [2])
    meta = admin.client.hgetall(admin.keys.bloom_meta)
    assert meta[b"c0"] == b"3"  # root, new, other
    assert admin.status()["queued"] == 2


def test_many_fingerprints_in_one_call_match_one_by_one(redis_url):
    """The batched lookup (BITFIELD in chunks) answers as the one-by-one dupefilter does."""
    admin = admin_for(redis_url)
    urls = [f"http://h.test/{i}" for i in range(1200)]
    admin.push([entry(u) for u in urls[:600]])
    result = admin.push([entry(u) for u in urls])  # 600 seen, 600 new, in one call
    assert result.push_flags == [0] * 600 + [1] * 600
    assert admin.status()["seen"] == 1200


def _old_positions(fp: bytes, capacity: int, rate: float) -> list[int]:
    """Bit positions of the previous bloom.lua: (h1 + i*h2) mod m, h1/h2 the 48-bit halves."""
    sp = slice_params(capacity, rate, 0, layout=CLASSIC)
    h1, h2 = int.from_bytes(fp[:6], "big"), int.from_bytes(fp[6:], "big")
    return [(h1 + i * h2) % sp.bits for i in range(sp.hashes)]


def test_filter_of_the_previous_format_is_read_and_gets_a_generation(redis_url):
    admin = admin_for(redis_url, cache=100)
    k = admin.keys
    capacity, rate = 1000, 0.001
    admin.params = FrontierParams(bloom_capacity=capacity, bloom_error_rate=rate)
    sp = slice_params(capacity, rate, 0, layout=CLASSIC)
    client = admin.client
    client.set(k.bloom_slice(0), b"\0" * math.ceil(sp.bits / 8))
    fp = bloom_key(b"http://h.test/old")
    for bit in _old_positions(fp, capacity, rate):
        client.setbit(k.bloom_slice(0), bit, 1)
    client.hset(k.bloom_meta, mapping={"n0": capacity, "p": rate, "slices": 1, "c0": 1})
    result = admin.push([(fp, 0, codec.encode(Request("http://h.test/old")), 0, "h.test"),
                         entry("http://h.test/new")])
    assert result.push_flags == [0, 1]
    gen = client.hget(k.bloom_meta, "g")
    assert gen and result.bloom_gen == gen.decode()
    # and the new entry's bits are where the previous format puts them
    new_fp = bloom_key(b"http://h.test/new")
    assert all(client.getbit(k.bloom_slice(0), b) for b in _old_positions(new_fp, capacity, rate))
