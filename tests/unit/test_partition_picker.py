"""PartitionPicker (frontier/picker.py, issue 21): where a worker's lease requests go."""

from __future__ import annotations

from scrapy_fleet.frontier.picker import STALE_ROUNDS, PartitionPicker

NOW = 1000.0


def test_the_home_gets_the_whole_request_while_it_hands_out_all_it_is_asked():
    pk = PartitionPicker(8, 3)
    assert pk.plan(16, NOW, set()) == {3: 16}  # knows nothing yet: the home
    pk.note(3, 16, 16, 40, None, NOW)
    pk.note(5, 0, 0, 100, None, NOW)  # (another partition with more work)
    assert pk.plan(16, NOW, set()) == {3: 16}
    assert pk.plan(0, NOW, set()) == {}


def test_a_short_home_splits_the_request_over_the_partitions_with_work():
    pk = PartitionPicker(8, 3)
    pk.plan(10, NOW, set())
    pk.note(3, 10, 2, 0, None, NOW)  # the home had 2
    for p, queued in ((1, 3), (5, 20)):
        pk.note(p, 0, 0, queued, None, NOW)
    for p in (0, 2, 4, 6, 7):
        pk.note(p, 0, 0, 0, None, NOW)
    share = pk.plan(10, NOW, set())
    # the empty home is not asked; most queued first, each up to its count
    assert share == {5: 10}
    share = pk.plan(25, NOW, set())
    assert share == {5: 22, 1: 3} and sum(share.values()) == 25
    # never more than asked, however many partitions hold work
    for p in range(8):
        pk.note(p, 0, 0, 5, None, NOW)
    pk.views[3].short = True
    share = pk.plan(4, NOW, set())
    assert sum(share.values()) == 4 and next(iter(share)) == 3  # the home first


def test_a_capped_partition_is_asked_again_only_with_a_freed_slot():
    pk = PartitionPicker(4, 0)
    pk.plan(8, NOW, set())
    pk.note(0, 8, 0, 0, None, NOW)
    for p in (2, 3):
        pk.note(p, 0, 0, 0, None, NOW)
    assert pk.plan(8, NOW, set()) == {1: 8}
    pk.note(1, 8, 4, 30, None, NOW)  # 4 leased, its host at its cap: 30 left
    assert 1 not in pk.plan(8, NOW, set())
    assert pk.next_ready(NOW) is None  # nothing may hand out work now: the pump polls
    assert pk.plan(8, NOW, {1}) == {1: 8}  # a download notice frees a slot there
    pk.note(1, 8, 1, 29, 0.25, NOW)  # its next host's turn in 0.25 s
    assert pk.next_ready(NOW) == 0.25 and 1 not in pk.plan(8, NOW, set())
    assert 1 in pk.plan(8, NOW + 0.25, set())


def test_a_partition_this_call_pushes_into_is_asked_in_the_same_call():
    pk = PartitionPicker(4, 0)
    pk.plan(4, NOW, set())
    for p in range(4):
        pk.note(p, 4 if p == 0 else 0, 0, 0, None, NOW)
    assert 2 in pk.plan(4, NOW, set(), {2})


def test_an_empty_partition_costs_one_request_per_2p_lease_requests():
    parts, calls = 8, 400
    pk = PartitionPicker(parts, 0)
    asked = [0] * parts
    for _ in range(calls):
        share = pk.plan(16, NOW, {5})
        for p, n in share.items():
            asked[p] += 1
            # partition 5 holds the work, capped: 4 leases a call; the others are empty
            pk.note(p, n, 4 if p == 5 else 0, 1000 if p == 5 else 0, None, NOW)
    bound = 1 + calls // (STALE_ROUNDS * parts)
    assert asked[5] == calls - 1  # (the first request: the home alone)
    assert all(asked[p] <= bound for p in range(parts) if p != 5), asked
    assert pk.counts()["empty_lease_calls"] <= (parts - 1) * bound


def test_a_short_call_says_again_now_only_while_a_partition_holds_due_work():
    pk = PartitionPicker(4, 0)
    pk.plan(4, NOW, set())
    pk.note(0, 4, 0, 0, None, NOW)
    pk.note(2, 0, 0, 7, None, NOW)
    assert pk.after_call(4, 0, None, NOW) == 0.0
    for p in (1, 3):
        pk.note(p, 0, 0, 0, None, NOW)
    pk.note(2, 4, 0, 0, None, NOW)  # nothing left there either
    assert pk.after_call(4, 0, None, NOW) is None
    assert pk.after_call(4, 4, 0.5, NOW) == 0.5  # not short: the partitions' own
    assert pk.empty_calls == 2


def test_a_home_that_always_has_work_starves_no_partition():
    """Partition 2 is no worker's home: a worker whose home never runs short still asks
    it for one lease once each 2 P lease requests, and every partition at least once."""
    parts, calls = 4, 200
    pk = PartitionPicker(parts, 0)
    asked = [0] * parts
    for _ in range(calls):
        for p, n in pk.plan(8, NOW, set()).items():
            asked[p] += 1
            pk.note(p, n, n, 100, None, NOW)  # every partition has work, hands out all
    assert asked[0] == calls
    for p in (1, 2, 3):
        assert 1 <= asked[p] <= 1 + calls // (STALE_ROUNDS * parts), asked


def test_a_worker_starting_on_an_empty_home_discovers_the_others_at_once():
    """Its first request goes to the home alone; the home had nothing: the pump is told to
    call again at once (not after a poll interval: a P = 8 worker's loop sat idle 3.7 % of
    a 1,000-page crawl), and that call asks every other partition."""
    pk = PartitionPicker(4, 1)
    assert pk.plan(8, NOW, set()) == {1: 8}
    pk.note(1, 8, 0, 0, None, NOW)
    assert pk.after_call(8, 0, None, NOW) == 0.0
    assert set(pk.plan(8, NOW, set())) == {0, 2, 3}
    for p in (0, 2, 3):
        pk.note(p, 1, 0, 0, None, NOW)  # nothing anywhere, or a partition unreachable
    assert pk.after_call(8, 0, None, NOW) is None  # the pump polls: no loop without work


def _crawl(pk: PartitionPicker, queued: list[int], cap: int, pages: int, per_call: int,
           held_max: int = 20) -> tuple[list[int], int]:
    """A worker's pump calls over partitions whose hosts are capped at *cap* leases in
    flight each (*queued*: their queued entries), in the order a real worker makes them:
    *per_call* downloads are over (a call with their notices), then those pages are parsed
    (a call with their acknowledgements, which free no slot); each call asks for what the
    worker may still hold, and again at once while told so.  As partitions.py does, a
    partition's notices go with the call when it is asked or is the home, else they wait
    for its next call (held) and free their slots then.  Returns the leases got per
    partition and the most a call asked for over its want."""
    inflight: list[tuple[int, bool]] = []  # (partition, downloaded), oldest first
    notices: dict[int, int] = {}  # per partition: download notices not sent yet
    leased = [0] * pk.parts
    over = 0

    def call() -> None:
        for _ in range(pk.parts):  # (and again at once while told so: next_ready 0)
            if one() != 0.0:
                return

    def one() -> float | None:
        nonlocal over
        want = held_max - len(inflight)
        share = pk.plan(want, NOW, set(notices), set(), set(notices) - {pk.home})
        over = max(over, sum(share.values()) - want)
        got_all = 0
        for p, n in share.items():
            freed = notices.pop(p, 0)
            busy = sum(1 for q, done in inflight if q == p and not done)
            got = min(n, queued[p], max(0, cap - busy))
            queued[p] -= got
            leased[p] += got
            got_all += got
            inflight.extend((p, False) for _ in range(got))
            pk.note(p, n, got, queued[p], None, NOW, freed)
        if pk.home in notices:  # (the home's part is never held)
            pk.note(pk.home, 0, 0, queued[pk.home], None, NOW, notices.pop(pk.home))
        return pk.after_call(want, got_all, None, NOW)

    call()
    done = 0
    while done < pages and inflight:
        for i in [i for i, (_, d) in enumerate(inflight) if not d][:per_call]:
            p = inflight[i][0]  # a download over: its notice frees a slot
            inflight[i] = (p, True)
            notices[p] = notices.get(p, 0) + 1
        call()
        acks = [i for i, (_, d) in enumerate(inflight) if d][:per_call]
        for i in reversed(acks):  # those pages parsed: their acknowledgements
            del inflight[i]
        call()
        done += len(acks)
    return leased, over


def test_work_in_one_capped_partition_is_asked_with_its_download_notices():
    """One host, in partition 0 of 8, capped at 16 requests in flight; the worker's home is
    partition 2; 4 pages per call (P = 1 makes ~6.5).  A call that frees slots there
    (download notices) asks it; a call that only acknowledges asks nobody (it asked the
    empty home: 0.26 empty lease calls per page and a loop idle a quarter of the crawl at
    P = 8, bench/README.md).  Empty lease calls: the discovery at start, and one partition
    not seen for 2 P lease requests once each 2 P of them: at most 0.05 per page."""
    pk = PartitionPicker(8, 2)
    pages = 600
    leased, over = _crawl(pk, [pages + 20] + [0] * 7, 16, pages, 4)
    assert over == 0
    assert leased[0] >= pages and sum(leased) == leased[0]
    counts = pk.counts()
    assert counts["empty_lease_calls"] <= 0.05 * pages, counts
    assert counts["empty_lease_calls"] <= 8 + pk.calls // (STALE_ROUNDS * 8), counts
    # the home is asked only when not seen for 2 P lease requests
    assert counts["lease_calls_by_partition"][2] <= 2 + pk.calls // (STALE_ROUNDS * 8)
    # every call with download notices asks partition 0, and leases there (its queue
    # never runs dry here)
    assert counts["lease_calls_by_partition"][0] >= pages // 4
    assert counts["empty_lease_calls_by_partition"][0] == 0


def test_work_in_the_home_capped_is_leased_with_each_download_notice():
    """The same host in the worker's home partition: the same counts."""
    pk = PartitionPicker(8, 0)
    pages = 600
    leased, over = _crawl(pk, [pages + 20] + [0] * 7, 16, pages, 4)
    assert over == 0 and leased[0] >= pages and sum(leased) == leased[0]
    counts = pk.counts()
    assert counts["empty_lease_calls"] <= 0.05 * pages, counts
    assert counts["empty_lease_calls_by_partition"][0] <= 1, counts


def test_work_spread_over_every_partition_capped():
    """Work in all 8 partitions (3 hosts each, capped at 2 requests in flight each: 6 per
    partition); the worker holds up to 20.  It leases from every partition, never asks for
    more than it may hold, and its lease calls that get nothing stay under 0.05 per page."""
    pk = PartitionPicker(8, 5)
    pages = 800
    leased, over = _crawl(pk, [200] * 8, 6, pages, 4)
    assert over == 0
    assert all(n > 0 for n in leased), leased
    counts = pk.counts()
    assert counts["empty_lease_calls"] <= 0.05 * pages, counts
    # the home first: it hands out the most
    assert leased[5] == max(leased), leased


def test_a_capped_partition_handing_out_the_slots_freed_is_still_at_its_cap():
    """Partition 0 of 8 holds the work, its host at its cap; the home (1) is empty.  A call
    that frees no slot there asks no partition (a skipped lease request, and no "call again
    at once": the pump waits for a notice or its poll); a call freeing k slots that gets k
    leases leaves it at its cap; one that gets fewer than it freed, or a slot freed by a
    call that asked for nothing, makes it due again."""
    pk = PartitionPicker(8, 1)
    assert pk.plan(8, NOW, set()) == {1: 8}
    pk.note(1, 8, 0, 0, None, NOW)
    for p in range(8):
        pk.note(p, 0, 0, 50 if p == 0 else 0, None, NOW)
    assert pk.plan(8, NOW, set()) == {0: 8}
    pk.note(0, 8, 4, 46, None, NOW)  # 4: its cap
    assert pk.plan(4, NOW, set()) == {} and pk.after_call(4, 0, None, NOW) is None
    assert pk.plan(2, NOW, {0}) == {0: 2}
    pk.note(0, 2, 2, 44, None, NOW, freed=2)  # the 2 slots freed, taken again
    assert pk.plan(4, NOW, set()) == {}
    assert pk.plan(2, NOW, {0}) == {0: 2}
    pk.note(0, 2, 2, 42, None, NOW, freed=3)  # 3 freed, 2 taken: one slot is free
    assert pk.plan(4, NOW, set()) == {0: 4}
    pk.note(0, 4, 1, 41, None, NOW)
    assert pk.plan(4, NOW, set()) == {}
    pk.note(0, 0, 0, 41, None, NOW, freed=1)  # a notice in a call that asked for nothing
    assert pk.plan(4, NOW, set()) == {0: 4}
    counts = pk.counts()
    assert counts["skipped_lease_requests"] == 3 and counts["empty_lease_calls"] == 1
    assert pk.empty_calls == 0  # (a skipped request is not an empty one)
