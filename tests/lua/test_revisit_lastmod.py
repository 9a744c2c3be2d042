"""Sitemap <lastmod> (issue 22): lua/step_revisit.lua's place index through the frontier call
and lua/push_lean.lua, with a real redis-server.  A tracked URL pushed again with a lastmod
newer than its last fetch is leased at once, with its state; an older one changes nothing; a
record that left its slot (due, dropped) is not found again."""

from __future__ import annotations

import time

import redis
from scrapy import Request

from scrapy_fleet import codec, lua
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.lean import LeanResult, lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.record import revisit_record
from scrapy_fleet.recrawl.schedule import STATE_META_KEY, State

KEYS = CrawlKeys("fleet", "t")


def key_of(url: str) -> bytes:
    return bloom_key(url.encode())


def push(admin: FrontierAdmin, url: str, lastmod: int = 0):
    return admin.call(CallBatch(pushes=[(key_of(url), 0, codec.encode(Request(url)), 0, "h", 0,
                                         lastmod)]), worker="w")


def stat(client: redis.Redis, name: str) -> int:
    return int(client.hget(KEYS.stats, name) or 0)


def scheduled(client: redis.Redis) -> list[bytes]:
    return [r for m in client.zrange(KEYS.revisit_index, 0, -1)
            for r in client.lrange(KEYS.revisit_slot(m.decode()), 0, -1)]


def place(client: redis.Redis, url: str) -> bytes | None:
    key, field = KEYS.revisit_place(key_of(url))
    return client.hget(key, field)


def track(admin: FrontierAdmin, url: str, state: State, interval: float, lastmod: int = 1):
    """*url* pushed (with a *lastmod*: the crawl uses sitemaps), leased and acknowledged with
    its record: it is tracked at *interval* seconds; returns its lease."""
    push(admin, url, lastmod)
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    record = revisit_record(first.payload, state.to_meta(), interval, "h", 0, key_of(url))
    assert admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0, record)]),
                      worker="w").acked == 1
    return first


def test_a_newer_lastmod_makes_a_tracked_url_leased_at_once_with_its_state(redis_url):
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    state = State(fetched=now - 100, interval=3600, etag='"v1"', history=[3600])
    track(admin, "http://h/p", state, 3600)
    assert len(scheduled(client)) == 1 and place(client, "http://h/p") is not None
    assert admin.call(CallBatch(take=1), worker="w").leased == []  # due in an hour
    result = push(admin, "http://h/p", lastmod=now - 10)  # modified after the last fetch
    assert result.push_flags == [0] and result.duplicates == 1
    assert stat(client, "revisit_lastmod_due") == 1
    assert place(client, "http://h/p") is None  # it left its slot: no place any more
    leased = admin.call(CallBatch(take=1), worker="w").leased
    assert len(leased) == 1 and leased[0].entry_id.startswith("r")
    request = codec.decode(leased[0].payload, None, DEFAULT_REQUEST_CLASSES)
    assert request.url == "http://h/p"
    assert State.from_meta(request.meta[STATE_META_KEY]) == state  # validators, history kept
    assert scheduled(client) == [b""]  # its record's tombstone, skipped when its slot is due
    assert client.get(KEYS.revisit_count) == b"1"  # still tracked (in the frontier)
    assert client.hget(KEYS.hostq, "h") == b"1"


def test_an_older_or_equal_lastmod_changes_nothing(redis_url):
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    track(admin, "http://h/p", State(fetched=now, interval=3600), 3600)
    before = scheduled(client)
    for lastmod in (now - 3600, now, now + 1):  # (+1 s: the W3C format's clock skew)
        assert push(admin, "http://h/p", lastmod=lastmod).push_flags == [0]
    assert stat(client, "revisit_lastmod_older") == 3 and stat(client, "revisit_lastmod_due") == 0
    assert scheduled(client) == before and place(client, "http://h/p") is not None
    assert admin.call(CallBatch(take=1), worker="w").leased == []


def test_a_record_popped_when_due_is_not_found_by_a_later_lastmod(redis_url):
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    track(admin, "http://h/p", State(fetched=now - 100, interval=1), 0.3)
    time.sleep(0.8)  # due: the next call moves it into the queue (LPOP from its slot)
    due = admin.call(CallBatch(take=1), worker="w").leased
    assert [e.entry_id[0] for e in due] == ["r"] and scheduled(client) == []
    assert client.hlen(KEYS.revisit_popped) == 0  # the slot is gone, and its popped count
    push(admin, "http://h/p", lastmod=now)
    assert stat(client, "revisit_lastmod_unknown") == 1 and stat(client, "revisit_lastmod_due") == 0
    assert place(client, "http://h/p") is None  # the stale entry was deleted by the lookup
    assert admin.call(CallBatch(take=1), worker="w").leased == []  # no second revisit


def test_a_record_behind_popped_ones_is_found_at_its_place(redis_url):
    """Places are absolute: records LPOPped from the head of a slot do not move the others."""
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    bounded = FrontierAdmin(redis_url, "t", params=FrontierParams(queue_max=1))
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    urls = ["http://h/a", "http://h/b", "http://h/c"]
    for url in urls:
        push(admin, url, lastmod=1)
    leased = admin.call(CallBatch(take=3), worker="w").leased
    assert len(leased) == 3
    by_url = {codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url: e for e in leased}
    admin.call(CallBatch(acks=[
        (e.entry_id, e.token, b"", [], 0,
         revisit_record(e.payload, State(fetched=now - 100, interval=1).to_meta(), 0.3, "h", 0,
                        key_of(url)))
        for url, e in sorted(by_url.items())]), worker="w")
    assert len(scheduled(client)) == 3  # one slot: a, b, c at places 0, 1, 2
    time.sleep(0.8)
    bounded.call(CallBatch(), worker="w")  # due, but room for one: a leaves the slot's head
    assert len(scheduled(client)) == 2 and stat(client, "revisit_due") == 1
    assert [int(v) for v in client.hvals(KEYS.revisit_popped)] == [1]
    a = bounded.call(CallBatch(take=1), worker="w").leased[0]
    # a's revisit done (room again) in the call that pushes c with a newer lastmod
    bounded.call(CallBatch(acks=[(a.entry_id, a.token)],
                           pushes=[(key_of("http://h/c"), 0, codec.encode(Request("http://h/c")),
                                    0, "h", 0, now)]), worker="w")
    assert stat(client, "revisit_lastmod_due") == 1
    got = bounded.call(CallBatch(take=1), worker="w").leased
    assert [codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url for e in got] == [
        "http://h/c"]
    assert [codec.decode_dict(r.split(b"\t", 2)[2])["url"] if r else "" for r in
            scheduled(client)] == ["http://h/b", ""]  # b waits; c's tombstone


def test_a_revisit_dropped_with_its_key_leaves_the_index(redis_url):
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    track(admin, "http://h/gone", State(fetched=now - 100, interval=3600), 3600)
    push(admin, "http://h/gone", lastmod=now)  # made due at once
    revisit = admin.call(CallBatch(take=1), worker="w").leased[0]
    # fetched again, and found gone (404 repeated): acknowledged without a record
    assert place(client, "http://h/gone") is None
    again = revisit_record(revisit.payload, State(fetched=now, interval=60).to_meta(), 60, "h",
                           0, key_of("http://h/gone"))
    # (first it is rescheduled: indexed again; then a later revisit drops it with its key)
    admin.call(CallBatch(acks=[(revisit.entry_id, revisit.token, b"", [], 0, again)]),
               worker="w")
    assert place(client, "http://h/gone") is not None
    push(admin, "http://h/gone", lastmod=now + 1000)
    dropped = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(dropped.entry_id, dropped.token, b"", [], 0,
                                key_of("http://h/gone"))]), worker="w")
    assert place(client, "http://h/gone") is None and client.get(KEYS.revisit_count) == b"0"
    assert stat(client, "revisit_dropped") == 1


def test_a_crawl_without_lastmods_writes_no_index(redis_url):
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    track(admin, "http://h/p", State(fetched=int(time.time()), interval=3600), 3600, lastmod=0)
    assert len(scheduled(client)) == 1
    assert client.keys(KEYS.revisit_place_prefix + "*") == []
    assert client.get(KEYS.revisit_lastmod) is None


def test_the_partitions_lean_push_makes_a_tracked_url_due(redis_url):
    """A partitioned crawl pushes the links for another partition with lua/push_lean.lua:
    their lastmod is looked up there as in the frontier call."""
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    state = State(fetched=now - 100, interval=3600, etag='"e"')
    track(admin, "http://h/p", state, 3600)
    script = lua.load(client, "push_lean.lua")
    payload = codec.encode(Request("http://h/p"))

    def lean(lastmod: int, op: str) -> LeanResult:
        reply = script(keys=KEYS.call_keys(PUSH_LEAN_CALL, op),
                       args=[lean_args([(key_of("http://h/p"), 0, payload, "h", 0, lastmod)],
                                       FrontierParams(), "")])
        return LeanResult.from_reply(reply)

    older = lean(now - 1000, "op1")
    assert older.flags == [0] and older.duplicates == 1
    assert stat(client, "revisit_lastmod_older") == 1 and client.get(KEYS.queue_count) == b"0"
    newer = lean(now, "op2")
    assert newer.flags == [0] and stat(client, "revisit_lastmod_due") == 1
    assert client.get(KEYS.queue_count) == b"1" and client.hget(KEYS.hostq, "h") == b"1"
    leased = admin.call(CallBatch(take=1), worker="w").leased
    assert len(leased) == 1 and leased[0].entry_id.startswith("r")
    request = codec.decode(leased[0].payload, None, DEFAULT_REQUEST_CLASSES)
    assert State.from_meta(request.meta[STATE_META_KEY]) == state
    assert place(client, "http://h/p") is None


def test_status_and_metrics_count_what_lastmods_came_to(redis_url):
    from scrapy_fleet.monitoring.metrics import families
    from scrapy_fleet.recrawl.status import read_recrawl

    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    client = redis.Redis.from_url(redis_url)
    now = int(time.time())
    track(admin, "http://h/p", State(fetched=now - 100, interval=3600), 3600)
    push(admin, "http://h/p", lastmod=now - 1000)  # older
    push(admin, "http://h/p", lastmod=now)  # newer: due
    push(admin, "http://h/p", lastmod=now + 10)  # in the frontier now: not in the schedule
    rv = read_recrawl(client, KEYS)
    assert rv["lastmod"] == {"due": 1, "older": 1, "unknown": 1}
    lastmod = next(f for f in families({"recrawl": rv}) if f.name == "scrapy_fleet_recrawl_lastmod")
    assert {s.labels["result"]: s.value for s in lastmod.samples
            if s.name.endswith("_total")} == {"due": 1, "older": 1, "unknown": 1}
