"""What a partitioned worker sends again as it was (frontier/sent.py ``match_rows``, and
frontier/routing.py ``join_results``): no IO."""

from __future__ import annotations

from scrapy_fleet.frontier.protocol import CallResult, LeasedEntry
from scrapy_fleet.frontier.routing import join_results
from scrapy_fleet.frontier.sent import SentLean, match_rows


def row(tag: bytes) -> tuple[bytes, int, bytes, str, int, int]:
    return (b"k" * 12 if tag != b"-" else b"", 0, tag, "h.test", 0, 0)


def test_a_kept_lean_push_takes_its_rows_where_they_are_now() -> None:
    kept = SentLean("op1", b"arg", [row(b"a"), row(b"-"), row(b"-")])
    rows = [row(b"x"), row(b"-"), row(b"a"), row(b"-"), row(b"-")]
    got, rest = match_rows([kept], rows)
    assert [(s.op_id, idx) for s, idx in got] == [("op1", [2, 1, 3])]
    assert rest == [0, 4]  # (each row counts once: the third "-" is a new one)


def test_a_kept_lean_push_some_of_whose_rows_are_gone_is_dropped() -> None:
    gone = SentLean("op1", b"arg", [row(b"a"), row(b"b")])
    there = SentLean("op2", b"arg", [row(b"c")])
    got, rest = match_rows([gone, there], [row(b"a"), row(b"c")])
    assert [(s.op_id, idx) for s, idx in got] == [("op2", [1])]
    assert rest == [0]


def result(**kw: object) -> CallResult:
    base: dict[str, object] = dict(
        leased=[], lost=[], push_flags=[], refused=[], pushed=0, duplicates=0, acked=0,
        released=0, reclaimed=0, dead_lettered=0, parked=0, deferred=0, resumed=0, queued=0,
        inflight=0, deferred_now=0, size=0, idle_ms=-1, now_ms=0, bloom_full=False)
    base.update(kw)
    return CallResult(**base)  # type: ignore[arg-type]


def test_a_partition_s_two_replies_of_one_call_add_up() -> None:
    old = result(leased=[LeasedEntry("1", 1, b"p", 0)], lost=["9"], acked=2, pushed=1,
                 push_flags=[1], refused=[0], queued=7)
    new = result(leased=[LeasedEntry("2", 1, b"q", 0)], acked=1, push_flags=[0, 1], queued=5)
    both = join_results(old, new)
    assert [e.entry_id for e in both.leased] == ["1", "2"] and both.lost == ["9"]
    assert (both.acked, both.pushed, both.queued, both.push_flags, both.refused) == (
        3, 1, 5, [0, 1], [])
    alone = join_results(old, None)  # (its flags are not the call's pushes')
    assert (alone.acked, alone.push_flags, alone.refused, alone.seen) == (2, [], [], [])
