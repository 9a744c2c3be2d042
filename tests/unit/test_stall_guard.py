"""frontier/liveness.py StallGuard: when a worker holds its prefetch back after a stall that
may have made it dead to the fleet, and when a frontier call ends the hold (no I/O)."""

from __future__ import annotations

import time

from scrapy_fleet.frontier.liveness import LivenessBeat, StallGuard
from scrapy_fleet.keys import CrawlKeys


def test_a_worker_heard_from_recently_takes_its_prefetch():
    guard = StallGuard(6.0)
    assert guard.suspect() is False
    guard.confirmed(time.monotonic(), revalidates=False)
    assert guard.suspect() is False


def test_after_a_stall_the_prefetch_waits_for_a_call_that_extends_every_lease():
    guard = StallGuard(6.0)
    guard.confirmed_at = time.monotonic() - 3.5  # (no reply for more than 6 / 2 s)
    assert guard.suspect() is None  # from now on: the pump's next call is a heartbeat
    assert guard.suspect() is True
    stalled_at = guard.held_since
    assert stalled_at is not None
    # a call sent before the hold, or one that did not extend every lease: still held
    assert guard.confirmed(stalled_at - 1.0, revalidates=True) is False
    assert guard.confirmed(time.monotonic(), revalidates=False) is False
    assert guard.suspect() is True
    assert guard.confirmed(time.monotonic(), revalidates=True) is True
    assert (guard.suspect(), guard.held_since) == (False, None)


def test_a_liveness_beat_that_got_through_is_a_sign_of_life_too():
    beat = LivenessBeat("redis://127.0.0.1:1/0", [CrawlKeys("fleet", "c")], "w", 6.0, 1.0)
    guard = StallGuard(6.0, beat)
    guard.confirmed_at = time.monotonic() - 30.0  # the reactor was busy, the thread beat
    beat.last_ok = time.monotonic() - 1.0
    assert guard.suspect() is False
    beat.last_ok = time.monotonic() - 3.5
    assert guard.suspect() is None


def test_nothing_prefetched_or_no_death_delay_holds_nothing_back():
    guard = StallGuard(6.0)
    guard.confirmed_at = time.monotonic() - 30.0
    assert guard.suspect(prefetched=False) is False
    assert StallGuard(0.0).suspect() is False
