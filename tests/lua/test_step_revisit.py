"""lua/step_revisit.lua through the frontier call, with a real redis-server: a record sent with
an acknowledgement is tracked, comes back into the queue when due (without the Bloom filter),
is rescheduled or dropped by its revisit's acknowledgement, within the schedule's bound.
Time passes on the Lua steps' test clock (tests/conftest.py ``lua_clock``), not by sleeping."""

from __future__ import annotations

import time

import redis
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.record import revisit_record
from scrapy_fleet.recrawl.schedule import STATE_META_KEY, State

KEYS = CrawlKeys("fleet", "t")


def admin_of(url: str, **params: object) -> FrontierAdmin:
    return FrontierAdmin(url, "t", params=FrontierParams(**params))  # type: ignore[arg-type]


def push(admin: FrontierAdmin, url: str) -> None:
    admin.push([(bloom_key(url.encode()), 0, codec.encode(Request(url)))])


def record_for(entry, state: State, interval_s: float, host: str = "h") -> list:
    return revisit_record(entry.payload, state.to_meta(), interval_s, host, 0)


def stat(client: redis.Redis, name: str) -> int:
    return int(client.hget(KEYS.stats, name) or 0)


def scheduled(client: redis.Redis) -> int:
    return sum(client.llen(KEYS.revisit_slot(m.decode()))
               for m in client.zrange(KEYS.revisit_index, 0, -1))


def test_a_tracked_page_comes_back_when_due_and_its_revisit_is_rescheduled(redis_url,
                                                                          lua_clock):
    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/p")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    state = State(fetched=int(time.time()), interval=1, etag='"v1"')
    done = admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                       record_for(first, state, 0.3))]), worker="w")
    assert done.acked == 1
    assert (done.revisits_tracked, client.get(KEYS.revisit_count)) == (1, b"1")
    assert scheduled(client) == 1 and client.get(KEYS.queue_count) in (None, b"0")
    assert done.idle_ms == -1 and done.next_revisit is not None  # not idle: a revisit waits
    assert stat(client, "revisit_tracked") == 1
    # not due yet: nothing to lease
    assert admin.call(CallBatch(take=1), worker="w").leased == []
    lua_clock(0.8)  # the slot of a 300 ms interval (256 ms wide) is due by then
    again = admin.call(CallBatch(take=1), worker="w")
    assert len(again.leased) == 1
    revisit = again.leased[0]
    assert revisit.entry_id.startswith("r") and revisit.entry_id != first.entry_id
    request = codec.decode(revisit.payload, None, DEFAULT_REQUEST_CLASSES)
    assert request.url == "http://h/p"
    assert State.from_meta(request.meta[STATE_META_KEY]) == state
    assert scheduled(client) == 0 and stat(client, "revisit_due") == 1
    # the URL is still in the Bloom filter: pushing it again is a duplicate
    assert admin.push([(bloom_key(b"http://h/p"), 0, codec.encode(Request("http://h/p")))]
                      ).push_flags == [0]
    # its acknowledgement with a record schedules it again, the count unchanged
    newer = State(fetched=int(time.time()), interval=60, history=[-1])
    admin.call(CallBatch(acks=[(revisit.entry_id, revisit.token, b"", [], 0,
                                record_for(revisit, newer, 60))]), worker="w")
    assert client.get(KEYS.revisit_count) == b"1" and scheduled(client) == 1
    assert stat(client, "revisit_rescheduled") == 1
    slot = client.zrange(KEYS.revisit_index, 0, -1)[0].decode()
    host, score, payload = client.lindex(KEYS.revisit_slot(slot), 0).split(b"\t", 2)
    assert (host, score) == (b"h", b"0")
    kept = codec.decode(payload, None, DEFAULT_REQUEST_CLASSES)
    assert State.from_meta(kept.meta[STATE_META_KEY]) == newer


def test_a_revisit_acknowledged_without_a_record_leaves_the_schedule(redis_url, lua_clock):
    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/gone")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                record_for(first, State(fetched=1), 0.3))]), worker="w")
    lua_clock(0.8)
    revisit = admin.call(CallBatch(take=1), worker="w").leased[0]
    done = admin.call(CallBatch(acks=[(revisit.entry_id, revisit.token, b"", [], 0, b"")]),
                      worker="w")
    assert done.acked == 1 and done.revisits_tracked == 0
    assert stat(client, "revisit_dropped") == 1
    assert scheduled(client) == 0 and done.idle_ms >= 0  # nothing left: the fleet is idle


def test_a_revisit_dead_lettered_after_its_leases_expired_leaves_the_count(redis_url,
                                                                          lua_clock):
    admin = admin_of(redis_url, lease_timeout=0.5, max_leases=1)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/slow")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                record_for(first, State(fetched=1), 0.3))]), worker="w")
    assert client.get(KEYS.revisit_count) == b"1"
    lua_clock(0.8)
    revisit = admin.call(CallBatch(take=1), worker="w").leased[0]
    assert revisit.entry_id.startswith("r")
    lua_clock(0.7)  # its lease expires (once: max_leases 1): it is dead-lettered
    done = admin.call(CallBatch(), worker="w2")
    assert done.dead_lettered == 1 and client.hexists(KEYS.dead, revisit.entry_id)
    assert client.get(KEYS.revisit_count) == b"0" and scheduled(client) == 0
    assert done.revisits_tracked == 0 and done.idle_ms >= 0  # nothing tracked: idle
    assert stat(client, "revisit_dropped") == 1


def test_a_stale_acknowledgement_tracks_nothing(redis_url, lua_clock):
    admin = admin_of(redis_url, lease_timeout=1.0)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/x")
    first = admin.call(CallBatch(take=1), worker="w1").leased[0]
    lua_clock(1.2)
    second = admin.call(CallBatch(take=1), worker="w2").leased[0]  # reclaimed, leased again
    stale = admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                        record_for(first, State(fetched=1), 5))]), worker="w1")
    assert stale.lost == [first.entry_id]
    assert client.get(KEYS.revisit_count) is None and scheduled(client) == 0
    admin.call(CallBatch(acks=[(second.entry_id, second.token, b"", [], 0,
                                record_for(second, State(fetched=1), 5))]), worker="w2")
    assert client.get(KEYS.revisit_count) == b"1" and scheduled(client) == 1


def test_past_the_bound_new_pages_are_not_tracked_and_counted(redis_url):
    admin = admin_of(redis_url, recrawl_max=2)
    client = redis.Redis.from_url(redis_url)
    for i in range(3):
        push(admin, f"http://h/{i}")
    leased = admin.call(CallBatch(take=3), worker="w").leased
    assert len(leased) == 3
    admin.call(CallBatch(acks=[(e.entry_id, e.token, b"", [], 0, record_for(e, State(), 60))
                               for e in leased]), worker="w")
    assert client.get(KEYS.revisit_count) == b"2" and scheduled(client) == 2
    assert stat(client, "revisit_untracked") == 1


def test_due_revisits_wait_while_the_frontier_is_full(redis_url, lua_clock):
    admin = admin_of(redis_url, queue_max=1)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/a")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                record_for(first, State(fetched=1), 0.3))]), worker="w")
    push(admin, "http://h/b")  # the frontier is full (1 queued)
    lua_clock(0.8)
    admin.call(CallBatch(), worker="w")
    assert scheduled(client) == 1 and stat(client, "revisit_due") == 0
    got = admin.call(CallBatch(take=1), worker="w").leased  # b leaves the queue: room
    assert [codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url for e in got] == [
        "http://h/b"]
    admin.call(CallBatch(acks=[(got[0].entry_id, got[0].token)]), worker="w")
    back = admin.call(CallBatch(take=1), worker="w").leased
    assert [e.entry_id[0] for e in back] == ["r"] and scheduled(client) == 0


def test_a_corrupt_record_in_the_schedule_is_dead_lettered_not_lost(redis_url):
    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.rpush(KEYS.revisit_slot("8:1"), b"no tabs here")
    client.zadd(KEYS.revisit_index, {"8:1": 512})
    result = admin.call(CallBatch(take=1), worker="w")
    assert result.leased == [] and result.dead_lettered == 1
    assert stat(client, "revisit_bad_records") == 1
    assert scheduled(client) == 0


def test_status_shows_the_schedule_and_metrics_have_prometheus_names(redis_url):
    from scrapy_fleet.monitoring.metrics import families
    from scrapy_fleet.recrawl.status import read_recrawl

    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    for i in range(2):
        push(admin, f"http://h/{i}")
    leased = admin.call(CallBatch(take=2), worker="w").leased
    states = [State(fetched=1, interval=3600, history=[-3600] * 4),
              State(fetched=1, interval=600, history=[600] * 4)]
    admin.call(CallBatch(acks=[
        (leased[0].entry_id, leased[0].token, b"", [], 0, record_for(leased[0], states[0], 0.3)),
        (leased[1].entry_id, leased[1].token, b"", [], 0, record_for(leased[1], states[1], 3600))]),
        worker="w")
    client.hset(KEYS.stats, mapping={"revisit_not_modified": 3, "revisit_changed": 1})
    time.sleep(0.8)  # (the snapshot reads TIME itself: the test clock does not move it)
    rv = read_recrawl(client, KEYS)
    assert (rv["tracked"], rv["scheduled"], rv["due"], rv["overdue"]) == (2, 2, 1, 0)
    assert rv["next_due_in"] == 0  # one is due now
    assert rv["not_modified_share"] == 0.75 and rv["sampled"] == 2
    assert sum(rv["change_rates"].values()) == 2 and 0 < rv["freshness_estimate"] < 1
    from scrapy_fleet.monitoring import screen
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    snap = read_snapshot(client, KEYS)
    assert snap["recrawl"]["tracked"] == 2
    assert "recrawl    tracked 2  scheduled 2  due now 1  overdue 0  next due" in screen.render(
        snap)
    names = {f.name for f in families({"recrawl": rv})}
    assert {"scrapy_fleet_recrawl_tracked_urls", "scrapy_fleet_recrawl_revisits",
            "scrapy_fleet_recrawl_outcomes", "scrapy_fleet_recrawl_freshness_ratio"} <= names


def test_the_schedule_survives_a_redis_restart_from_its_append_only_file(tmp_path,
                                                                        lua_clock):
    from testsite.processes import RedisServer

    with RedisServer(tmp_path / "redis", persistent=True) as server:
        admin = admin_of(server.url)
        push(admin, "http://h/aof")
        first = admin.call(CallBatch(take=1), worker="w").leased[0]
        state = State(fetched=1, interval=1, etag='"e"')
        admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                    record_for(first, state, 0.3))]), worker="w")
        server.kill()  # SIGKILL: the AOF has every acknowledged write (appendfsync always)
        server.start()
        client = server.client()
        assert client.get(KEYS.revisit_count) == b"1" and scheduled(client) == 1
        lua_clock(0.8, client)
        again = admin_of(server.url).call(CallBatch(take=1), worker="w2").leased
        assert [e.entry_id[0] for e in again] == ["r"]
        request = codec.decode(again[0].payload, None, DEFAULT_REQUEST_CLASSES)
        assert State.from_meta(request.meta[STATE_META_KEY]) == state


def test_a_purge_ends_the_recrawl(redis_url):
    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    push(admin, "http://h/p")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                record_for(first, State(fetched=1), 60))]), worker="w")
    assert scheduled(client) == 1
    admin.purge()
    assert client.keys("fleet:{t}:rv*") == []
    # the crawl pushed again starts a new schedule: the URL is new to the filter and tracked
    fresh = admin_of(redis_url)
    push(fresh, "http://h/p")
    again = fresh.call(CallBatch(take=1), worker="w").leased[0]
    assert not again.entry_id.startswith("r")
    fresh.call(CallBatch(acks=[(again.entry_id, again.token, b"", [], 0,
                                record_for(again, State(fetched=2), 60))]), worker="w")
    assert client.get(KEYS.revisit_count) == b"1" and scheduled(client) == 1


def test_a_partitions_idle_probe_counts_scheduled_revisits_as_work(redis_url):
    """A partitioned crawl's idle sweep (lua/partition_probe.lua) must not close a crawl whose
    only work left is scheduled revisits, nor start the partition's idle clock."""
    from scrapy_fleet import lua
    from scrapy_fleet.keys.calls import PROBE_CALL

    admin = admin_of(redis_url)
    client = redis.Redis.from_url(redis_url)
    probe = lua.load(client, "partition_probe.lua")
    push(admin, "http://h/p")
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    state = State(fetched=int(time.time()), interval=3600)
    admin.call(CallBatch(acks=[(first.entry_id, first.token, b"", [], 0,
                                record_for(first, state, 3600))]), worker="w")
    assert scheduled(client) == 1
    reply = probe(keys=KEYS.call_keys(PROBE_CALL), args=["1"])
    assert reply[0] == -1 and reply[1:5] == [0, 0, 0, 0]  # busy, though nothing is queued
    assert client.get(KEYS.idle_since) is None
    client.delete(KEYS.revisit_index)  # the schedule gone: idle, and its clock starts
    reply = probe(keys=KEYS.call_keys(PROBE_CALL), args=["1"])
    assert reply[0] == 0 and client.get(KEYS.idle_since) is not None
