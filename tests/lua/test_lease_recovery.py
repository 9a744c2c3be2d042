"""A dead worker's leases back in the frontier once its silence passes FLEET_WORKER_DEAD_AFTER,
long before FLEET_LEASE_TIMEOUT (lua/step_recover.lua, lua/beat.lua; issue 30), against a
real redis-server: the holder's silence is counted on Redis's clock, a beat keeps a holder
alive, a worker is never dead to itself, an outage of Redis makes nobody dead, and fencing
still refuses the dead worker's acknowledgements."""

from __future__ import annotations

import time

from scrapy import Request
from support import server_ms, wait_server_past

from scrapy_fleet import codec, lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import BEAT_CALL

DEAD_MS = 1000  # FLEET_WORKER_DEAD_AFTER of these tests (the lease timeout is 60 s)


def make_admin(url: str, dead_after: float = DEAD_MS / 1000) -> FrontierAdmin:
    return FrontierAdmin(url, "t", params=FrontierParams(lease_timeout=60.0,
                                                         dead_after=dead_after))


def entry(url: str) -> tuple[bytes, int, bytes]:
    return bloom_key(url.encode()), 0, codec.encode(Request(url))


def beat(admin: FrontierAdmin, worker: str) -> int:
    """One sign of life of *worker* (lua/beat.lua), as its liveness thread sends it."""
    script = lua.load(admin.client, "beat.lua")
    return int(script(keys=admin.keys.call_keys(BEAT_CALL), args=[worker, DEAD_MS]))


def calls_until(admin: FrontierAdmin, worker: str, until_ms: int, beats: tuple[str, ...] = ()):
    """*worker* calls (nothing to do: a poll) and *beats* beat every 0.1 s until the server's
    clock passes *until_ms*; returns the replies."""
    replies = []
    while server_ms(admin.client) <= until_ms:
        replies.append(admin.call(CallBatch(), worker=worker))
        for who in beats:
            beat(admin, who)
        time.sleep(0.1)
    return replies


def leased_by(admin: FrontierAdmin, worker: str, n: int):
    leased = admin.call(CallBatch(take=n), worker=worker).leased
    assert len(leased) == n
    return leased


def test_a_dead_holders_leases_come_back_and_its_acks_are_fenced(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry(f"http://h/{i}") for i in range(3)])
    mine = leased_by(admin, "dead", 2)
    started = server_ms(admin.client)
    replies = calls_until(admin, "live", started + DEAD_MS + 300)
    assert sum(r.reclaimed for r in replies) == 2
    took = admin.call(CallBatch(take=5), worker="live")
    assert sorted(e.entry_id for e in took.leased if e.expiries == 1) == sorted(
        e.entry_id for e in mine)
    assert len(took.leased) == 3
    stats = admin.client.hgetall(admin.keys.stats)
    assert (stats[b"recovered"], stats[b"reclaimed"]) == (b"2", b"2")
    # the dead worker comes back: its acknowledgements carry stale tokens
    late = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in mine]), worker="dead")
    assert (late.acked, sorted(late.lost)) == (0, sorted(e.entry_id for e in mine))
    assert admin.status()["leased"] == 3
    # nothing of the dead worker is left in the index; the live one holds three
    assert admin.client.zcard(admin.keys.held) == 3
    assert admin.client.zscore(admin.keys.holders, "dead") is None


def test_a_beating_holder_keeps_its_leases(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/a"), entry("http://h/b")])
    mine = leased_by(admin, "busy", 1)
    started = server_ms(admin.client)
    # its reactor is busy (no frontier call), its thread beats: never dead
    replies = calls_until(admin, "other", started + 3 * DEAD_MS, beats=("busy",))
    assert sum(r.reclaimed for r in replies) == 0
    assert admin.client.hget(admin.keys.stats, "recovered") is None
    done = admin.call(CallBatch(acks=[(mine[0].entry_id, mine[0].token)]), worker="busy")
    assert (done.acked, done.lost) == (1, [])


def test_a_worker_is_never_dead_to_itself(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/a"), entry("http://h/b")])
    mine = leased_by(admin, "slow", 1)
    admin.call(CallBatch(), worker="other")  # a worker of the crawl from now on
    started = server_ms(admin.client)
    # another worker beats (Redis is reachable, no gap) but makes no call that would look;
    # the silent holder's own next call finds its own lease, not a dead worker's
    while server_ms(admin.client) <= started + DEAD_MS + 300:
        beat(admin, "other")
        time.sleep(0.1)
    back = admin.call(CallBatch(extends=[(mine[0].entry_id, mine[0].token)]), worker="slow")
    assert (back.reclaimed, back.lost) == (0, [])
    assert admin.client.zscore(admin.keys.holders, "slow") is not None


def test_a_beat_writes_nothing_for_a_worker_the_crawl_does_not_have(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/a")])
    leased_by(admin, "w1", 1)
    lw = admin.client.hget(admin.keys.mon, "lw")
    wait_server_past(admin.client, server_ms(admin.client) + DEAD_MS + 100)
    beat(admin, "stranger")  # never made a frontier call: not a worker of this crawl
    assert admin.client.hget(admin.keys.mon, "lw") == lw
    assert admin.client.zscore(admin.keys.workers, "stranger") is None
    # the crawl is purged while w1 still runs: its beats bring none of the keys back
    admin.client.flushdb()
    beat(admin, "w1")
    assert admin.client.keys("*") == []


def test_an_outage_of_redis_makes_no_worker_dead(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/a"), entry("http://h/b")])
    mine = leased_by(admin, "w1", 1)
    # nobody reaches Redis for longer than the death delay (as in an outage)
    wait_server_past(admin.client, server_ms(admin.client) + DEAD_MS + 300)
    back = server_ms(admin.client)
    first = admin.call(CallBatch(), worker="w2")  # the first call after the gap
    assert first.reclaimed == 0
    assert int(admin.client.get(admin.keys.alive_from)) >= back
    # w1 beats again within the delay, counted from the gap's end: still alive
    beat(admin, "w1")
    replies = calls_until(admin, "w2", back + DEAD_MS // 2)
    assert sum(r.reclaimed for r in replies) == 0
    # w1 never comes back: dead one delay after its last beat
    replies = calls_until(admin, "w2", server_ms(admin.client) + DEAD_MS + 300)
    assert sum(r.reclaimed for r in replies) == 1
    assert admin.call(CallBatch(take=2), worker="w2").leased[0].entry_id == mine[0].entry_id


def test_without_the_death_delay_only_the_lease_timeout_ends_a_lease(redis_url):
    admin = make_admin(redis_url, dead_after=0.0)
    admin.push([entry("http://h/a")])
    leased_by(admin, "dead", 1)
    replies = calls_until(admin, "live", server_ms(admin.client) + DEAD_MS + 300)
    assert sum(r.reclaimed for r in replies) == 0


def test_a_page_that_kills_its_workers_ends_in_the_dead_letters(redis_url):
    admin = make_admin(redis_url)
    admin.push([entry("http://h/poison")])
    for n in range(3):  # FLEET_MAX_LEASES: 3
        leased_by(admin, f"victim{n}", 1)
        replies = calls_until(admin, "live", server_ms(admin.client) + DEAD_MS + 300)
        assert sum(r.reclaimed + r.dead_lettered for r in replies) == 1
    assert admin.status()["dead"] == 1
    assert admin.status()["queued"] == 0


def test_a_restart_with_the_same_worker_id_takes_back_its_predecessors_leases(redis_url):
    first = make_admin(redis_url)
    first.push([entry("http://h/a"), entry("http://h/b")])
    mine = leased_by(first, "pod-0", 1)
    leased_by(first, "pod-1", 1)
    # pod-0 dies; its successor (same FLEET_WORKER_ID, a new process: a client that has not
    # seen the crawl marker) would keep its predecessor's leases alive with its own beats
    successor = make_admin(redis_url)
    successor.calls.keep_marker = True  # (as a worker's client: its first call says so, nw)
    reply = successor.call(CallBatch(take=2), worker="pod-0")
    assert reply.reclaimed == 1
    assert [e.entry_id for e in reply.leased] == [mine[0].entry_id]
    # later calls of the same process take nothing back from it
    again = successor.call(CallBatch(), worker="pod-0")
    assert again.reclaimed == 0
    assert first.status()["leased"] == 2
