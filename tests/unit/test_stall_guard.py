"""frontier/liveness.py StallGuard: which partitions' leased requests a worker holds back
after a stall that may have made it dead to them, and when a frontier call ends the hold
(no I/O; times are given, never waited for)."""

from __future__ import annotations

import time

from scrapy_fleet.frontier.liveness import LivenessBeat, StallGuard
from scrapy_fleet.frontier.routing import entry_ref, lease_partition
from scrapy_fleet.keys.crawl import CrawlKeys


def test_a_worker_heard_from_recently_holds_nothing():
    guard = StallGuard(6.0)
    now = time.monotonic()
    assert guard.quiet(now) and guard.check({0}, now) == set()
    guard.confirmed(now - 1.0, False, [0])
    assert guard.quiet(now) and guard.check({0}, now) == set()
    assert guard.revalidation_due() is False


def test_after_a_silence_seen_now_the_partition_waits_for_a_call_that_extends_every_lease():
    guard = StallGuard(6.0)
    t0 = time.monotonic()
    guard.confirmed(t0, False, [0])
    assert guard.check({0}, t0 + 3.5) == {0}  # (no sign for more than 6 / 2 s)
    assert guard.revalidation_due() is True  # once: the pump's next call is a heartbeat
    assert guard.revalidation_due() is False
    # a call sent before the hold, or one that did not extend every lease: still held
    assert guard.confirmed(t0 + 3.0, True, [0]) is False
    assert guard.confirmed(t0 + 3.6, False, [0]) is False
    assert guard.check({0}, t0 + 3.7) == {0}
    assert guard.confirmed(t0 + 3.8, True, [0]) is True
    assert guard.check({0}, t0 + 3.9) == set()


def test_a_silence_seen_only_once_signs_of_life_resumed_still_holds():
    """SIGSTOP past the death delay, then SIGCONT: the beat thread beats at once, before the
    engine asks for a request.  The latest sign is fresh, but the silence before it may have
    made the worker dead: the partition is held until a call extends every lease (the trial's
    resumed worker fetched pages the others had taken)."""
    beat = LivenessBeat("redis://127.0.0.1:1/0", [CrawlKeys("fleet", "c")], "w", 6.0, 1.0)
    guard = StallGuard(6.0, beat)
    t0 = time.monotonic()
    guard.sign(0, t0)
    guard.sign(0, t0 + 12.0)  # (the thread, first after SIGCONT)
    assert not guard.quiet(t0 + 12.1)
    assert guard.check({0}, t0 + 12.1) == {0}
    assert guard.revalidation_due() is True
    assert guard.confirmed(t0 + 12.05, True, [0]) is True


def test_a_partition_that_missed_beats_holds_only_its_own_requests():
    """One master of a partitioned crawl down: the beats and calls that reach partitions 1
    and 2 keep them going; partition 0, silent past half the death delay, is held until a
    call extending every lease gets its reply (the reverted fix held every partition)."""
    guard = StallGuard(6.0)
    t0 = time.monotonic()
    for t in (t0, t0 + 1.2, t0 + 2.4, t0 + 3.6, t0 + 4.8):
        for p in (1, 2):
            guard.sign(p, t)
    guard.sign(0, t0)
    assert guard.check({0, 1, 2}, t0 + 5.0) == {0}
    assert guard.revalidation_due() is True
    # the promotion: a heartbeat reaches every partition
    assert guard.confirmed(t0 + 8.0, True, [0, 1, 2]) is True
    assert guard.check({0, 1, 2}, t0 + 8.1) == set()
    # the first beat that reaches partition 0 again after its silence holds it too, when no
    # check saw the silence first; a call reaching only the others does not end that hold
    guard = StallGuard(6.0)
    guard.sign(0, t0)
    for t in (t0, t0 + 2.5, t0 + 5.0):
        guard.sign(1, t)
    guard.sign(0, t0 + 5.0)
    assert guard.check({0, 1}, t0 + 5.1) == {0}
    assert guard.confirmed(t0 + 5.2, True, [1]) is False
    assert guard.check({0, 1}, t0 + 5.3) == {0}


def test_a_hold_on_a_partition_the_worker_holds_no_lease_of_is_let_go():
    guard = StallGuard(6.0)
    t0 = time.monotonic()
    guard.sign(3, t0)
    guard.sign(3, t0 + 5.0)
    assert guard.check({0}, t0 + 5.0) == set()  # (a later lease comes from a later call)
    assert StallGuard(0.0).check({0}, t0 + 60.0) == set()
    assert StallGuard(0.0).quiet(t0 + 60.0)


def test_a_beat_reaches_each_partition_on_its_own():
    """A partition that cannot be reached (its master down) does not keep the beat from the
    partitions after it."""
    reached: list[tuple[int, float]] = []
    parts = [CrawlKeys("fleet", "c").partition(p, 3) for p in range(3)]
    beat = LivenessBeat("redis://127.0.0.1:1/0", parts, "w", 6.0, 1.0,
                        on_beat=lambda p, at: reached.append((p, at)))

    def script(keys: list[str], args: list[object]) -> int:
        if keys[0].startswith(parts[0].base):
            raise ConnectionError("partition 0's master is down")
        return 1

    assert beat.beat_round(script) is False
    assert [p for p, _ in reached] == [1, 2]
    assert beat.last_ok is None


def test_a_lease_partition_is_read_from_its_entry_id():
    assert lease_partition(entry_ref(5, "000000000000012")) == 5
    assert lease_partition("000000000000012") == 0
