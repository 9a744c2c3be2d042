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
