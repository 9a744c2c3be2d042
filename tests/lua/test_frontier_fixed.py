"""The frontier call's fixed part (issue 20): what a call without work skips, and what it must
not.  Lua level: lua/frontier.lua run directly, with the server's clock read from a key
(``redis.call('TIME')`` replaced, as bench/bench_replay.py pins it), so that every step of
time is the test's, not the machine's.

A call without work (nothing named, pushed or taken) runs none of the steps (lua/step_begin.lua,
call_has_work): it still moves a due deferred entry, reclaims an expired lease and resumes a
parked request.  Nor does a call read what is due before the crawl's bound (`next_due`, a
lower bound of every deferred entry's and lease's time): every write of an earlier time (a
lease, an extension, a deferral, a push with a delay, push_lean.lua's too) lowers it, so an
expiring lease is still reclaimed and a due entry still queued on time.  A heartbeat that
tells nothing new is written at most once a second (lua/monitoring.lua): the worker stays
alive by its entry in `workers`, and a change of its heartbeat is written at once; departed
workers are still forgotten by the next call.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgpack
import pytest
import redis

from scrapy_fleet.frontier.lean import lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, call_args
from scrapy_fleet.keys.calls import BLOOM_MAX_SLICES, PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.lua import sources

CLOCK = "test:clock"  # (not a crawl key) the server's time in ms, as the test sets it
T0 = 1_900_000_000_000
PARAMS = FrontierParams(lease_timeout=30.0)
#: what the client reads for a field a reply leaves out (frontier/protocol.py CallResult): a
#: call without events leaves out its lists and counts (lua/step_reply.lua)
LEFT_OUT = {"leased": [], "lost": [], "pf": [], "rf": [], "pd": [], "new": 0, "dup": 0,
            "acked": 0, "released": 0, "reclaimed": 0, "dead": 0, "parked": 0, "deferred": 0,
            "resumed": 0, "refused": 0, "full": False}


class Frontier:
    """lua/frontier.lua on a pinned clock, called as a worker's client calls it."""

    def __init__(self, redis_url: str, crawl: str) -> None:
        self.r = redis.Redis.from_url(redis_url)
        self.keys = CrawlKeys("fleet", crawl)
        self.script = self.pinned("frontier.lua")
        self.lean = self.pinned("push_lean.lua")
        self.prev: dict[str, str] = {}
        self.marker = ""

    def pinned(self, name: str) -> Any:
        """Script *name* with the server's clock read from CLOCK."""
        source = sources.source(name)
        assert "redis.call('TIME')" in source
        clock = ("local function test_time()\n"
                 f"  local ms = tonumber(redis.call('GET', '{CLOCK}'))\n"
                 "  return {string.format('%d', math.floor(ms / 1000)),"
                 " string.format('%d', (ms % 1000) * 1000)}\nend\n")
        return self.r.register_script(clock + source.replace("redis.call('TIME')",
                                                             "test_time()"))

    def call(self, at: int, batch: CallBatch, worker: str = "",
             monitor: bytes = b"", params: FrontierParams = PARAMS) -> dict[str, Any]:
        self.r.set(CLOCK, at)
        op = uuid.uuid4().hex
        keys = self.keys.frontier_keys(op, self.prev.get(worker, "-"), worker)
        raw = self.script(keys=keys, args=[call_args(batch, worker, params, self.marker),
                                           monitor])
        reply: dict[str, Any] = {**LEFT_OUT, **msgpack.unpackb(raw, raw=False)}
        if not reply.get("nc"):  # (as FrontierCall: a reply not cached names no previous op)
            self.prev[worker] = op
        self.marker = reply["mk"]
        return reply

    def push_lean(self, at: int, pushes: list[tuple[bytes, int, bytes, str, int]]) -> None:
        """lua/push_lean.lua (a partition's push-only call) into this crawl's keys."""
        self.r.set(CLOCK, at)
        self.lean(keys=self.keys.call_keys(PUSH_LEAN_CALL, uuid.uuid4().hex),
                  args=[lean_args(pushes, PARAMS, self.marker)])

    def next_due(self) -> int:
        return int(self.r.get(self.keys.next_due))

    def range_reads(self) -> int:
        """ZRANGEBYSCORE commands the server ran so far (what is due read)."""
        stats = self.r.info("commandstats").get("cmdstat_zrangebyscore", {})
        return int(stats.get("calls", 0))


def beat(state: str = "idle", **extra: Any) -> bytes:
    return msgpack.packb({"hb": {"st": state, "l": 0, "dl": 0, "pg": 0, "it": 0, "er": 0,
                                 "h": "m1", "pid": 1, "sa": 1.0},
                          "da": 15000, "fa": 120000, **extra}, use_bin_type=False)


def test_a_call_without_work_still_reclaims_an_expired_lease(redis_url):
    f = Frontier(redis_url, "fixed-reclaim")
    f.call(T0, CallBatch(pushes=[(b"a" * 12, 0, b"x", 0, "h")]))
    taken = f.call(T0 + 10, CallBatch(take=1), "w:busy:1")
    assert len(taken["leased"]) == 1 and taken["inflight"] == 1
    # an idle worker's call, before the lease expires: nothing to do
    quiet = f.call(T0 + 20_000, CallBatch(), "w:idle:1", beat())
    assert (quiet["reclaimed"], quiet["queued"], quiet["inflight"]) == (0, 0, 1)
    # after it: the same empty call reclaims it (the lease ends 30 s after it was taken)
    late = f.call(T0 + 30_011, CallBatch(), "w:idle:1", beat())
    assert (late["reclaimed"], late["queued"], late["inflight"]) == (1, 1, 0)
    assert f.r.hget(f.keys.expiries, taken["leased"][0][0]) == b"1"
    assert f.r.hget(f.keys.stats, "reclaimed") == b"1"


def test_a_call_without_work_still_queues_a_due_deferred_entry(redis_url):
    f = Frontier(redis_url, "fixed-due")
    pushed = f.call(T0, CallBatch(pushes=[(b"d" * 12, 0, b"x", 0, "h", 5000)]))
    assert (pushed["new"], pushed["queued"], pushed["dn"]) == (1, 0, 1)
    assert f.call(T0 + 4000, CallBatch(), "w:idle:1", beat())["dn"] == 1
    due = f.call(T0 + 5000, CallBatch(), "w:idle:1", beat())
    assert (due["queued"], due["dn"], due["idle"]) == (1, 0, -1)
    assert f.r.zcard(f.keys.deferred) == 0


def test_a_call_without_work_still_resumes_a_parked_request(redis_url):
    f = Frontier(redis_url, "fixed-parked")
    f.call(T0, CallBatch(pushes=[(b"p" * 12, 0, b"x", 0, "h")]))
    taken = f.call(T0 + 1, CallBatch(take=1), "w:busy:1")
    assert taken["queued"] == 0
    # a parked request as the acknowledgement step writes one: [id, score, host, payload]
    f.r.rpush(f.keys.parked, msgpack.packb(["parked-1", 0, "h", "payload"]))
    resumed = f.call(T0 + 2, CallBatch(), "w:idle:1", beat())
    assert (resumed["resumed"], resumed["queued"]) == (1, 1)
    assert f.r.llen(f.keys.parked) == 0
    again = f.call(T0 + 3, CallBatch(take=1), "w:busy:2")
    assert [e[:1] + e[2:3] for e in again["leased"]] == [["parked-1", "payload"]]


def test_a_heartbeat_that_tells_nothing_new_is_written_once_a_second_and_keeps_the_worker_alive(
        redis_url):
    f = Frontier(redis_url, "fixed-beat")
    f.call(T0, CallBatch(pushes=[(b"b" * 12, 0, b"x", 0, "h")]))
    worker = "w:beat:1"
    info = f.keys.worker_info(worker)
    f.call(T0 + 100, CallBatch(), worker, beat())
    assert f.r.hget(info, "seen") == str(T0 + 100).encode()
    assert f.r.hget(f.keys.mon, "lw") == str(T0 + 100).encode()
    # the same heartbeat 0.5 s later: the hash is not rewritten, the worker's entry in
    # `workers` (what tells it alive) is
    f.call(T0 + 600, CallBatch(), worker, beat())
    assert f.r.hget(info, "seen") == str(T0 + 100).encode()
    assert f.r.zscore(f.keys.workers, worker) == T0 + 600
    assert f.r.hget(f.keys.mon, "lw") == str(T0 + 100).encode()
    # a heartbeat that changed is written at once
    f.call(T0 + 700, CallBatch(), worker, beat("crawling"))
    assert f.r.hmget(info, "seen", "st") == [str(T0 + 700).encode(), b"crawling"]
    # counter deltas too (and applied once)
    f.call(T0 + 800, CallBatch(), worker, beat("crawling", cs=1, c={"pages": 3}))
    assert f.r.hmget(info, "seen", "cs") == [str(T0 + 800).encode(), b"1"]
    assert f.r.hget(f.keys.stats, "pages") == b"3"
    # the same heartbeat a second after the last write: written again, expiry renewed
    f.call(T0 + 1800, CallBatch(), worker, beat("crawling", cs=1, c={"pages": 3}))
    assert f.r.hget(info, "seen") == str(T0 + 1800).encode()
    assert f.r.hget(f.keys.stats, "pages") == b"3"
    assert f.r.hget(f.keys.mon, "lw") == str(T0 + 1800).encode()
    assert 110_000 < f.r.pttl(info) <= 120_000
    assert f.r.zscore(f.keys.workers, worker) == T0 + 1800


def test_departed_workers_are_forgotten_by_the_next_call(redis_url):
    f = Frontier(redis_url, "fixed-departed")
    f.call(T0, CallBatch(pushes=[(b"g" * 12, 0, b"x", 0, "h")]))
    f.call(T0 + 1, CallBatch(), "w:gone:1", beat())
    f.call(T0 + 2, CallBatch(), "w:here:1", beat())
    # 120 s later (FLEET_WORKER_FORGET_AFTER): a call takes the 10 s sample...
    f.call(T0 + 120_000, CallBatch(), "w:here:1", beat())
    assert f.r.zcard(f.keys.workers) == 2
    sampled = f.r.hget(f.keys.mon, "s1")
    # ...and the next one, with no sample due, forgets the worker silent since
    f.call(T0 + 120_002, CallBatch(), "w:here:1", beat())
    assert f.r.hget(f.keys.mon, "s1") == sampled
    assert [w for w, _ in f.r.zrange(f.keys.workers, 0, -1, withscores=True)] == [b"w:here:1"]


# -- the bound of what may be due (`next_due`, lua/step_begin.lua) ---------------------------


def test_a_call_before_the_bound_reads_nothing_due_and_a_lease_expiring_is_reclaimed(redis_url):
    f = Frontier(redis_url, "due-lease")
    f.call(T0, CallBatch(pushes=[(b"a" * 12, 0, b"x", 0, "h"), (b"b" * 12, 0, b"x", 0, "h2")]))
    assert f.next_due() == 9 * 10**15  # nothing deferred, nothing leased
    taken = f.call(T0 + 10, CallBatch(take=1), "w:busy:1")
    assert f.next_due() == T0 + 30_010  # the lease's expiry lowered it
    reads = f.range_reads()
    quiet = f.call(T0 + 30_009, CallBatch(), "w:idle:1", beat())
    assert (quiet["reclaimed"], quiet["inflight"]) == (0, 1)
    assert f.range_reads() == reads  # before the bound: what is due was not read
    late = f.call(T0 + 30_010, CallBatch(), "w:idle:1", beat())
    assert (late["reclaimed"], late["queued"], late["inflight"]) == (1, 2, 0)
    assert f.r.hget(f.keys.expiries, taken["leased"][0][0]) == b"1"
    assert f.next_due() == 9 * 10**15  # recomputed: nothing left to come due


def test_an_extended_lease_moves_the_reclaim_later_and_a_shorter_extension_earlier(redis_url):
    f = Frontier(redis_url, "due-extend")
    f.call(T0, CallBatch(pushes=[(b"a" * 12, 0, b"x", 0, "h")]))
    entry, token = f.call(T0 + 10, CallBatch(take=1), "w:busy:1")["leased"][0][:2]
    assert f.next_due() == T0 + 30_010
    f.call(T0 + 20_000, CallBatch(extends=[(entry, token)]), "w:busy:1")
    assert f.r.zscore(f.keys.leases, entry) == T0 + 50_000
    assert f.next_due() == T0 + 30_010  # a later expiry: the bound stays a lower bound
    passed = f.call(T0 + 30_010, CallBatch(), "w:idle:1", beat())
    assert (passed["reclaimed"], passed["inflight"]) == (0, 1)
    assert f.next_due() == T0 + 50_000  # passed: recomputed from the leases
    # an extension by a client with a shorter lease: an expiry before the bound lowers it
    f.call(T0 + 31_000, CallBatch(extends=[(entry, token)]), "w:busy:1",
           params=FrontierParams(lease_timeout=5.0))
    assert f.next_due() == T0 + 36_000
    assert f.call(T0 + 35_999, CallBatch(), "w:idle:1", beat())["reclaimed"] == 0
    late = f.call(T0 + 36_000, CallBatch(), "w:idle:1", beat())
    assert (late["reclaimed"], late["queued"], late["inflight"]) == (1, 1, 0)


def test_a_push_with_a_shorter_delay_lowers_the_bound_and_is_queued_when_due(redis_url):
    f = Frontier(redis_url, "due-push")
    f.call(T0, CallBatch(pushes=[(b"l" * 12, 0, b"x", 0, "h", 60_000)]))
    assert f.next_due() == T0 + 60_000
    f.call(T0 + 100, CallBatch(pushes=[(b"s" * 12, 0, b"x", 0, "h", 5_000)]))
    assert f.next_due() == T0 + 5_100
    early = f.call(T0 + 5_099, CallBatch(), "w:idle:1", beat())
    assert (early["queued"], early["dn"]) == (0, 2)
    due = f.call(T0 + 5_100, CallBatch(), "w:idle:1", beat())
    assert (due["queued"], due["dn"], due["idle"]) == (1, 1, -1)
    assert f.next_due() == T0 + 60_000  # the first one left
    # a lease taken now expires before it: lowered again
    f.call(T0 + 5_200, CallBatch(take=1), "w:busy:1")
    assert f.next_due() == T0 + 35_200
    assert f.call(T0 + 35_200, CallBatch(), "w:idle:1", beat())["reclaimed"] == 1
    last = f.call(T0 + 60_000, CallBatch(), "w:idle:1", beat())
    assert (last["queued"], last["dn"]) == (2, 0)
    assert f.r.zcard(f.keys.deferred) == 0


def test_a_lean_push_with_a_delay_lowers_the_bound(redis_url):
    f = Frontier(redis_url, "due-lean")
    f.call(T0, CallBatch(pushes=[(b"l" * 12, 0, b"x", 0, "h", 60_000)]))
    assert f.next_due() == T0 + 60_000
    f.push_lean(T0 + 100, [(b"s" * 12, 0, b"y", "h", 5_000), (b"n" * 12, 0, b"z", "h", 0)])
    assert f.next_due() == T0 + 5_100
    f.push_lean(T0 + 200, [(b"t" * 12, 0, b"y", "h", 9_000)])  # later: the bound stays
    assert f.next_due() == T0 + 5_100
    due = f.call(T0 + 5_100, CallBatch(), "w:idle:1", beat())
    assert (due["queued"], due["dn"]) == (2, 2)


def test_a_deferral_by_an_acknowledgement_lowers_the_bound(redis_url):
    f = Frontier(redis_url, "due-ack")
    f.call(T0, CallBatch(pushes=[(b"l" * 12, 0, b"x", 0, "h", 60_000),
                                 (b"p" * 12, 0, b"x", 0, "h")]))
    entry, token = f.call(T0 + 10, CallBatch(take=1), "w:busy:1")["leased"][0][:2]
    assert f.next_due() == T0 + 30_010
    # its one link's host is at its bound (hm 1, "h2" holds one): nothing pushed, the
    # request is deferred for dd (10 s) after this call
    f.call(T0 + 20, CallBatch(pushes=[(b"o" * 12, 0, b"x", 0, "h2")]))
    acked = f.call(T0 + 1_000, CallBatch(acks=[(entry, token)],
                                         pushes=[(b"k" * 12, 0, b"x", 1, "h2")]),
                   "w:busy:1", params=FrontierParams(lease_timeout=30.0, host_queue_max=1))
    assert acked["deferred"] == 1
    assert f.next_due() == T0 + 11_000
    due = f.call(T0 + 11_000, CallBatch(), "w:idle:1", beat())
    assert (due["queued"], due["dn"]) == (2, 1)


def test_departed_workers_are_looked_for_once_the_oldest_last_call_is_forget_after_old(redis_url):
    f = Frontier(redis_url, "departed-bound")
    f.call(T0, CallBatch(pushes=[(b"g" * 12, 0, b"x", 0, "h")]))  # the push helper: no entry
    assert f.r.get(f.keys.workers_first) == b"9000000000000000"  # none yet
    f.call(T0 + 1, CallBatch(), "w:gone:1", beat())  # before the bound: it becomes the bound
    f.call(T0 + 2, CallBatch(), "w:here:1", beat())
    assert f.r.get(f.keys.workers_first) == str(T0 + 1).encode()
    removals = int(f.r.info("commandstats").get("cmdstat_zremrangebyscore", {}).get("calls", 0))
    f.call(T0 + 60_000, CallBatch(), "w:here:1", beat())
    f.call(T0 + 120_000, CallBatch(), "w:here:1", beat())
    stats = f.r.info("commandstats").get("cmdstat_zremrangebyscore", {})
    assert int(stats.get("calls", 0)) == removals  # no worker could be departed: not looked for
    assert f.r.zcard(f.keys.workers) == 2
    # w:gone's last call is 120 s old: the next call forgets it, and the bound is the oldest
    # last call left (this one's)
    f.call(T0 + 120_001, CallBatch(), "w:here:1", beat())
    assert [w for w, _ in f.r.zrange(f.keys.workers, 0, -1, withscores=True)] == [b"w:here:1"]
    assert f.r.get(f.keys.workers_first) == str(T0 + 120_001).encode()
    # every worker gone (its entry removed by its own leaving: pump._leave), then a new one:
    # its entry is before the stale bound's departure time, and is forgotten on time
    f.r.zrem(f.keys.workers, "w:here:1")
    f.call(T0 + 130_000, CallBatch(), "w:new:1", beat())
    f.call(T0 + 250_000, CallBatch(), "", b"")  # the push helper
    assert f.r.zcard(f.keys.workers) == 0
    f.call(T0 + 250_001, CallBatch(), "w:later:1", beat())
    assert f.r.get(f.keys.workers_first) == str(T0 + 250_001).encode()


def test_expired_leases_past_the_reclaim_limit_are_reclaimed_by_the_next_calls(redis_url):
    f = Frontier(redis_url, "due-limit")
    f.call(T0, CallBatch(pushes=[(bytes([65 + i % 26, 65 + i // 26]) * 6, 0, b"x", 0, f"h{i}")
                                 for i in range(60)]))
    # a few leases expiring later too: the bound after the first 50 is still not after now
    assert len(f.call(T0 + 10, CallBatch(take=57), "w:busy:1")["leased"]) == 57
    assert len(f.call(T0 + 20, CallBatch(take=3), "w:busy:2")["leased"]) == 3
    assert f.next_due() == T0 + 30_010
    first = f.call(T0 + 30_015, CallBatch(), "w:idle:1", beat())
    assert (first["reclaimed"], first["inflight"]) == (50, 10)  # RECLAIM_LIMIT per call
    assert f.next_due() <= T0 + 30_015
    second = f.call(T0 + 30_016, CallBatch(), "w:idle:1", beat())
    assert (second["reclaimed"], second["inflight"]) == (7, 3)
    assert f.next_due() == T0 + 30_020
    third = f.call(T0 + 30_020, CallBatch(), "w:idle:1", beat())
    assert (third["reclaimed"], third["inflight"], third["queued"]) == (3, 0, 60)
    assert f.next_due() == 9 * 10**15


def test_a_call_without_pushes_names_no_bloom_slice_and_a_push_without_them_is_refused(redis_url):
    # keys.frontier_keys(slices=False): a call that pushes nothing leaves the Bloom slices out
    # of its KEYS (only a push reads them); one that pushes must name them
    f = Frontier(redis_url, "slices")
    f.r.set(CLOCK, T0)
    pushes = [(b"k" * 12, 0, b"payload", 0, "h.test")]
    lean = f.keys.frontier_keys("op-lean", "-", "w:1:1", slices=False)
    refused = f.keys.frontier_keys("op-push", "-", "w:1:1", slices=False)
    assert len(lean) == len(f.keys.frontier_keys("x", "-")) - BLOOM_MAX_SLICES
    with pytest.raises(redis.ResponseError, match="must name the Bloom slices"):
        f.script(keys=refused, args=[call_args(CallBatch(pushes=pushes), "w:1:1", PARAMS), b""])
    assert f.r.exists(f.keys.marker, f.keys.op("op-push"), f.keys.bloom_meta) == 0
    reply = msgpack.unpackb(f.script(keys=lean, args=[
        call_args(CallBatch(take=1, beat=True), "w:1:1", PARAMS), b""]), raw=False)
    assert (reply["queued"], reply["size"]) == (0, 0) and reply["mk"]  # (the crawl begun)
    f.call(T0 + 1, CallBatch(pushes=pushes))  # (FrontierCall's keys: the slices with pushes)
    assert f.r.exists(f.keys.bloom_slice(0)) == 1
