"""The frontier's cheaper paths (issue 12) against a real redis-server: the worker's cache of
seen Bloom keys and its generation check after a purge, batched Bloom reads and writes
(two identical new links in one call), replays of the new reply, and entries and filters
written in the previous format."""

from __future__ import annotations

import math
import time

import pytest
import redis
from scrapy import Request

from scrapy_fleet import codec, lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import CLASSIC, bloom_key, slice_params
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, call_args
from scrapy_fleet.keys import CrawlKeys


def entry(url: str, group: int = 0, host: str = "h.test"):
    return bloom_key(url.encode()), 0, codec.encode(Request(url)), group, host


def admin_for(url: str, cache: int = 0, crawl: str = "s") -> FrontierAdmin:
    return FrontierAdmin(url, crawl, params=FrontierParams(), dupe_cache=cache)


def stat(admin: FrontierAdmin, name: str) -> int:
    return int(admin.client.hget(admin.keys.stats, name) or 0)


def test_known_duplicates_are_left_out_and_still_counted(redis_url):
    admin = admin_for(redis_url, cache=1000)
    first = admin.push([entry("http://h.test/a"), entry("http://h.test/b")])
    assert first.push_flags == [1, 1] and first.cached == 0
    assert len(admin.dupes) == 2 and admin.dupes.gen
    again = admin.push([entry("http://h.test/a"), entry("http://h.test/c"),
                        entry("http://h.test/b")])
    assert again.push_flags == [0, 1, 0]
    assert (again.pushed, again.duplicates, again.cached) == (1, 2, 2)
    assert again.seen == [0, 2]
    assert stat(admin, "duplicates") == 2  # the fleet-wide counter counts them too
    assert admin.status()["queued"] == 3


def test_known_duplicate_links_of_an_ack_do_not_park_it(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/seen")])
    leased = admin.call(CallBatch(take=1), worker="w").leased[0]
    result = admin.call(CallBatch(acks=[(leased.entry_id, leased.token)],
                                  pushes=[entry("http://h.test/seen", group=1)]), worker="w")
    assert (result.acked, result.parked, result.cached) == (1, 0, 1)
    assert admin.status()["size"] == 0


def test_cache_after_purge_pushes_the_url_again(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/a")])
    old_gen = admin.dupes.gen
    assert bloom_key(b"http://h.test/a") in admin.dupes
    other = admin_for(redis_url)
    assert other.purge() > 0
    result = admin.push([entry("http://h.test/a")])  # the cache still holds it
    assert result.push_flags == [1] and result.cached == 0
    assert admin.status()["queued"] == 1
    assert admin.dupes.gen and admin.dupes.gen != old_gen
    assert bloom_key(b"http://h.test/a") in admin.dupes


def test_stale_generation_is_refused_before_any_write(redis_url):
    admin = admin_for(redis_url)
    admin.push([entry("http://h.test/a")])
    leased = admin.call(CallBatch(take=1), worker="w").leased[0]
    script = lua.load(admin.client, "frontier.lua")
    batch = CallBatch(acks=[(leased.entry_id, leased.token)], pushes=[entry("http://h.test/x", 1)])
    arg = call_args(batch, "w", admin.params, left_out=3, gen="not-the-filter")
    with pytest.raises(redis.ResponseError, match="stale filter generation"):
        script(keys=admin.keys.frontier_keys("op1", "-"), args=[arg])
    status = admin.status()
    assert (status["leased"], status["queued"], status["seen"]) == (1, 0, 1)
    assert status["counters"].get("duplicates", 0) == 0


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


def test_replayed_op_id_returns_the_first_reply(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/a"), entry("http://h.test/b")])
    first = admin.call(CallBatch(take=2), worker="w", op_id="op-lease")
    again = admin.call(CallBatch(take=2), worker="w", op_id="op-lease")
    assert [(e.entry_id, e.token, e.payload) for e in again.leased] == \
        [(e.entry_id, e.token, e.payload) for e in first.leased]
    assert all(e.payload for e in again.leased)  # filled from the data hash
    acks = [(e.entry_id, e.token) for e in first.leased]
    links = [entry("http://h.test/a", 1), entry("http://h.test/c", 1)]
    done = admin.call(CallBatch(acks=acks, pushes=links), worker="w", op_id="op-ack")
    redo = admin.call(CallBatch(acks=acks, pushes=links), worker="w", op_id="op-ack")
    assert (redo.acked, redo.pushed, redo.push_flags, redo.seen) == \
        (done.acked, done.pushed, done.push_flags, done.seen) == (2, 1, [0, 1], [0])
    assert stat(admin, "acked") == 2 and stat(admin, "pushed") == 3
    assert admin.status()["queued"] == 1


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


def test_deferred_entry_keeps_its_host_in_the_member(redis_url):
    admin = FrontierAdmin(redis_url, "dfr", params=FrontierParams(host_queue_max=1,
                                                                  defer_delay=0.05))
    admin.push([entry("http://a.test/1", host="a.test"), entry("http://b.test/1", host="b.test")])
    leased = {e.entry_id: e for e in admin.call(CallBatch(take=2), worker="w").leased}
    b_id = next(i for i, e in leased.items() if b"b.test" in e.payload)
    # b's only link is for the full host a.test: nothing can be pushed, b is deferred
    result = admin.call(CallBatch(acks=[(b_id, leased[b_id].token)],
                                  pushes=[entry("http://a.test/2", 1, host="a.test")]),
                        worker="w")
    assert result.deferred == 1
    member = admin.client.zrange(admin.keys.delayed, 0, -1)[0].decode()
    assert member.endswith("|b.test") and member.startswith(b_id + "|")
    time.sleep(0.1)
    back = admin.call(CallBatch(take=5), worker="w2").leased
    assert [e.entry_id for e in back] == [b_id]
    assert admin.client.hget(admin.keys.lease, b_id).split(b"|", 2)[2] == b"b.test\tw2"


def test_worker_client_cache_after_a_new_filter_and_after_a_purge(redis_url):
    """The worker's asyncio client (AsyncFrontier, as FleetScheduler runs it): known links are
    left out; when the filter is replaced while the crawl goes on (its keys deleted, the crawl
    marker kept) the refused call is sent again in full; after a purge (the marker gone too)
    the call fails with CrawlStateLostError before any write, as any call of a worker does."""
    import asyncio

    from scrapy_fleet.errors import CrawlStateLostError
    from scrapy_fleet.frontier.client import AsyncFrontier

    keys = CrawlKeys("fleet", "async")

    async def run() -> tuple[list[int], int, list[int], int, int, int]:
        fr = AsyncFrontier(redis_url, keys, "w1", FrontierParams())
        try:
            await fr.call(CallBatch(pushes=[entry("http://h.test/a")]))
            known = await fr.call(CallBatch(pushes=[entry("http://h.test/a"),
                                                    entry("http://h.test/b")]))
            await fr.client.delete(keys.bloom_meta, keys.bloom_slice(0))  # a new filter
            after = await fr.call(CallBatch(pushes=[entry("http://h.test/a"),
                                                    entry("http://h.test/b")]))
            queued = int(await fr.client.get(keys.queue_count) or 0)
            FrontierAdmin(redis_url, "async").purge()
            with pytest.raises(CrawlStateLostError):
                await fr.call(CallBatch(pushes=[entry("http://h.test/a")]))
            left = int(await fr.client.get(keys.queue_count) or 0)
            return known.push_flags, known.cached, after.push_flags, after.cached, queued, left
        finally:
            await fr.close()

    known_flags, known_cached, after_flags, after_cached, queued, left = asyncio.run(run())
    assert (known_flags, known_cached) == ([0, 1], 1)
    # a and b again (the new filter knows neither), nothing lost to the cache
    assert (after_flags, after_cached, queued) == ([1, 1], 0, 4)
    assert left == 0  # the refused call wrote nothing


#: a commit of main before issue 12's port: its frontier.lua writes the previous format
#: (host in `ehost`, leases "token|score|worker", deferred members "id|score")
def test_cache_is_not_trusted_after_a_rollback_that_lost_the_last_call(redis_url):
    """A failover to a lagging replica: the crawl comes back as it was before the worker's
    last call (every key restored from a snapshot taken before it; same filter generation).
    The links that call added to the filter are in the worker's cache but no longer in the
    filter: the next call leaving them out is refused, sent again in full, and they are
    pushed again (a lost page would never be fetched)."""
    admin = admin_for(redis_url, cache=1000, crawl="rb")
    c = admin.client
    admin.push([entry("http://h.test/root")])
    snapshot = {key: c.dump(key) for key in c.scan_iter(match=admin.keys.pattern)}
    admin.push([entry("http://h.test/lost")])  # its writes are lost with the failover
    assert bloom_key(b"http://h.test/lost") in admin.dupes
    for key in c.scan_iter(match=admin.keys.pattern):
        c.delete(key)
    for key, value in snapshot.items():
        c.restore(key, 0, value)
    again = admin.push([entry("http://h.test/lost"), entry("http://h.test/root")])
    assert again.push_flags == [1, 0] and again.cached == 0
    assert admin.status()["queued"] == 2
    # and later calls trust what they learnt since
    known = admin.push([entry("http://h.test/lost")])
    assert (known.push_flags, known.cached) == ([0], 1)
