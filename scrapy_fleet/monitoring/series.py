"""The fleet's time series: fixed-size ring buffers in Redis, one STRING per tier.

lua/monitoring.lua samples the frontier at most once per step of each tier, fleet-wide (the
check is against the Redis server's clock, inside the frontier call of any worker; the monitor
process samples with the same script).  A sample is ``FIELDS`` signed 64-bit big-endian
integers (Redis ``BITFIELD i64``) written at slot ``(t_ms // step_ms) % points``::

    t_ms, due, deferred, leased, parked, dead, pages, items, bans, workers_alive

``pages``, ``items`` and ``bans`` are the fleet-wide counters at the sample time, so a rate is
the difference of two samples divided by their time apart (a missed step loses nothing).  A
slot whose ``t_ms`` is not within the window the slot stands for now holds an older lap of the
ring: it reads as no data.  Each tier's string is ``points * FIELDS * 8`` bytes from its first
sample on, whatever the crawl's size or its workers' churn.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

#: tier -> (step seconds, points): 10 s for an hour, 1 min for a day, 10 min for a week
TIERS: dict[str, tuple[int, int]] = {"10s": (10, 360), "1m": (60, 1440), "10m": (600, 1008)}
#: i64 fields of one sample, in slot order (lua/monitoring.lua writes the same)
FIELDS = ("t_ms", "due", "deferred", "leased", "parked", "dead", "pages", "items", "bans",
          "workers_alive")
SLOT_BYTES = 8 * len(FIELDS)
_SLOT = struct.Struct(">" + "q" * len(FIELDS))

#: series names of :func:`read_series` (each one value per step, None where no data)
SERIES: tuple[str, ...] = ("depth_due", "depth_deferred", "depth_leased", "depth_parked",
                           "depth_dead", "pages_per_min", "items_per_min", "block_rate",
                           "workers_alive")


def tier_bytes(tier: str) -> int:
    """Size in bytes of tier *tier*'s ring buffer (fixed)."""
    return TIERS[tier][1] * SLOT_BYTES


@dataclass(frozen=True)
class Sample:
    """One sample (see module docstring); ``t`` in unix seconds."""

    t: float
    due: int
    deferred: int
    leased: int
    parked: int
    dead: int
    pages: int
    items: int
    bans: int
    workers_alive: int


def decode(raw: bytes | None, tier: str, now_s: float) -> list[Sample]:
    """Samples of a tier's ring buffer that belong to the current lap, oldest first.

    *raw*: the STRING's value (None or short: no data); *now_s*: Redis server time.
    """
    step, points = TIERS[tier]
    if not raw:
        return []
    step_ms = step * 1000
    now_slot = int(now_s * 1000) // step_ms
    out = []
    for i in range(min(points, len(raw) // SLOT_BYTES)):
        values = _SLOT.unpack_from(raw, i * SLOT_BYTES)
        t_ms = values[0]
        if t_ms <= 0:
            continue
        slot_no = t_ms // step_ms
        # the slot stands for one of the last `points` steps, and is this one's
        if slot_no % points != i or not now_slot - points < slot_no <= now_slot:
            continue
        out.append(Sample(t_ms / 1000, *values[1:]))
    out.sort(key=lambda s: s.t)
    return out


def points_of(samples: list[Sample], name: str) -> list[tuple[float, float | None]]:
    """Series *name* (one of SERIES) from samples, as ``[(t, value or None)]``.

    Rates come from two consecutive samples: pages (items) per minute = the counter's increase
    / their time apart * 60; block rate = bans' increase / pages' increase (None when no page
    came in between).  The first sample has no rate (None).
    """
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}: one of {', '.join(SERIES)}")
    out: list[tuple[float, float | None]] = []
    prev: Sample | None = None
    for s in samples:
        value: float | None
        if name.startswith("depth_"):
            value = float(getattr(s, name[len("depth_"):]))
        elif name == "workers_alive":
            value = float(s.workers_alive)
        elif prev is None or s.t <= prev.t:
            value = None
        elif name == "pages_per_min":
            value = max(0, s.pages - prev.pages) * 60.0 / (s.t - prev.t)
        elif name == "items_per_min":
            value = max(0, s.items - prev.items) * 60.0 / (s.t - prev.t)
        else:  # block_rate
            pages = s.pages - prev.pages
            value = None if pages <= 0 else max(0, s.bans - prev.bans) / pages
        out.append((s.t, value))
        prev = s
    return out


def fill_steps(points: list[tuple[float, float | None]], tier: str, since_s: float,
               now_s: float) -> list[tuple[float, float | None]]:
    """One point per step from *since_s* to *now_s* (the step's start time), None where the
    ring holds no sample for that step."""
    step = TIERS[tier][0]
    by_slot: dict[int, float | None] = {int(t // step): v for t, v in points}
    first, last = int(since_s // step), int(now_s // step)
    return [(float(n * step), by_slot.get(n)) for n in range(first, last + 1)]


def as_json(points: list[tuple[float, float | None]]) -> list[list[Any]]:
    return [[t, v] for t, v in points]
