"""The learned capacity of a host outlives the crawl (issue 35, item 4).

A host's adaptive controller (lua/adaptive.lua) lives in its crawl's keys.  What it learned,
the capacity (the rate of its last overload, requests/s), is also kept fleet-wide, per host,
under :func:`~scrapy_fleet.keys.fleet.learned_capacity_key` for ``FLEET_ADAPTIVE_MEMORY`` seconds
(7 days by default), so that another crawl or a recrawl of the host starts there instead of
at the configured ceiling.

* **Recall**: the first time a worker sees a host it reads the host's stored capacity (one
  GET) and, when there is one, seeds the crawl's controller with it (lua/politeness.lua's
  ``adaptive_seed``: only when the crawl has no state for the host yet, never above the
  host's ceiling).  The requests leased before that (at most one per worker) go at the ceiling.
* **Keep**: after an overload answer, once the report reached the controller (at least
  :data:`KEEP_AFTER` seconds later, with the worker's next answer from any host), the worker
  reads the host's capacity from the controller and writes it (SET with an expiry: the same
  value from any worker, idempotent); at the spider's close, every host still to be kept.

The value is text ``"<capacity>|<rate>"`` (requests/s), never unpickled; one that does not read as
a positive capacity is ignored (and counted).  Stats: ``fleet/politeness/memory/recalled``
(controllers seeded), ``fleet/politeness/memory/kept`` (capacities written),
``fleet/politeness/memory/unreadable``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scrapy_fleet.keys.fleet import learned_capacity_key

#: seconds after an overload answer before its host's capacity is read and kept: the
#: answer's report reaches the controller with the worker's next frontier call
KEEP_AFTER = 2.0

_STAT = "fleet/politeness/memory/"


def parse_capacity(raw: bytes | str | None) -> float | None:
    """The capacity (requests/s) of a stored ``"<capacity>|<rate>"``; None when
    absent or not a positive finite number."""
    if raw is None:
        return None
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        value = float(text.split("|", 1)[0])
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


class CapacityMemory:
    """Recall and keep the learned capacities of one worker's hosts (see the module).

    *politeness* is the worker's :class:`~scrapy_fleet.politeness.hosts.Politeness` (its
    ``client``, ``adaptive_state`` and ``adaptive_seed``), *prefix* the fleet's key prefix,
    *ttl* seconds (> 0), *window* the controller's clean window (s), *inc* the worker's
    stats counter.  Redis errors are
    raised to the caller (the middleware reports them; nothing is kept or recalled then).
    """

    def __init__(self, politeness: Any, prefix: str, ttl: float, window: float,
                 inc: Callable[[str], None]) -> None:
        self._politeness = politeness
        self._prefix = prefix
        self._ttl_ms = max(1, int(ttl * 1000))
        self._window_ms = int(window * 1000)
        self._inc = inc
        self._seen: set[str] = set()
        self._to_keep: dict[str, float] = {}  # host -> monotonic time of its overload answer

    async def recall(self, host: str) -> None:
        """Seed *host*'s controller from its stored capacity, once per host and process."""
        if host in self._seen or not host:
            return
        self._seen.add(host)
        raw = await self._politeness.client.get(learned_capacity_key(self._prefix, host))
        if raw is None:
            return
        capacity = parse_capacity(raw)
        if capacity is None:
            self._inc(_STAT + "unreadable")
            return
        reply = await self._politeness.adaptive_seed(host, capacity, self._window_ms)
        if int(reply.get("seeded", 0)):
            self._inc(_STAT + "recalled")

    async def after(self, host: str, overload: bool) -> None:
        """After an answer of *host*: note it when an *overload* (its capacity is kept once
        the controller has it), and keep the capacities that are due."""
        if overload:
            self._to_keep.setdefault(host, time.monotonic())
        if self._to_keep:
            await self.keep_due()

    async def close(self) -> None:
        """At the spider's close: keep every capacity still to be kept."""
        await self.keep_due(everything=True)

    async def keep_due(self, everything: bool = False) -> None:
        """Write the capacity of the hosts whose overload answer is at least KEEP_AFTER s
        old (*everything*: of every host noted)."""
        now = time.monotonic()
        due = [h for h, t in self._to_keep.items() if everything or now - t >= KEEP_AFTER]
        for host in due:
            del self._to_keep[host]
            reply = await self._politeness.adaptive_state(host)
            capacity = parse_capacity(reply.get("cap"))
            if capacity is None:
                continue
            value = f"{capacity:.6g}|{float(reply.get('r') or 0):.6g}"
            await self._politeness.client.set(learned_capacity_key(self._prefix, host), value,
                                              px=self._ttl_ms)
            self._inc(_STAT + "kept")
