"""What a failover with asynchronous replication does to the frontier: the promoted replica
has the crawl as it was a moment earlier (the last script calls lost, each one whole: a
script's writes replicate as one transaction).  Emulated exactly on one real Redis: DUMP
every key of the crawl, run calls, RESTORE the dump (the replica that missed them)."""

from __future__ import annotations

import time

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch


def _payload(url: str) -> bytes:
    from scrapy import Request

    return codec.encode(Request(url))


def _snapshot(admin: FrontierAdmin) -> dict[bytes, bytes]:
    return {key: admin.client.dump(key) for key in admin.crawl_keys()}


def _rollback(admin: FrontierAdmin, snapshot: dict[bytes, bytes]) -> None:
    """The crawl's keys as in *snapshot*: what a replica that missed the later calls holds."""
    for key in admin.crawl_keys():
        if key not in snapshot:
            admin.client.delete(key)
    for key, value in snapshot.items():
        admin.client.restore(key, 0, value, replace=True)


def test_a_lost_lease_never_acknowledges_another_request_after_a_rollback(redis_url):
    """Lost writes roll back the entry id counter and the fencing token counter together:
    a worker still holding a lease from the lost calls must not acknowledge, with its old
    (id, token), the other request the promoted replica gives that id to."""
    admin = FrontierAdmin(redis_url, "rollback")
    admin.push([(b"a" * 12, 0, _payload("http://h/a"), 0, "h")])
    a = admin.call(CallBatch(take=1), worker="w1").leased[0]
    admin.call(CallBatch(acks=[(a.entry_id, a.token)]), worker="w1")
    before = _snapshot(admin)
    # lost calls: a push of B, leased by worker 1 (it fetches B and will acknowledge it)
    admin.push([(b"b" * 12, 0, _payload("http://h/b"), 0, "h")])
    b = admin.call(CallBatch(take=1), worker="w1").leased[0]
    _rollback(admin, before)  # failover: the replica never saw them
    time.sleep(0.01)  # the clock moves on (a failover takes seconds)
    # on the promoted replica: C is pushed and gets B's id (B's push is lost though its
    # pusher was told "pushed": what FLEET_REDIS_WAIT_REPLICAS reports), worker 2 leases C
    admin.push([(b"c" * 12, 0, _payload("http://h/c"), 0, "h")])
    c = admin.call(CallBatch(take=1), worker="w2").leased[0]
    assert c.entry_id == b.entry_id  # the id counter was rolled back
    assert c.token != b.token  # the token counter too, but tokens never repeat
    # worker 1 acknowledges B with its stale lease: refused, C stays leased to worker 2
    result = admin.call(CallBatch(acks=[(b.entry_id, b.token)]), worker="w1")
    assert result.acked == 0 and result.lost == [b.entry_id]
    assert admin.status()["leased"] == 1
    assert admin.call(CallBatch(acks=[(c.entry_id, c.token)]), worker="w2").acked == 1
    admin.close()
