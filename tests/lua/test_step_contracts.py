"""A contract test per step of the frontier call (scrapy_fleet/lua/step_*.lua, queue.lua,
frontier_state.lua, monitoring.lua, failed.lua), against a real redis-server.

Each test sets a crawl up, reads the whole keyspace (support.keyspace), makes one frontier call
through the driver (FrontierAdmin.call) that exercises that step, and reads the keyspace again:
the step's writes are there (keys, fields, counts), and no key changed that neither the step's
header nor the parts every call runs (step_check, step_begin, step_idle, step_reply) name.
The tests go by the headers' promises, not by the scripts' internals: the scripts may be
rewritten (fewer commands, writes skipped when nothing changed) as long as the headers hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack
import pytest
import redis
from support import changed_keys, keyspace, monitor_payload, server_ms, wait_server_past

from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams
from scrapy_fleet.keys.calls import BLOOM_MAX_SLICES, MONITOR_CALL
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys

CRAWL = "contract"
WORKER = "w1:1:1"

#: what every call may write whatever it carries: the parts every call runs.  step_begin
#: (marker, layout: once per crawl; next_due, the bound of what may be due), step_idle
#: (idle_since, queue_count, workers, holders), step_reply (stats, op, prev_op),
#: lua/monitoring.lua (a worker's heartbeat hash, `mon`, departed workers and workers_first,
#: their bound, a sample of the series once per step fleet-wide), step_recover (alive_from
#: after a gap, a dead holder without leases leaves holders)
EVERY_CALL = ("marker", "layout", "next_due", "idle_since", "queue_count", "workers",
              "workers_first", "stats", "op",
              "prev_op", "holders", "alive_from", *MONITOR_CALL)
#: lua/queue.lua's keys (a step that says "the queue's")
QUEUE = ("queue_count", "leases", "deferred", "queue_index", "bucket_prefix", "ready", "data",
         "expiries", "lease", "held")
#: lua/frontier_state.lua's keys (a step that says "the state's")
STATE = ("lease", "leases", "hostlive", "wlive", "hostq", "ready", "data", "dead", "seq",
         "stats")
#: the filter's keys (lua/bloom.lua)
FILTER = ("bloom_meta", "bloom_slices")


def key_names(keys: CrawlKeys, names: Iterable[str], worker: str = WORKER) -> tuple[set[str],
                                                                                  list[str]]:
    """The key names the declared *names* stand for: exact names, and prefixes (the queue's
    buckets, the reply caches of any op id)."""
    exact: set[str] = set()
    prefixes: list[str] = []
    for name in names:
        if name in ("bucket_prefix", "revisit_prefix", "revisit_place_prefix"):
            prefixes.append(getattr(keys, name))
        elif name in ("op", "prev_op"):
            prefixes.append(keys.op(""))
        elif name == "bloom_slices":
            exact.update(keys.bloom_slice(n) for n in range(BLOOM_MAX_SLICES))
        elif name == "worker_info":
            exact.add(keys.worker_info(worker))
        elif name.startswith("series_"):
            exact.add(keys.series(name.removeprefix("series_")))
        else:
            exact.add(getattr(keys, name))
    return exact, prefixes


def unnamed(keys: CrawlKeys, written: set[str], *names: str, worker: str = WORKER) -> set[str]:
    """The keys of *written* that neither *names* nor EVERY_CALL name (*worker*: the caller,
    whose heartbeat hash every call writes)."""
    exact, prefixes = key_names(keys, (*names, *EVERY_CALL), worker)
    return {k for k in written if k not in exact and not any(k.startswith(p) for p in prefixes)}


class Crawl:
    """A crawl in the test's redis-server, driven through FrontierAdmin (the frontier call)."""

    def __init__(self, url: str, **params: Any) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url)
        self.keys = CrawlKeys("fleet", CRAWL)
        self.admin = self.driver(**params)
        self.admin.call(CallBatch(beat=True), worker=WORKER)  # marker, layout: once per crawl

    def driver(self, **params: Any) -> FrontierAdmin:
        return FrontierAdmin(self.url, CRAWL, params=FrontierParams(**params))

    def call(self, batch: CallBatch, admin: FrontierAdmin | None = None, worker: str = WORKER,
             **kwargs: Any) -> tuple[CallResult, set[str]]:
        """One call; its result and the names of the keys it wrote."""
        before = keyspace(self.client)
        result = (admin or self.admin).call(batch, worker=worker, **kwargs)
        return result, changed_keys(before, keyspace(self.client))

    def push(self, *urls: str, host: str = "h.test", priority: int = 0,
             delay_ms: int = 0) -> CallResult:
        return self.admin.call(CallBatch(pushes=[
            (url.encode()[-12:].rjust(12, b"_"), priority, url.encode(), 0, host, delay_ms)
            for url in urls]))

    def bucket(self, host: str = "h.test") -> list[bytes]:
        """The entries of *host*'s buckets, in the order they are leased."""
        names = sorted(k for k in self.client.scan_iter(match=self.keys.bucket_prefix + "*")
                       if k.decode().split(":")[-1].startswith(host + "\t"))
        return [e for name in names for e in self.client.lrange(name, 0, -1)]

    def stat(self, field: str) -> int:
        return int(self.client.hget(self.keys.stats, field) or 0)

    def server_ms(self) -> int:
        return server_ms(self.client)

    def wait_server_past(self, ms: float) -> None:
        wait_server_past(self.client, ms)


@pytest.fixture
def crawl(redis_url):
    crawl = Crawl(redis_url)
    yield crawl
    crawl.client.close()


def lease_one(crawl: Crawl, *urls: str, **kwargs: Any) -> Any:
    crawl.push(*(urls or ("http://h.test/a",)))
    result = crawl.admin.call(CallBatch(take=1), worker=WORKER, **kwargs)
    assert len(result.leased) == 1
    return result.leased[0]


# -- the parts of every call ---------------------------------------------------------------------


def test_a_call_with_nothing_to_do_writes_only_what_every_call_may(crawl):
    # step_check, step_begin, step_idle, step_reply (and step_due / step_reclaim with nothing
    # due): no key of any step is written
    result, written = crawl.call(CallBatch(beat=True))
    assert unnamed(crawl.keys, written) == set()
    assert (result.queued, result.inflight, result.deferred_now) == (0, 0, 0)
    # step_idle: idle since it found the frontier empty (idle_since holds since when)
    assert int(crawl.client.get(crawl.keys.idle_since)) <= crawl.server_ms()
    assert crawl.client.zscore(crawl.keys.workers, WORKER) is not None


def test_step_begin_the_crawls_first_call_writes_its_marker_and_layout_once(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "fresh")
    admin = FrontierAdmin(redis_url, "fresh")
    before = keyspace(client)
    admin.call(CallBatch(beat=True), worker=WORKER)
    written = changed_keys(before, keyspace(client))
    assert {keys.marker, keys.layout} <= written
    assert unnamed(keys, written) == set()
    marker, layout = client.get(keys.marker), client.get(keys.layout)
    assert marker and layout == str(LAYOUT_VERSION).encode()
    admin.call(CallBatch(beat=True), worker=WORKER)
    assert (client.get(keys.marker), client.get(keys.layout)) == (marker, layout)
    client.close()


def test_step_reply_a_repeated_call_returns_its_reply_and_writes_nothing(crawl):
    crawl.push("http://h.test/a", "http://h.test/b")
    first, _ = crawl.call(CallBatch(take=1), op_id="op-1")
    again, written = crawl.call(CallBatch(take=1), op_id="op-1")
    assert written == set()
    assert [(e.entry_id, e.token) for e in again.leased] == \
        [(e.entry_id, e.token) for e in first.leased]
    assert crawl.client.exists(crawl.keys.op("op-1")) == 1


def test_step_check_a_bad_argument_is_refused_before_any_write(crawl):
    crawl.client.set(crawl.keys.mon, "not a hash")  # a monitoring key of another type
    before = keyspace(crawl.client)
    with pytest.raises(redis.ResponseError):
        crawl.admin.call(CallBatch(take=1, pushes=[(b"k" * 12, 0, b"p", 0, "h.test")]),
                         worker=WORKER, monitor=monitor_payload(cs=1, counters={"pages": 1}))
    assert changed_keys(before, keyspace(crawl.client)) == set()


# -- step_push.lua, lua/queue.lua, lua/bloom.lua --------------------------------------------------


def test_step_push_queues_new_entries_in_their_bucket_and_filter(crawl):
    seq = int(crawl.client.get(crawl.keys.seq) or 0)
    result, written = crawl.call(CallBatch(pushes=[
        (b"a" * 12, 0, b"pa", 0, "h.test"), (b"b" * 12, 5, b"pb", 0, "h.test"),
        (b"a" * 12, 0, b"pa", 0, "h.test")]), worker="")
    assert unnamed(crawl.keys, written, *FILTER, "seq", "deferred", "parked", "stats", *QUEUE,
                   *STATE) == set()
    assert result.push_flags == [1, 1, 0]  # the third one was in the filter
    # two entries, each "<id>\t<payload>" in the bucket of its host and priority, highest first
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == [b"pb", b"pa"]
    assert int(crawl.client.get(crawl.keys.queue_count)) == 2
    assert set(crawl.client.hkeys(crawl.keys.queue_index)) == {b"h.test"}
    assert crawl.client.zscore(crawl.keys.ready, "h.test") is not None
    assert int(crawl.client.hget(crawl.keys.hostq, "h.test")) == 2
    assert int(crawl.client.get(crawl.keys.seq)) > seq  # the new ids
    assert crawl.client.exists(crawl.keys.bloom_meta, crawl.keys.bloom_slice(0)) == 2
    # nothing leased, deferred, parked or dead
    assert crawl.client.exists(crawl.keys.leases, crawl.keys.lease, crawl.keys.deferred,
                               crawl.keys.parked, crawl.keys.dead) == 0


def test_step_push_a_delayed_push_waits_among_the_deferred_entries(crawl):
    result, written = crawl.call(CallBatch(pushes=[(b"d" * 12, 0, b"pd", 0, "h.test", 60_000)]),
                                 worker="")
    assert unnamed(crawl.keys, written, *FILTER, "seq", "deferred", "parked", "stats", *QUEUE,
                   *STATE) == set()
    assert result.push_flags == [1]
    (member, due), = crawl.client.zrange(crawl.keys.deferred, 0, -1, withscores=True)
    entry_id, _, host = member.decode().split("|")
    assert host == "h.test" and due > crawl.server_ms() + 50_000
    assert crawl.client.hget(crawl.keys.data, entry_id) == b"pd"
    assert crawl.bucket() == [] and int(crawl.client.get(crawl.keys.queue_count) or 0) == 0


def test_step_push_a_push_past_the_bound_is_refused_and_writes_no_entry(redis_url):
    crawl = Crawl(redis_url, queue_max=1)
    crawl.push("http://h.test/a")
    before_bucket = crawl.bucket()
    result, written = crawl.call(CallBatch(pushes=[(b"z" * 12, 0, b"pz", 0, "h.test")]),
                                 worker="")
    assert result.refused == [0]
    assert crawl.bucket() == before_bucket
    # the refused push is not even checked against the filter: no write but the call's own
    assert unnamed(crawl.keys, written) == set()


# -- step_lease.lua -------------------------------------------------------------------------------


def test_step_lease_takes_the_best_head_with_a_fresh_token(crawl):
    crawl.push("http://h.test/low")
    crawl.push("http://h.test/high", priority=9)
    token = int(crawl.client.get(crawl.keys.token) or 0)
    result, written = crawl.call(CallBatch(take=1))
    assert unnamed(crawl.keys, written, "ready", "token", "workers", "robots", "hostlive",
                   "hostconf", "crawldelay", "tat", "expiries", "lease", "leases", "data",
                   "wlive", *QUEUE) == set()
    (leased,) = result.leased
    assert leased.payload == b"http://h.test/high"
    assert leased.token > token  # INCRBY token, never below the clock (ms x 10)
    assert int(crawl.client.get(crawl.keys.token)) >= leased.token
    # the lease: its expiry in leases, "<token>|<score>|<host>\t<worker>" in lease, the request
    # in data, out of its bucket
    expiry = crawl.client.zscore(crawl.keys.leases, leased.entry_id)
    assert expiry > crawl.server_ms()
    value = crawl.client.hget(crawl.keys.lease, leased.entry_id).decode()
    assert value.startswith(f"{leased.token}|") and value.endswith(f"|h.test\t{WORKER}")
    assert crawl.client.hget(crawl.keys.data, leased.entry_id) == b"http://h.test/high"
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == [b"http://h.test/low"]
    assert int(crawl.client.get(crawl.keys.queue_count)) == 1
    assert (result.queued, result.inflight) == (1, 1)


def test_step_lease_take_0_leases_nothing_and_writes_nothing_of_its_own(crawl):
    crawl.push("http://h.test/a")
    result, written = crawl.call(CallBatch(take=0, beat=True))
    assert result.leased == []
    assert unnamed(crawl.keys, written) == set()
    assert crawl.client.exists(crawl.keys.leases, crawl.keys.lease, crawl.keys.token) == 0


# -- step_release.lua: releases, dead letters, extends, downloads over ---------------------------


def test_step_release_puts_an_unstarted_request_back_at_its_bucket_head(crawl):
    leased = lease_one(crawl, "http://h.test/a", "http://h.test/b")
    result, written = crawl.call(CallBatch(releases=[(leased.entry_id, leased.token)]))
    assert unnamed(crawl.keys, written, *QUEUE, *STATE) == set()
    assert crawl.bucket()[0] == f"{leased.entry_id}\t".encode() + leased.payload
    assert crawl.client.zscore(crawl.keys.leases, leased.entry_id) is None
    assert crawl.client.hget(crawl.keys.lease, leased.entry_id) is None
    assert crawl.client.hget(crawl.keys.expiries, leased.entry_id) is None  # no expiry counted
    assert (result.queued, result.inflight) == (2, 0)


def test_step_release_a_reported_dead_letter_keeps_its_reason(crawl):
    leased = lease_one(crawl)
    _result, written = crawl.call(CallBatch(dead=[(leased.entry_id, leased.token, "bad entry")]))
    assert unnamed(crawl.keys, written, *QUEUE, *STATE) == set()
    (letter,) = crawl.admin.dead_letters()
    assert letter["reason"] == "bad entry" and letter["data"] == leased.payload
    assert crawl.client.zcard(crawl.keys.leases) == 0 and crawl.bucket() == []


def test_step_release_a_stale_token_touches_nothing(crawl):
    leased = lease_one(crawl)
    before = keyspace(crawl.client)
    _result, written = crawl.call(CallBatch(releases=[(leased.entry_id, leased.token - 1)]))
    # only the call's own keys: the lease held with another token stays as it was
    assert unnamed(crawl.keys, written) == set()
    for name in ("leases", "lease", "data"):
        key = getattr(crawl.keys, name).encode()
        assert keyspace(crawl.client)[key] == before[key]


def test_step_extend_pushes_a_live_lease_expiry_and_reports_a_lost_one(crawl):
    leased = lease_one(crawl)
    expiry = crawl.client.zscore(crawl.keys.leases, leased.entry_id)
    longer = crawl.driver(lease_timeout=600.0)
    result, written = crawl.call(CallBatch(extends=[(leased.entry_id, leased.token),
                                                    ("999999", 1)]), admin=longer)
    assert unnamed(crawl.keys, written, "leases", "lease", *STATE) == set()
    assert crawl.client.zscore(crawl.keys.leases, leased.entry_id) >= expiry + 500_000
    assert result.lost == ["999999"]


def test_step_extend_a_download_over_frees_its_host_slot_and_keeps_the_lease(redis_url):
    crawl = Crawl(redis_url, host_concurrency=1)
    leased = lease_one(crawl, "http://h.test/a", "http://h.test/b")
    assert int(crawl.client.hget(crawl.keys.hostlive, "h.test")) == 1
    _result, written = crawl.call(CallBatch(downloaded=[(leased.entry_id, leased.token)]))
    assert unnamed(crawl.keys, written, "leases", "lease", *STATE) == set()
    assert int(crawl.client.hget(crawl.keys.hostlive, "h.test") or 0) == 0
    value = crawl.client.hget(crawl.keys.lease, leased.entry_id).decode()
    assert value.endswith(f"\t!{WORKER}")  # its download is over
    assert crawl.client.zscore(crawl.keys.leases, leased.entry_id) is not None
    # the slot is free: the next request of the host may be leased
    assert len(crawl.admin.call(CallBatch(take=1), worker=WORKER).leased) == 1


# -- step_reclaim.lua: step_due and step_reclaim ---------------------------------------------


def test_step_due_moves_a_due_deferred_entry_to_its_bucket_head(crawl):
    crawl.push("http://h.test/queued")
    crawl.push("http://h.test/later", delay_ms=200)
    (_member, due), = crawl.client.zrange(crawl.keys.deferred, 0, -1, withscores=True)
    crawl.wait_server_past(due)
    result, written = crawl.call(CallBatch(beat=True))
    assert unnamed(crawl.keys, written, "deferred", "leases", "expiries", *QUEUE, *STATE) == set()
    assert crawl.client.zcard(crawl.keys.deferred) == 0
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == \
        [b"http://h.test/later", b"http://h.test/queued"]
    assert (result.queued, result.deferred_now) == (2, 0)


def test_step_reclaim_counts_an_expired_lease_and_queues_it_again(redis_url):
    crawl = Crawl(redis_url, lease_timeout=0.2, max_leases=3)
    leased = lease_one(crawl)
    crawl.wait_server_past(crawl.client.zscore(crawl.keys.leases, leased.entry_id))
    result, written = crawl.call(CallBatch(beat=True), worker="other:2:1")
    assert unnamed(crawl.keys, written, "deferred", "leases", "expiries", "dead", *QUEUE,
                   *STATE, worker="other:2:1") == set()
    assert int(crawl.client.hget(crawl.keys.expiries, leased.entry_id)) == 1
    assert crawl.bucket() == [f"{leased.entry_id}\t".encode() + leased.payload]
    assert crawl.client.zcard(crawl.keys.leases) == 0
    assert crawl.client.hget(crawl.keys.lease, leased.entry_id) is None
    assert result.reclaimed == 1


def test_step_reclaim_dead_letters_after_max_lease_expiries(redis_url):
    crawl = Crawl(redis_url, lease_timeout=0.2, max_leases=1)
    leased = lease_one(crawl)
    crawl.wait_server_past(crawl.client.zscore(crawl.keys.leases, leased.entry_id))
    result, written = crawl.call(CallBatch(beat=True))
    assert unnamed(crawl.keys, written, "deferred", "leases", "expiries", "dead", *QUEUE,
                   *STATE) == set()
    (letter,) = crawl.admin.dead_letters()
    assert letter["data"] == leased.payload
    assert crawl.bucket() == [] and crawl.client.zcard(crawl.keys.leases) == 0
    assert result.dead_lettered == 1


# -- step_ack.lua, lua/failed.lua ------------------------------------------------------------------


def test_step_ack_drops_the_lease_and_pushes_the_links_with_it(crawl):
    leased = lease_one(crawl)
    acked = crawl.stat("acked")
    result, written = crawl.call(CallBatch(
        acks=[(leased.entry_id, leased.token)],
        pushes=[(b"l" * 12, 0, b"http://h.test/link", 1, "h.test")]))
    assert unnamed(crawl.keys, written, "data", "parked", "deferred", "failed", "failed_at",
                   "failed_by", "seq", *QUEUE, *STATE, *FILTER) == set()
    assert crawl.client.zscore(crawl.keys.leases, leased.entry_id) is None
    assert crawl.client.hget(crawl.keys.lease, leased.entry_id) is None
    assert crawl.client.hget(crawl.keys.data, leased.entry_id) is None
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == [b"http://h.test/link"]
    assert crawl.stat("acked") == acked + 1
    assert result.push_flags == [1]
    assert crawl.client.exists(crawl.keys.failed, crawl.keys.parked, crawl.keys.deferred) == 0


def test_step_ack_with_a_failure_record_records_it_once(crawl):
    leased = lease_one(crawl)
    record = FailureRecord(url="http://h.test/a", method="GET", reason="http/500", status=500,
                           attempts=3, worker=WORKER, host="h.test")
    _result, written = crawl.call(CallBatch(acks=[(leased.entry_id, leased.token,
                                                  record.encode())]))
    assert unnamed(crawl.keys, written, "data", "parked", "deferred", "failed", "failed_at",
                   "failed_by", "seq", *QUEUE, *STATE, *FILTER) == set()
    stored = crawl.client.hgetall(crawl.keys.failed)
    assert list(stored) == [leased.entry_id.encode()]
    decoded = FailureRecord.decode(stored[leased.entry_id.encode()])
    assert (decoded.url, decoded.reason, decoded.data) == ("http://h.test/a", "http/500",
                                                           leased.payload)
    assert crawl.client.zscore(crawl.keys.failed_at, leased.entry_id) is not None
    assert crawl.client.zcard(crawl.keys.leases) == 0


def test_step_ack_a_link_past_the_bound_parks_its_parent(redis_url):
    crawl = Crawl(redis_url, queue_max=1)
    leased = lease_one(crawl)
    result, written = crawl.call(CallBatch(
        acks=[(leased.entry_id, leased.token)],
        pushes=[(b"1" * 12, 0, b"http://h.test/l1", 1, "h.test"),
                (b"2" * 12, 0, b"http://h.test/l2", 1, "h.test")]))
    assert unnamed(crawl.keys, written, "data", "parked", "deferred", "failed", "failed_at",
                   "failed_by", "seq", *QUEUE, *STATE, *FILTER) == set()
    # room for one link (the parent's own slot): the other one is left, the parent parked
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == [b"http://h.test/l1"]
    (parked,) = crawl.client.lrange(crawl.keys.parked, 0, -1)
    entry_id, _score, host, payload = msgpack.unpackb(parked, raw=True)
    assert (entry_id, host, payload) == (leased.entry_id.encode(), b"h.test", leased.payload)
    assert crawl.client.zcard(crawl.keys.leases) == 0
    assert result.parked == 1


# -- lua/step_revisit.lua (recrawl; sitemap <lastmod>) ----------------------------------------

#: lua/step_revisit.lua's keys
REVISIT = ("revisit_index", "revisit_prefix", "revisit_count", "revisit_popped",
           "revisit_place_prefix", "revisit_lastmod", "seq")


def tracked_with_lastmod(crawl: Crawl, key: bytes = b"k" * 12) -> tuple[Any, set[str]]:
    """A URL pushed with a lastmod (the crawl uses sitemaps), leased and acknowledged with its
    revisit record: the result and the keys the acknowledgement wrote."""
    crawl.admin.call(CallBatch(pushes=[(key, 0, b"http://h.test/s", 0, "h.test", 0, 1)]))
    leased = crawl.admin.call(CallBatch(take=1), worker=WORKER).leased[0]
    record = [3_600_000, "h.test", 0, leased.payload, key, 1000]
    return crawl.call(CallBatch(acks=[(leased.entry_id, leased.token, b"", [], 0, record)]))


def test_step_revisit_an_acknowledgement_with_a_record_schedules_and_indexes_it(crawl):
    result, written = tracked_with_lastmod(crawl)
    assert result.acked == 1
    assert unnamed(crawl.keys, written, *REVISIT, "data", *QUEUE, *STATE) == set()
    (slot,) = crawl.client.zrange(crawl.keys.revisit_index, 0, -1)
    assert crawl.client.lrange(crawl.keys.revisit_slot(slot.decode()), 0, -1) == [
        b"h.test\t0\thttp://h.test/s"]
    place_key, field = crawl.keys.revisit_place(b"k" * 12)
    assert place_key in {k for k in written} and crawl.client.hexists(place_key, field)
    assert crawl.client.get(crawl.keys.revisit_count) == b"1"


def test_step_revisit_a_newer_lastmod_moves_the_record_to_the_queue(crawl):
    tracked_with_lastmod(crawl)
    (slot,) = crawl.client.zrange(crawl.keys.revisit_index, 0, -1)
    result, written = crawl.call(CallBatch(pushes=[(b"k" * 12, 0, b"http://h.test/s", 0,
                                                    "h.test", 0, 2000)]))
    assert result.push_flags == [0]
    assert unnamed(crawl.keys, written, *REVISIT, *QUEUE, *STATE) == set()
    assert crawl.client.lrange(crawl.keys.revisit_slot(slot.decode()), 0, -1) == [b""]
    assert crawl.client.hlen(crawl.keys.revisit_place(b"k" * 12)[0]) == 0
    (entry,) = crawl.bucket()
    assert entry.startswith(b"r") and entry.endswith(b"\thttp://h.test/s")
    assert crawl.stat("revisit_lastmod_due") == 1


def test_step_revisit_an_older_lastmod_writes_only_the_flag(crawl):
    tracked_with_lastmod(crawl)
    result, written = crawl.call(CallBatch(pushes=[(b"k" * 12, 0, b"http://h.test/s", 0,
                                                    "h.test", 0, 1001)]))
    assert result.push_flags == [0] and crawl.stat("revisit_lastmod_older") == 1
    assert unnamed(crawl.keys, written, "revisit_lastmod", *FILTER) == set()


def test_step_revisit_due_records_go_to_the_queue_and_the_slots_popped_count_is_kept(crawl):
    crawl.push("http://h.test/d1", "http://h.test/d2")
    leased = crawl.admin.call(CallBatch(take=2), worker=WORKER).leased
    assert len(leased) == 2
    records = [[300, "h.test", 0, e.payload, bytes([i]) * 12, 1] for i, e in enumerate(leased)]
    crawl.admin.call(CallBatch(acks=[(e.entry_id, e.token, b"", [], 0, r)
                                     for e, r in zip(leased, records, strict=True)]))
    (slot,) = crawl.client.zrange(crawl.keys.revisit_index, 0, -1, withscores=True)
    crawl.wait_server_past(slot[1])
    # room for one: the slot is popped in part
    _result, written = crawl.call(CallBatch(), admin=crawl.driver(queue_max=1))
    assert unnamed(crawl.keys, written, *REVISIT, *QUEUE, *STATE) == set()
    assert crawl.client.hget(crawl.keys.revisit_popped, slot[0]) == b"1"
    assert [e.split(b"\t", 1)[1] for e in crawl.bucket()] == [b"http://h.test/d1"]
    assert crawl.stat("revisit_due") == 1


def test_step_revisit_a_revisit_dropped_with_its_key_deletes_its_place(crawl):
    tracked_with_lastmod(crawl)
    crawl.admin.call(CallBatch(pushes=[(b"k" * 12, 0, b"http://h.test/s", 0, "h.test", 0,
                                        2000)]))  # due at once: a revisit
    revisit = crawl.admin.call(CallBatch(take=1), worker=WORKER).leased[0]
    record = [3_600_000, "h.test", 0, revisit.payload, b"k" * 12, 2000]
    crawl.admin.call(CallBatch(acks=[(revisit.entry_id, revisit.token, b"", [], 0, record)]))
    place_key, field = crawl.keys.revisit_place(b"k" * 12)
    assert crawl.client.hexists(place_key, field)  # scheduled again: indexed again
    crawl.admin.call(CallBatch(pushes=[(b"k" * 12, 0, b"http://h.test/s", 0, "h.test", 0,
                                        4000)]))
    again = crawl.admin.call(CallBatch(take=1), worker=WORKER).leased[0]
    crawl.client.hset(place_key, field, b"x" * 14)  # (a place written meanwhile: deleted)
    result, written = crawl.call(CallBatch(acks=[(again.entry_id, again.token, b"", [], 0,
                                                  b"k" * 12)]))
    assert result.acked == 1
    assert unnamed(crawl.keys, written, *REVISIT, "data", *QUEUE, *STATE) == set()
    assert not crawl.client.hexists(place_key, field)
    assert crawl.client.get(crawl.keys.revisit_count) == b"0"


# -- lua/monitoring.lua ------------------------------------------------------------------------


def test_monitoring_applies_a_workers_deltas_once(crawl):
    arg = monitor_payload(cs=1, counters={"pages": 2}, hosts=[["h.test", 3, 1]],
                          state="crawling")
    _, written = crawl.call(CallBatch(beat=True), monitor=arg)
    assert unnamed(crawl.keys, written) == set()  # MONITOR_CALL keys and stats only
    info = crawl.client.hgetall(crawl.keys.worker_info(WORKER))
    assert (info[b"cs"], info[b"st"]) == (b"1", b"crawling")
    assert crawl.stat("pages") == 2
    assert crawl.client.hgetall(crawl.keys.hoststats)[b"p|h.test"] == b"3"
    assert crawl.client.zscore(crawl.keys.hostbans, "h.test") == 1
    # the same batch again (a resend after a lost reply): applied once
    crawl.admin.call(CallBatch(beat=True), worker=WORKER, monitor=arg)
    assert crawl.stat("pages") == 2
    assert crawl.client.zscore(crawl.keys.hostbans, "h.test") == 1
