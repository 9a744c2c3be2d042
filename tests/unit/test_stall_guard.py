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


def test_a_silence_seen_only_once_signs_of_life_resumed_still_holds_the_prefetch():
    """SIGSTOP past the death delay, then SIGCONT: the liveness thread beats at once, before
    the engine asks for a request.  The latest sign is fresh, but the silence before it may
    have made the worker dead: the prefetch is held until a call extends every lease (the
    trial's resumed worker fetched pages the others had taken: revalidated never counted)."""
    beat = LivenessBeat("redis://127.0.0.1:1/0", [CrawlKeys("fleet", "c")], "w", 6.0, 1.0)
    guard = StallGuard(6.0, beat)
    stopped = time.monotonic() - 12.0
    guard.confirmed_at = beat.last_ok = stopped
    resumed = time.monotonic()
    guard.sign(resumed)  # (the thread, first after SIGCONT: LivenessBeat calls on_beat)
    beat.last_ok = resumed
    assert guard.suspect() is None  # announced once: the pump's next call is a heartbeat
    assert guard.suspect() is True
    # a call that went before the silence ended, or one that did not extend every lease: held
    assert guard.confirmed(stopped + 0.5, revalidates=True) is False
    assert guard.confirmed(resumed + 0.01, revalidates=False) is False
    assert guard.confirmed(resumed + 0.02, revalidates=True) is True
    assert guard.suspect() is False


def test_a_call_after_a_silence_that_extends_every_lease_ends_the_hold_it_finds():
    guard = StallGuard(6.0)
    guard.confirmed_at = time.monotonic() - 12.0
    assert guard.confirmed(time.monotonic(), revalidates=False) is False  # (the first: start-up)
    assert guard.suspect() is False
    guard.confirmed_at = time.monotonic() - 12.0
    assert guard.confirmed(time.monotonic(), revalidates=True) is True  # (counted: revalidated)
    assert (guard.suspect(), guard.held_since) == (False, None)
    guard.confirmed_at = time.monotonic() - 12.0
    assert guard.confirmed(time.monotonic(), revalidates=False) is False
    assert guard.suspect() is None and guard.suspect() is True


def test_signs_of_life_closer_than_half_the_death_delay_hold_nothing():
    guard = StallGuard(6.0)
    guard.confirmed_at = time.monotonic() - 2.5
    guard.sign(time.monotonic())
    assert guard.suspect() is False
    assert StallGuard(0.0).sign(time.monotonic()) is None
