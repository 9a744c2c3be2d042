"""The frontier script against a real redis-server: order, leases, fencing, dead letters."""

from __future__ import annotations

import pytest
import redis
from scrapy import Request
from support import wait_server_past

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def make_admin(url: str, crawl: str = "t", lease: float = 30.0, max_leases: int = 3):
    return FrontierAdmin(url, crawl, params=FrontierParams(lease_timeout=lease,
                                                           max_leases=max_leases))


def entry(url: str, priority: int = 0, dont_filter: bool = False):
    req = Request(url, priority=priority, dont_filter=dont_filter)
    key = b"" if dont_filter else bloom_key(url.encode())
    return key, priority, codec.encode(req)


def urls_of(result):
    return [codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url for e in result.leased]


def test_priority_first_then_fifo(redis_url):
    admin = make_admin(redis_url)
    pushes = [entry("http://h/a1", 0), entry("http://h/b1", 5), entry("http://h/a2", 0),
              entry("http://h/c1", -3), entry("http://h/b2", 5), entry("http://h/a3", 0)]
    admin.push(pushes)
    taken = []
    for _ in range(3):  # several calls: order holds across batches
        taken += urls_of(admin.call(CallBatch(take=2), worker="w"))
    assert taken == ["http://h/b1", "http://h/b2", "http://h/a1", "http://h/a2", "http://h/a3",
                     "http://h/c1"]


def test_identical_dont_filter_requests_are_two_entries(redis_url):
    admin = make_admin(redis_url)
    result = admin.push([entry("http://h/same", dont_filter=True)] * 2)
    assert (result.pushed, result.duplicates) == (2, 0)
    leased = admin.call(CallBatch(take=10), worker="w")
    assert urls_of(leased) == ["http://h/same", "http://h/same"]
    assert len({e.entry_id for e in leased.leased}) == 2


def test_duplicates_are_filtered_and_flagged(redis_url):
    admin = make_admin(redis_url)
    first = admin.push([entry("http://h/1"), entry("http://h/2"), entry("http://h/1")])
    assert first.push_flags == [1, 1, 0]
    again = admin.push([entry("http://h/2"), entry("http://h/3")])
    assert again.push_flags == [0, 1]
    assert admin.status()["queued"] == 3
    assert admin.status()["seen"] == 3


def test_expired_lease_is_redelivered_and_stale_token_is_fenced(redis_url):
    admin = make_admin(redis_url, lease=1.0)
    admin.push([entry("http://h/x")])
    first = admin.call(CallBatch(take=1), worker="dead-worker").leased[0]
    assert admin.call(CallBatch(take=1), worker="w2").leased == []  # leased, not queued
    wait_server_past(admin.client, admin.client.zscore(admin.keys.leases, first.entry_id))
    second = admin.call(CallBatch(take=1), worker="w2")
    assert second.reclaimed == 1
    again = second.leased[0]
    assert (again.entry_id, again.expiries) == (first.entry_id, 1)
    assert again.token > first.token
    # the first worker comes back and acknowledges with its stale token: nothing changes
    stale = admin.call(CallBatch(acks=[(first.entry_id, first.token)]), worker="dead-worker")
    assert (stale.acked, stale.lost) == (0, [first.entry_id])
    assert admin.status()["leased"] == 1
    # a stale extension is refused too, the current one works
    ext = admin.call(CallBatch(extends=[(first.entry_id, first.token),
                                        (again.entry_id, again.token)]), worker="w2")
    assert ext.lost == [first.entry_id]
    ok = admin.call(CallBatch(acks=[(again.entry_id, again.token)]), worker="w2")
    assert (ok.acked, ok.lost) == (1, [])
    status = admin.status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0)
    client = redis.Redis.from_url(redis_url)
    assert client.hlen(admin.keys.data) == 0  # the payload is gone with the ack


def test_extension_keeps_a_lease_alive(redis_url):
    admin = make_admin(redis_url, lease=1.0)
    admin.push([entry("http://h/long")])
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    first_expiry = expiry = admin.client.zscore(admin.keys.leases, lease.entry_id)
    for _ in range(3):
        # half the lease left by the Redis clock (the scripts' clock), not by a sleep of ours
        wait_server_past(admin.client, expiry - 500)
        result = admin.call(CallBatch(extends=[(lease.entry_id, lease.token)]), worker="w")
        assert result.lost == [] and result.reclaimed == 0
        expiry = admin.client.zscore(admin.keys.leases, lease.entry_id)
    assert result.now_ms > first_expiry  # alive past the expiry it was leased with
    assert admin.status()["leased"] == 1


def test_dead_letter_after_max_lease_expiries(redis_url):
    admin = make_admin(redis_url, lease=0.2, max_leases=2)  # (the test waits for each expiry)
    admin.push([entry("http://h/poison")])
    for _ in range(2):
        (leased,) = admin.call(CallBatch(take=1), worker="w").leased
        wait_server_past(admin.client, admin.client.zscore(admin.keys.leases, leased.entry_id))
    result = admin.call(CallBatch(take=1), worker="w")
    assert result.leased == [] and result.dead_lettered == 1
    letters = list(admin.dead_letters())
    assert len(letters) == 1
    assert letters[0]["reason"] == "lease expired 2 times"
    assert codec.decode_dict(letters[0]["data"])["url"] == "http://h/poison"
    assert admin.status()["queued"] == 0


def test_release_requeues_without_counting_an_expiry(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/r", priority=4), entry("http://h/s")])
    got = admin.call(CallBatch(take=2), worker="w").leased
    admin.call(CallBatch(releases=[(e.entry_id, e.token) for e in got]), worker="w")
    again = admin.call(CallBatch(take=2), worker="w2")
    assert urls_of(again) == ["http://h/r", "http://h/s"]  # priority kept
    assert [e.expiries for e in again.leased] == [0, 0]


def test_worker_reported_dead_letter_keeps_reason(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/bad")])
    e = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(dead=[(e.entry_id, e.token, "RequestDecodeError: corrupt")]),
               worker="w")
    assert [d["reason"] for d in admin.dead_letters()] == ["RequestDecodeError: corrupt"]
    assert admin.status()["leased"] == 0


def test_repeated_call_replays_instead_of_running_twice(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry(f"http://h/{i}") for i in range(5)])
    first = admin.call(CallBatch(take=2), worker="w", op_id="op-1")
    replay = admin.call(CallBatch(take=2), worker="w", op_id="op-1")
    assert [(e.entry_id, e.token, e.payload) for e in replay.leased] == [
        (e.entry_id, e.token, e.payload) for e in first.leased]
    assert admin.status()["queued"] == 3  # the replay leased nothing more
    pushed = admin.call(CallBatch(pushes=[entry("http://h/new")]), op_id="op-2")
    admin.call(CallBatch(pushes=[entry("http://h/new")]), op_id="op-2")
    assert pushed.push_flags == [1]
    assert admin.status()["queued"] == 4


def test_fleet_idle_time_is_tracked_on_the_server(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/only")])
    busy = admin.call(CallBatch(take=1), worker="w")
    assert busy.idle_ms == -1  # leased, so not idle
    admin.call(CallBatch(acks=[(busy.leased[0].entry_id, busy.leased[0].token)]), worker="w")
    since = int(admin.client.get(admin.keys.idle_since))  # the server's ms
    wait_server_past(admin.client, since + 250)
    later = admin.call(CallBatch(take=1), worker="w")
    # idle for as long as the server's clock says, however slow the machine
    assert later.idle_ms == later.now_ms - since >= 250
    admin.push([entry("http://h/more")])
    assert admin.call(CallBatch(), worker="w").idle_ms == -1
    assert admin.status()["idle_seconds"] is None


def test_every_key_carries_the_crawl_hash_tag_and_purge_is_scoped(redis_url):
    admin = make_admin(redis_url, crawl="alpha")
    other = make_admin(redis_url, crawl="beta")
    admin.push([entry("http://h/1"), entry("http://h/2", dont_filter=True)])
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(lease.entry_id, lease.token)]), worker="w")
    other.push([entry("http://h/1")])
    client = redis.Redis.from_url(redis_url)
    names = sorted(k.decode() for k in client.keys("*"))
    assert names and all(n.startswith(("fleet:{alpha}:", "fleet:{beta}:")) for n in names)
    assert admin.purge() > 0
    assert all(k.startswith(b"fleet:{beta}:") for k in client.keys("*"))
    assert other.status()["queued"] == 1


def test_bad_call_argument_is_refused_before_any_write(redis_url):
    admin = make_admin(redis_url)
    with pytest.raises(redis.ResponseError, match="bad push entry"):
        admin.call(CallBatch(pushes=[(b"short", 0, b"\x01x")]))
    assert redis.Redis.from_url(redis_url).dbsize() == 0
