"""A push and an acknowledgement are one record each inside the worker (frontier/records.py),
packed to the wire in one place: the rows are the bytes the scripts have always read."""

from __future__ import annotations

from typing import Any

import msgpack

from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, call_args, typed
from scrapy_fleet.frontier.records import (
    Ack,
    Push,
    ack_row,
    as_lean,
    as_push,
    lean_row,
    push_row,
)
from scrapy_fleet.frontier.routing import concat, entry_ref, route, subset
from scrapy_fleet.keys.crawl import STAGE_HOST
from scrapy_fleet.keys.partition import partition_of

K = b"k" * 12


def packed(row: Any) -> bytes:
    return msgpack.packb(row, use_bin_type=False)


def test_a_push_packs_to_the_row_of_each_script():
    full = Push(K, 5, b"x", 2, "h.test", 30, 1_700_000_000)
    assert push_row(full) == [K, 5, b"x", 2, "h.test", 30, 1_700_000_000]
    assert push_row(as_push((K, -3, b"x"))) == [K, -3, b"x", 0, "", 0, 0]
    assert push_row(as_push((K, 1, b"x", 0, "h.test"))) == [K, 1, b"x", 0, "h.test", 0, 0]
    # a lean push has no group; a stored response names its page (partition, entry number)
    assert lean_row(full.lean((2, 77))) == [K, 5, b"x", "h.test", 30, 1_700_000_000, 2, 77]
    assert lean_row(full.lean()) == [K, 5, b"x", "h.test", 30, 1_700_000_000]
    assert lean_row(as_lean((K, 5, b"x", "h.test"))) == [K, 5, b"x", "h.test", 0, 0]
    assert lean_row(as_lean((K, 5, b"x", "h", 30, 9, 2, 77))) == [K, 5, b"x", "h", 30, 9, 2, 77]


def test_an_acknowledgement_packs_as_short_as_what_it_carries():
    lease = Lease("17-0", 7)
    assert packed(ack_row(lease.ack())) == packed(["17-0", 7])
    lease.failure = b"F"
    assert packed(ack_row(lease.ack())) == packed(["17-0", 7, b"F"])
    lease.unstorable = [b"U"]
    assert packed(ack_row(lease.ack())) == packed(["17-0", 7, b"F", [b"U"]])
    lease.failure = None
    assert packed(ack_row(lease.ack())) == packed(["17-0", 7, b"", [b"U"]])
    lease.unstorable = []
    lease.revisit = [60_000, "h.test", 0.5, b"p"]
    assert packed(ack_row(lease.ack())) == packed(
        ["17-0", 7, b"", [], 0, [60_000, "h.test", 0.5, b"p"]])
    lease.revisit = b""  # (not revisited: still sent, the sixth field)
    assert packed(ack_row(lease.ack())) == packed(["17-0", 7, b"", [], 0, b""])
    # deferred (a link refused in another partition): without unstorable and revisit records
    lease.failure, lease.unstorable = b"F", [b"U"]
    assert packed(ack_row(lease.ack().deferred())) == packed(["17-0", 7, b"F", [], 1])
    assert packed(ack_row(Ack("1-0", 2).deferred())) == packed(["1-0", 2, b"", [], 1])


def test_a_call_packs_records_and_the_documented_tuples_alike():
    tuples = CallBatch(acks=[("5-0", 3), ("6-0", 4, b"F")],
                       pushes=[(K, 1, b"a"), (K, 2, b"b", 1, "h.test"),
                               (K, 3, b"c", 2, "h", 40, 9)])
    records = CallBatch(acks=[Ack("5-0", 3), Ack("6-0", 4, b"F")],
                        pushes=[Push(K, 1, b"a"), Push(K, 2, b"b", 1, "h.test"),
                                Push(K, 3, b"c", 2, "h", 40, 9)])
    pushes, acks = records.pushes, records.acks
    assert typed(records) is records and (records.pushes, records.acks) == (pushes, acks)
    assert records.pushes is pushes and records.acks is acks  # (records: left as they are)
    typed(tuples)
    assert [type(p) for p in tuples.pushes] == [Push] * 3
    assert [type(a) for a in tuples.acks] == [Ack] * 2
    fields = [msgpack.unpackb(call_args(b, "w1", FrontierParams()), raw=True)
              for b in (tuples, records)]  # (the script's cmsgpack: every string is raw)
    for got in fields:
        assert got[b"p"] == [[K, 1, b"a", 0, b"", 0, 0], [K, 2, b"b", 1, b"h.test", 0, 0],
                             [K, 3, b"c", 2, b"h", 40, 9]]
        assert got[b"a"] == [[b"5-0", 3], [b"6-0", 4, b"F"]]


def _hosts(parts: int) -> tuple[str, str]:
    """Two hosts of different partitions (of *parts*), the first's not the stored
    responses' (STAGE_HOST's)."""
    hosts = [f"h{i}.test" for i in range(50)]
    a = next(h for h in hosts if partition_of(h, parts) != partition_of(STAGE_HOST, parts))
    b = next(h for h in hosts if partition_of(h, parts) != partition_of(a, parts))
    return a, b


def test_routing_keeps_each_field_of_a_record():
    parts = 3
    near, far = _hosts(parts)
    p, q = partition_of(near, parts), partition_of(far, parts)
    batch = CallBatch(acks=[Ack(entry_ref(p, "1-0"), 7, b"F"), Ack(entry_ref(p, "12"), 8)],
                      pushes=[Push(K, 1, b"own", 1, near, 30, 5),
                              Push(K, 2, b"other", 1, far, 40, 6),
                              Push(K, 3, b"stored", 2, STAGE_HOST, 0, 0),
                              Push(K, 4, b"start", 0, far, 0, 0)])
    r = route(batch, parts, home=p)
    assert r.per[p].acks == [Ack("1-0", 7, b"F"), Ack("12", 8)]
    assert Push(K, 1, b"own", 1, near, 30, 5) in r.per[p].pushes
    assert r.per[q].pushes == [Push(K, 4, b"start", 0, far, 0, 0)]
    assert [x for x in r.foreign[q] if x.host == far] == [Push(K, 2, b"other", 0, far, 40, 6)]
    # (a stored response for another partition names its page's partition and number)
    assert r.foreign[partition_of(STAGE_HOST, parts)][-1] == Push(
        K, 3, b"stored", 0, STAGE_HOST, 0, 0, (p, 12))
    # two batches as one: the second's groups follow the first's acknowledgements
    both = concat(batch, CallBatch(acks=[Ack(entry_ref(q, "2-0"), 9)],
                                   pushes=[Push(K, 5, b"x", 1, far), Push(K, 6, b"y", 0, far)]))
    assert [x.group for x in both.pushes] == [1, 1, 2, 0, 3, 0]
    # the part sent again for group 2 alone: its links renumbered to group 1
    again = subset(batch, {2}, set(), parts, home=p)
    assert again.acks == [Ack(entry_ref(p, "12"), 8)]
    assert again.pushes == [Push(K, 3, b"stored", 1, STAGE_HOST, 0, 0)]
