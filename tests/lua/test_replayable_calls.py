"""A frontier call without events caches no reply (lua/step_reply.lua), against a real
redis-server.

A call's reply is cached under its op id so that a retry after a lost reply (same op id) gets
it back instead of acknowledging, pushing or leasing twice.  A call that named nothing a
repeat would apply twice (no acknowledgement, release, dead letter, download over, push,
unstorable record, link left out as a known duplicate, counter delta) and whose reply reports
nothing that happened (nothing leased, lost, reclaimed, resumed..., no counter moved) does
only what a repeat does again harmlessly: extensions, the idle bookkeeping, the heartbeat.
Its reply is not cached (``nc``): a repeat runs it again.  It leaves the previous call's reply
cache in place (its expiry renewed) and the client keeps naming that one as its previous op,
so the cache stays the evidence that the client's last cached call's writes survived
(``pl``, frontier/dupecache.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from support import link_entry, monitor_payload, wait_server_past

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import OP_TTL_MS, CallBatch, CallResult, FrontierParams

WORKER = "w1:1:1"
BEAT = monitor_payload()  # a heartbeat without deltas


class Client:
    """A worker's client (FrontierAdmin as worker WORKER) on crawl "rc"."""

    def __init__(self, url: str, dupe_cache: int = 0, **params: Any) -> None:
        self.admin = FrontierAdmin(url, "rc", params=FrontierParams(**params),
                                   dupe_cache=dupe_cache)
        self.r = redis.Redis.from_url(url)
        self.keys = self.admin.keys

    def call(self, batch: CallBatch | None = None, op_id: str | None = None,
             monitor: bytes = BEAT) -> CallResult:
        return self.admin.call(batch or CallBatch(beat=True), worker=WORKER, op_id=op_id,
                               monitor=monitor)

    @property
    def prev(self) -> str:
        """The op id the client's next call names as its previous one."""
        return self.admin.calls.prev_op

    def cached(self, op_id: str) -> bool:
        return self.r.exists(self.keys.op(op_id)) == 1

    def stats(self) -> dict[bytes, bytes]:
        return self.r.hgetall(self.keys.stats)

    def push(self, *urls: str) -> None:
        """Pushed by another client (the push command's): this client's chain is untouched."""
        other = FrontierAdmin(self.admin.url, "rc", params=self.admin.params)
        other.push([link_entry(u) for u in urls])


@pytest.fixture
def client(redis_url):
    c = Client(redis_url)
    yield c
    c.r.close()


def lease(client: Client, n: int = 1) -> CallResult:
    """A cached call: it leases *n* entries."""
    got = client.call(CallBatch(take=n, beat=True))
    assert len(got.leased) == n and not got.uncached
    assert client.cached(client.prev)
    return got


def test_a_call_without_events_caches_no_reply_and_the_client_keeps_its_previous_op(client):
    client.push("http://h.test/a")
    lease(client)
    prev = client.prev
    got = client.call(op_id="idle-1")
    assert got.uncached and not got.prev_lost
    assert not client.cached("idle-1")
    assert client.cached(prev) and client.prev == prev
    # the previous cache's expiry is renewed: a client that only makes such calls keeps it
    assert client.r.pttl(client.keys.op(prev)) > OP_TTL_MS - 5_000


def test_a_repeated_uncached_call_runs_again_and_counts_nothing_twice(client):
    client.push("http://h.test/a", "http://h.test/b")
    held = lease(client).leased[0]
    extend = CallBatch(beat=True, extends=[(held.entry_id, held.token)])
    first = client.call(extend, op_id="again")
    stats = client.stats()
    expiry = client.r.zscore(client.keys.leases, held.entry_id)
    second = client.call(extend, op_id="again")  # its reply was lost: the client sends it again
    assert first.uncached and second.uncached
    assert (second.lost, second.leased, second.queued, second.inflight) == \
        (first.lost, first.leased, first.queued, first.inflight) == ([], [], 1, 1)
    assert client.stats() == stats  # nothing counted twice
    assert client.r.zscore(client.keys.leases, held.entry_id) >= expiry  # extended again
    assert not client.cached("again")


def test_a_clients_first_call_is_cached_and_a_lease_request_leasing_nothing_is_not(client):
    first = client.call()  # no previous cache to keep: this one starts the chain
    assert first.prev_lost and not first.uncached and client.cached(client.prev)
    got = client.call(CallBatch(take=4, beat=True))
    assert got.leased == [] and got.uncached and not got.prev_lost


def test_counter_deltas_make_the_call_cached_and_are_counted_once(client):
    deltas = monitor_payload(cs=1, counters={"pages": 2})
    first = client.call(op_id="deltas", monitor=deltas)
    again = client.call(op_id="deltas", monitor=deltas)
    assert not first.uncached and not again.uncached and client.cached("deltas")
    assert client.stats()[b"pages"] == b"2"


def test_a_call_that_reclaims_is_cached_and_its_repeat_reports_the_same(redis_url):
    client = Client(redis_url, lease_timeout=0.05)
    client.push("http://h.test/a")
    got = client.admin.call(CallBatch(take=1), worker="w-other")
    expiry = client.r.zscore(client.keys.leases, got.leased[0].entry_id)
    wait_server_past(client.r, expiry)
    first = client.call(op_id="reclaim")
    again = client.call(op_id="reclaim")
    assert first.reclaimed == again.reclaimed == 1
    assert not first.uncached and client.cached("reclaim")
    assert client.stats()[b"reclaimed"] == b"1"
    client.r.close()


def test_an_extension_of_a_lost_lease_is_cached(client):
    client.push("http://h.test/a")
    held = lease(client).leased[0]
    got = client.call(CallBatch(beat=True, extends=[(held.entry_id, held.token + 1)]),
                      op_id="lost")
    assert got.lost == [held.entry_id] and not got.uncached and client.cached("lost")


def test_pl_stays_0_across_uncached_calls_and_a_lost_previous_cache_still_gives_pl_1(client):
    client.push("http://h.test/a")
    lease(client)
    prev = client.prev
    for _ in range(3):
        got = client.call()
        assert got.uncached and not got.prev_lost and client.prev == prev
    # a failover to a replica that lacked the last cached call's writes: its cache is gone
    client.r.delete(client.keys.op(prev))
    lost = client.call(op_id="after-loss")
    assert lost.prev_lost and not lost.uncached  # cached: the chain starts again here
    assert client.cached("after-loss") and client.prev == "after-loss"
    got = client.call()
    assert got.uncached and not got.prev_lost and client.prev == "after-loss"


def test_uncached_calls_keep_the_evidence_for_links_left_out_as_known_duplicates(redis_url):
    client = Client(redis_url, dupe_cache=1000)
    link = link_entry("http://h.test/a")
    client.call(CallBatch(pushes=[link]))
    for _ in range(2):
        assert client.call().uncached
    known = client.call(CallBatch(pushes=[link]))
    assert (known.cached, known.duplicates) == (1, 1)  # left out: the chain held
    for _ in range(2):
        assert client.call().uncached
    client.r.delete(client.keys.op(client.prev))  # the last cached call's writes lost
    refused = client.call(CallBatch(pushes=[link]))  # refused as stale, sent again whole
    assert (refused.cached, refused.duplicates, refused.pushed) == (0, 1, 0)
    assert client.stats()[b"duplicates"] == b"2"
    client.r.close()


def test_a_resent_uncached_call_that_now_has_work_is_cached_under_its_op_id(client):
    client.push("http://h.test/a")
    lease(client)
    prev = client.prev
    first = client.call(CallBatch(take=1, beat=True), op_id="resent")
    assert first.uncached and first.leased == []  # nothing queued: its reply is lost
    client.push("http://h.test/b")
    again = client.call(CallBatch(take=1, beat=True), op_id="resent")
    assert len(again.leased) == 1 and not again.uncached and not again.prev_lost
    assert client.cached("resent") and not client.cached(prev) and client.prev == "resent"
    replay = client.call(CallBatch(take=1, beat=True), op_id="resent")
    assert [(e.entry_id, e.token) for e in replay.leased] == \
        [(e.entry_id, e.token) for e in again.leased]
