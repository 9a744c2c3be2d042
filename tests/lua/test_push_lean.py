"""lua/push_lean.lua, the push-only call of a partitioned crawl (issue 21), on a real Redis."""

from __future__ import annotations

import asyncio
import os

import msgpack
import pytest
import redis

from scrapy_fleet import lua
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.lean import LeanResult, lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys

KEYS = CrawlKeys("fleet", "lean").partition(1, 4)


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def push(client, pushes, params=None, op="op1", marker=""):
    params = params or FrontierParams()
    script = lua.load(client, "push_lean.lua")
    reply = script(keys=KEYS.call_keys(PUSH_LEAN_CALL, op),
                   args=[lean_args(pushes, params, marker)])
    return LeanResult.from_reply(reply), reply


def rows(hosts, tag=b"r"):
    return [(os.urandom(12), 0, tag + h.encode(), h) for h in hosts]


def test_new_entries_are_queued_in_the_partition_and_leased_from_it(client, redis_url):
    pushes = rows(["a.test", "b.test", "a.test"])
    res, _ = push(client, pushes)
    assert res.flags == [1, 1, 1] and res.pushed == 3 and res.refused == []
    assert int(client.get(KEYS.queue_count)) == 3
    assert client.hgetall(KEYS.hostq) == {b"a.test": b"2", b"b.test": b"1"}
    assert sorted(client.zrange(KEYS.ready, 0, -1)) == [b"a.test", b"b.test"]
    assert client.hget(KEYS.stats, "pushed") == b"3"
    assert client.get(KEYS.layout) == str(LAYOUT_VERSION).encode()
    assert client.get(KEYS.marker) == res.marker.encode() and res.marker

    async def lease():
        fr = AsyncFrontier(redis_url, KEYS, "w", FrontierParams())
        try:
            got = (await fr.call(CallBatch(take=10))).leased
            return sorted(e.payload for e in got)
        finally:
            await fr.close()
    assert asyncio.run(lease()) == sorted(p[2] for p in pushes)


def test_duplicates_are_found_in_the_filter_and_in_the_call(client):
    first = rows(["a.test"])
    push(client, first)
    again = [first[0], (first[0][0], 0, b"other", "a.test")]
    fresh = rows(["c.test"])
    res, _ = push(client, again + fresh + fresh, op="op2")
    assert res.flags == [0, 0, 1, 0]
    assert res.seen == [0, 1, 3] and res.duplicates == 3 and res.pushed == 1
    assert int(client.get(KEYS.queue_count)) == 2
    assert client.hget(KEYS.stats, "duplicates") == b"3"


def test_a_repeated_call_returns_its_first_reply_and_writes_nothing(client):
    pushes = rows(["a.test", "b.test"])
    _, first = push(client, pushes, op="same")
    before = {k: client.dump(k) for k in client.keys("*") if not k.endswith(b":op:same")}
    _, second = push(client, pushes, op="same")
    assert second == first
    assert {k: client.dump(k) for k in client.keys("*") if not k.endswith(b":op:same")} == before


def test_bounds_refuse_without_touching_the_filter(client):
    params = FrontierParams(queue_max=2, host_queue_max=1)
    res, _ = push(client, rows(["a.test", "a.test", "b.test", "c.test"]), params)
    # a.test's second entry: its host is full; c.test: the partition is full
    assert res.flags == [1, 0, 1, 0] and res.refused == [1, 3]
    assert client.hget(KEYS.stats, "refused") == b"2"
    retry = rows(["c.test"])
    res, _ = push(client, retry, params, op="op2")
    assert res.refused == [0]
    res, _ = push(client, retry, FrontierParams(queue_max=10), op="op3")
    assert res.flags == [1]  # never added to the filter while refused


def test_a_push_makes_an_idle_partition_busy(client):
    client.set(KEYS.idle_since, 1)
    push(client, rows(["a.test"]))
    assert client.exists(KEYS.idle_since) == 0


def test_a_lost_marker_is_refused_before_any_write(client):
    res, _ = push(client, rows(["a.test"]))
    client.delete(KEYS.marker)
    client.delete(KEYS.layout)
    before = sorted(client.keys("*"))
    with pytest.raises(redis.ResponseError, match="crawl state lost"):
        push(client, rows(["b.test"]), op="op2", marker=res.marker)
    assert sorted(client.keys("*")) == before


def test_a_bad_argument_is_refused_before_any_write(client):
    script = lua.load(client, "push_lean.lua")
    bad = msgpack.packb({"p": [["short", 0, "x", "h"]]}, use_bin_type=False)
    with pytest.raises(redis.ResponseError, match="bad push entry"):
        script(keys=KEYS.call_keys(PUSH_LEAN_CALL, "op"), args=[bad])
    assert client.keys("*") == []


def test_a_delayed_push_waits_among_the_deferred(client):
    res, _ = push(client, [(os.urandom(12), 0, b"later", "a.test", 60_000)])
    assert res.flags == [1]
    assert client.zcard(KEYS.deferred) == 1
    assert int(client.get(KEYS.queue_count) or 0) == 0
    assert list(client.hvals(KEYS.data)) == [b"later"]


def test_a_stored_response_counts_in_the_response_queue(client, redis_url):
    """FLEET_ROLE: a stored response pushed by a lean call counts its bytes, the reply gives
    the response queue as the frontier call does, and the parse worker's ack takes them off
    (the figure was left negative)."""
    from scrapy_fleet.keys.crawl import STAGE_HOST

    res, _ = push(client, rows(["a.test"]))
    assert res.rq is None  # no stored response in the call: no figures (no reads)
    stored = [(os.urandom(12), 0, b"x" * 100, STAGE_HOST), (os.urandom(12), 0, b"y" * 50,
                                                            STAGE_HOST)]
    res, _ = push(client, stored, op="op2")
    assert res.pushed == 2 and res.rq == (2, 150)
    assert client.hget(KEYS.stats, "response_queue_bytes") == b"150"

    async def parse():
        fr = AsyncFrontier(redis_url, KEYS, "w", FrontierParams(lease_only_host=STAGE_HOST))
        try:
            got = (await fr.call(CallBatch(take=10))).leased
            r = await fr.call(CallBatch(acks=[(e.entry_id, e.token) for e in got]))
            return len(got), r.acked, r.response_queue
        finally:
            await fr.close()
    assert asyncio.run(parse()) == (2, 2, (0, 0))
    assert client.hget(KEYS.stats, "response_queue_bytes") == b"0"


def chained(client, pushes, op, prev, left_out=0, gen=None):
    """A lean call as a worker's LeanDestination makes it: naming its previous lean call's
    reply cache, with *left_out* known duplicates of filter generation *gen*."""
    script = lua.load(client, "push_lean.lua")
    reply = script(keys=KEYS.call_keys(PUSH_LEAN_CALL, op, prev),
                   args=[lean_args(pushes, FrontierParams(), "", left_out, gen)])
    return LeanResult.from_reply(reply)


def test_a_call_leaving_out_known_duplicates_needs_the_previous_reply_cache_and_filter(client):
    """The evidence of a worker's cache of a partition's filter (frontier/lean.py): the
    previous lean call's reply cache (a failover to a replica that lacked its writes loses
    it: replication is in order) and the filter's generation (a purge makes a new one).
    Without either, a call that leaves links out is refused before any write ("drop your
    cache"); a call that leaves none out says the evidence was gone (pl)."""
    first = chained(client, rows(["a.test"]), "op1", "-")
    assert first.prev_lost and first.gen and first.pushed == 1  # (no previous call yet)
    known = chained(client, rows(["b.test"]), "op2", "op1", left_out=2, gen=first.gen)
    assert (known.pushed, known.duplicates, known.prev_lost) == (1, 0, False)
    assert client.exists(KEYS.op("op1")) == 0 and client.exists(KEYS.op("op2")) == 1
    assert client.hget(KEYS.stats, "duplicates") == b"2"  # the left-out links counted
    before = {k: client.dump(k) for k in client.keys("*")}
    for prev, gen in (("op1", first.gen), ("op2", "another filter")):  # gone; purged
        with pytest.raises(redis.ResponseError, match="stale filter generation"):
            chained(client, rows(["c.test"]), "op3", prev, left_out=1, gen=gen)
    assert {k: client.dump(k) for k in client.keys("*")} == before  # nothing written
    client.delete(KEYS.op("op2"))  # (lost with a failover)
    whole = chained(client, rows(["c.test"]), "op3", "op2")
    assert whole.prev_lost and whole.pushed == 1
