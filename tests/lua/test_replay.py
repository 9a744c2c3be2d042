"""A frontier call repeated with its op id (a retry after a lost reply) returns the first
reply and writes nothing again, against a real redis-server."""

from __future__ import annotations

from support import link_entry as entry

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def admin_for(url: str, cache: int = 0, crawl: str = "s") -> FrontierAdmin:
    return FrontierAdmin(url, crawl, params=FrontierParams(), dupe_cache=cache)


def stat(admin: FrontierAdmin, name: str) -> int:
    return int(admin.client.hget(admin.keys.stats, name) or 0)


def test_replayed_op_id_returns_the_first_reply(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/a"), entry("http://h.test/b")])
    first = admin.call(CallBatch(take=2), worker="w", op_id="op-lease")
    again = admin.call(CallBatch(take=2), worker="w", op_id="op-lease")
    assert [(e.entry_id, e.token, e.payload) for e in again.leased] == \
        [(e.entry_id, e.token, e.payload) for e in first.leased]
    assert all(e.payload for e in again.leased)  # filled from the data hash
    acks = [(e.entry_id, e.token) for e in first.leased]
    links = [entry("http://h.test/a", 1), entry("http://h.test/c", 1)]
    done = admin.call(CallBatch(acks=acks, pushes=links), worker="w", op_id="op-ack")
    redo = admin.call(CallBatch(acks=acks, pushes=links), worker="w", op_id="op-ack")
    assert (redo.acked, redo.pushed, redo.push_flags, redo.seen) == \
        (done.acked, done.pushed, done.push_flags, done.seen) == (2, 1, [0, 1], [0])
    assert stat(admin, "acked") == 2 and stat(admin, "pushed") == 3
    assert admin.status()["queued"] == 1
