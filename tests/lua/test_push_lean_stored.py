"""lua/push_lean.lua with stored responses that name their page's entry (FLEET_ROLE on a
partitioned crawl, docs/stages.md): one stored response queued per entry, on a real Redis."""

from __future__ import annotations

import msgpack
import pytest
import redis

from scrapy_fleet import lua
from scrapy_fleet.frontier.lean import LeanResult, lean_args
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys

KEYS = CrawlKeys("fleet", "lean").partition(1, 4)


def push(client, pushes, op, params=None):
    script = lua.load(client, "push_lean.lua")
    reply = script(keys=KEYS.call_keys(PUSH_LEAN_CALL, op),
                   args=[lean_args(pushes, params or FrontierParams(), "")])
    return LeanResult.from_reply(reply), msgpack.unpackb(reply, raw=False)


def stored(body: bytes, number: int, p: int = 2) -> tuple[object, ...]:
    """A stored response of entry *number* of partition *p* (routing.stored_source)."""
    return (b"", 0, body, STAGE_HOST, 0, 0, p, number)


def waiting(client) -> int:
    return int(client.hget(KEYS.hostq, STAGE_HOST) or 0)


def test_one_stored_response_is_queued_per_entry_of_a_partition(redis_url):
    client = redis.Redis.from_url(redis_url)
    res, raw = push(client, [stored(b"first", 7), stored(b"again, same call", 7),
                             stored(b"another entry", 8), stored(b"another partition", 7, 3)],
                    "op1")
    assert res.flags == [1, 0, 1, 1] and raw["sa"] == 1
    assert res.refused == [] and res.seen == [] and res.duplicates == 0 and res.pushed == 3
    # a later fetch of entry 7 (its first worker's lease lost), after its response was parsed
    res, raw = push(client, [stored(b"a later fetch", 7)], "op2")
    assert res.flags == [0] and res.refused == [] and raw["sa"] == 1 and res.pushed == 0
    # a revisit of the page is a new entry (recrawl): its response is queued
    res, _ = push(client, [stored(b"revisit", 9)], "op3")
    assert res.flags == [1]
    assert waiting(client) == 4
    assert client.hget(KEYS.stats, "stored_again") == b"2"
    assert client.hget(KEYS.stats, "pushed") == b"4"
    assert client.getbit(KEYS.stored_from(2), 7) == 1 and client.getbit(KEYS.stored_from(3), 8) == 0


def test_a_stored_response_queued_before_is_dropped_not_refused_when_the_partition_is_full(
        redis_url):
    client = redis.Redis.from_url(redis_url)
    """Refused, its page would be deferred and fetched again, to no end: it is dropped, and
    its page acknowledged."""
    push(client, [stored(b"first", 7), stored(b"other", 8)], "op1")
    full = FrontierParams(queue_max=2)
    res, raw = push(client, [stored(b"again", 7), stored(b"new", 9)], "op2", full)
    assert res.flags == [0, 0] and res.refused == [1] and raw["sa"] == 1
    assert client.getbit(KEYS.stored_from(2), 9) == 0  # (refused: no bit, sent again later)


def test_a_stored_response_without_its_entry_is_queued_each_time(redis_url):
    client = redis.Redis.from_url(redis_url)
    """(P = 1, or a page of the stored responses' own partition: the stored response goes
    with its page's acknowledgement, atomically, and names no entry.)"""
    row = (b"", 0, b"body", STAGE_HOST, 0, 0)
    assert push(client, [row, row], "op1")[0].flags == [1, 1]
    assert waiting(client) == 2 and not client.keys(KEYS.stored_from_prefix + "*")


@pytest.mark.parametrize("bad", [
    ["", 0, "x", "a.test", 0, 0, 2, 7],  # an entry named by a push that is no stored response
    ["", 0, "x", STAGE_HOST, 0, 0, 2, 2**32],  # past a bitmap's offsets
    ["", 0, "x", STAGE_HOST, 0, 0, 2, 1.5],
    ["", 0, "x", STAGE_HOST, 0, 0, -1, 7],
    ["", 0, "x", STAGE_HOST, 0, 0, 2],  # a partition without its entry
])
def test_a_bad_entry_is_refused_before_any_write(redis_url, bad):
    client = redis.Redis.from_url(redis_url)
    script = lua.load(client, "push_lean.lua")
    arg = msgpack.packb({"p": [bad]}, use_bin_type=False)
    with pytest.raises(redis.ResponseError, match="bad push entry"):
        script(keys=KEYS.call_keys(PUSH_LEAN_CALL, "op"), args=[arg])
    assert client.keys("*") == []
