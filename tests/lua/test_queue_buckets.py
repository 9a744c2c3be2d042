"""The queue's layout: one LIST per host and priority (a bucket) holding "<id>\\t<request>",
an index of the buckets, a count (lua/frontier.lua, keys/crawl.py), and the blocked Bloom layout."""

from __future__ import annotations

import math

import redis
from scrapy import Request
from support import queued

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import BLOCK_BITS, BLOCK_PRIME, BLOCKED, bloom_key, slice_params
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def entry(url: str, priority: int = 0, host: str = "a.test", group: int = 0):
    return bloom_key(url.encode()), priority, codec.encode(Request(url, priority=priority)), \
        group, host


def urls_of(leased) -> list[str]:
    return [codec.decode_dict(e.payload)["url"] for e in leased]


def test_a_queued_request_lives_in_its_bucket_entry_only(redis_url):
    admin = FrontierAdmin(redis_url, "bk")
    k, c = admin.keys, admin.client
    admin.push([entry("http://a.test/1"), entry("http://a.test/2", priority=3),
                entry("http://b.test/1", host="b.test")])
    assert c.hlen(k.data) == 0 and c.exists(*k.layout1_keys()) == 0
    assert c.get(k.queue_count) == b"3" and admin.status()["queued"] == 3
    p0, p3 = f"{10**15:016d}", f"{10**15 - 3:016d}"  # priority keys of priorities 0 and 3
    assert c.hgetall(k.queue_index) == {b"a.test": f"{p3} {p0}".encode(), b"b.test": p0.encode()}
    raw = c.lrange(k.bucket("a.test", 3), 0, -1)
    assert len(raw) == 1
    entry_id, request = raw[0].split(b"\t", 1)
    assert codec.decode_dict(request)["url"] == "http://a.test/2"
    leased = admin.call(CallBatch(take=1, ), worker="w").leased
    # the best head of the hosts ready longest: a.test's priority 3
    assert [e.entry_id for e in leased] == [entry_id.decode()]
    assert c.hget(k.data, leased[0].entry_id) == request  # a leased entry keeps it in `data`
    assert not c.exists(k.bucket("a.test", 3))  # an emptied bucket is gone, index too
    assert c.hget(k.queue_index, "a.test") == f"{10**15:016d}".encode()
    assert c.get(k.queue_count) == b"2"
    admin.call(CallBatch(acks=[(leased[0].entry_id, leased[0].token)]), worker="w")
    assert c.hlen(k.data) == 0


def test_priority_first_fifo_within_and_a_reclaimed_entry_back_at_its_bucket_head(redis_url):
    admin = FrontierAdmin(redis_url, "fifo", params=FrontierParams(lease_timeout=30.0))
    k, c = admin.keys, admin.client
    admin.push([entry(f"http://a.test/{i}") for i in range(4)])
    first = admin.call(CallBatch(take=1), worker="w").leased
    assert urls_of(first) == ["http://a.test/0"]
    admin.push([entry("http://a.test/late")])
    c.zadd(k.leases, {first[0].entry_id: 1})  # its lease expired: reclaimed by the next call
    c.delete(k.next_due)  # (an expiry written by hand: the calls' bound of what is due goes)
    got = admin.call(CallBatch(take=10), worker="w2")
    assert got.reclaimed == 1
    assert urls_of(got.leased) == [f"http://a.test/{i}" for i in range(4)] + [
        "http://a.test/late"]
    assert queued(c, k) == 0 and c.hlen(k.queue_index) == 0


def test_a_bucket_entry_not_written_by_the_scripts_is_dead_lettered(redis_url):
    admin = FrontierAdmin(redis_url, "junkb")
    k, c = admin.keys, admin.client
    admin.push([entry("http://a.test/1"), entry("http://a.test/2")])
    c.lset(k.bucket("a.test", 0), 0, b"no tab here")
    got = admin.call(CallBatch(take=5), worker="w")
    assert urls_of(got.leased) == ["http://a.test/2"]
    status = admin.status()
    assert status["counters"]["bad_queue_members"] == 1 and status["dead"] == 1
    assert status["queued"] == 0
    (record,) = admin.dead_letters()
    assert record["reason"] == "corrupt queue entry" and record["data"] == b"no tab here"


def test_blocked_bloom_layout_sets_the_documented_bits(redis_url):
    """A fingerprint's k bits are in block (h1 + h2) mod blocks, at x, x + y, x + 2y + z, ...
    mod 4093 (triple hashing, lua/bloom.lua); a new filter records layout 2."""
    capacity, rate = 5000, 0.001
    admin = FrontierAdmin(redis_url, "blk", params=FrontierParams(bloom_capacity=capacity,
                                                                  bloom_error_rate=rate))
    k, c = admin.keys, admin.client
    fp = bloom_key(b"http://a.test/one")
    admin.push([(fp, 0, codec.encode(Request("http://a.test/one")), 0, "a.test")])
    assert c.hget(k.bloom_meta, "v") == str(BLOCKED).encode()
    sp = slice_params(capacity, rate, 0)
    blocks = sp.bits // BLOCK_BITS
    assert c.strlen(k.bloom_slice(0)) == sp.bytes == blocks * BLOCK_BITS // 8
    h1, h2 = int.from_bytes(fp[:6], "big"), int.from_bytes(fp[6:], "big")
    block, x = (h1 + h2) % blocks, h2 % BLOCK_PRIME
    y, z = 1 + (h2 // BLOCK_PRIME) % (BLOCK_PRIME - 1), (h1 // blocks) % BLOCK_PRIME
    want = set()
    for _ in range(sp.hashes):
        want.add(block * BLOCK_BITS + x)
        x, y = (x + y) % BLOCK_PRIME, (y + z) % BLOCK_PRIME
    bits = c.get(k.bloom_slice(0))
    assert bits is not None
    have = {i * 8 + j for i, byte in enumerate(bits) if byte for j in range(8)
            if byte & (0x80 >> j)}
    assert have == want
    assert math.ceil(sp.bits / 8) == len(bits)
    again = admin.push([(fp, 0, b"x", 0, "a.test")])
    assert again.push_flags == [0]


def test_a_purge_deletes_the_queue_buckets(redis_url):
    admin = FrontierAdmin(redis_url, "pg")
    admin.push([entry(f"http://h{i}.test/", host=f"h{i}.test") for i in range(30)])
    client = redis.Redis.from_url(redis_url)
    assert len(list(client.scan_iter(match="fleet:{pg}:qb:*"))) == 30
    assert admin.purge() > 30
    assert list(client.scan_iter(match="fleet:{pg}:*")) == []


def test_entries_written_into_a_bucket_by_hand_leave_the_count_at_0_when_done(redis_url):
    """Junk pushed into a bucket with redis-cli was never counted; dead-lettered as corrupt,
    it is taken off the count all the same: once no bucket is left the count is 0 again, and
    the fleet can go idle."""
    admin = FrontierAdmin(redis_url, "hand")
    k, c = admin.keys, admin.client
    admin.push([entry("http://a.test/1")])
    c.rpush(k.bucket("a.test", 0), "no tab", "")
    got = admin.call(CallBatch(take=5), worker="w")
    assert urls_of(got.leased) == ["http://a.test/1"]
    done = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got.leased]), worker="w")
    assert admin.status()["dead"] == 2
    assert (done.queued, done.size) == (0, 0) and done.idle_ms >= 0
    assert c.get(k.queue_count) == b"0"


def test_a_deferred_stored_response_leaves_the_response_queue_to_the_fetch_workers(redis_url):
    """A stored response (host "~parse") none of whose links fit (their host at
    FLEET_HOST_QUEUE_MAX) is deferred; it waits for that host, which only the fetch workers
    drain, so it does not count in the response queue that stops them (a stall: a parse worker
    re-parsed the deferred responses forever while the fetch workers waited)."""
    from scrapy_fleet.frontier.protocol import FrontierParams

    params = FrontierParams(host_queue_max=1, defer_delay=60.0)
    parse = FrontierAdmin(redis_url, "stall", params=FrontierParams(
        host_queue_max=1, defer_delay=60.0, lease_only_host="~parse"))
    fetch = FrontierAdmin(redis_url, "stall", params=params)
    fetch.push([entry("http://a.test/1")])  # a.test at its bound of 1
    stored = b"a stored response" * 10
    fetch.push([(b"", 0, stored, 0, "~parse")])
    assert fetch.call(CallBatch(), worker="f").response_queue == (1, len(stored))
    (resp,) = parse.call(CallBatch(take=1), worker="p").leased
    done = parse.call(CallBatch(acks=[(resp.entry_id, resp.token)],
                                pushes=[entry("http://a.test/2", group=1)]), worker="p")
    assert done.deferred == 1
    assert done.response_queue == (0, 0)  # not waiting for a parse worker any more
    status = fetch.status()
    assert status["stored_responses"] == 1 and status["deferred"] == 1
    # when it is due again it is the parse workers' again
    fetch.client.zadd(fetch.keys.deferred, {m: 1 for m in
                                           fetch.client.zrange(fetch.keys.deferred, 0, -1)})
    fetch.client.delete(fetch.keys.next_due)  # (times written by hand: the bound goes)
    assert fetch.call(CallBatch(), worker="f").response_queue == (1, len(stored))


def test_one_push_of_more_new_hosts_than_a_command_chunk_holds_makes_every_host_ready(redis_url):
    """2,500 new hosts in one push: their ZADD NX into the ready set is sent in chunks of whole
    score/member pairs, each with its NX (one NX before the whole list, cut in chunks, was a
    syntax error past 2,000 hosts: the push failed and bench_metrics could not fill)."""
    admin = FrontierAdmin(redis_url, "manyhosts")
    n = 2500
    admin.push([entry(f"http://h{i}.test/", host=f"h{i}.test") for i in range(n)])
    k, c = admin.keys, admin.client
    assert c.zcard(k.ready) == n
    assert admin.status()["queued"] == n
    leased = admin.call(CallBatch(take=50), worker="w").leased
    assert len({codec.decode_dict(e.payload)["url"] for e in leased}) == 50
