"""A worker's side of crawl control (issue 34, docs/control.md): what the last frontier call
said of the crawl's pause and its paused or blocked hosts, and the gate every download passes.

The state is Redis's (lua/step_control.lua reads it atomically in each frontier call: a
paused crawl or host gets no lease); a worker holds only the copy its last reply carried
(:class:`WorkerControl`), to hold back the requests it leased *before* the pause: they wait at
:func:`gate`, the last step before a request goes on the wire (``engine_hooks.gate_sends``),
still leased (the heartbeat extends them), and go once the crawl or host is resumed.  No
lease is given back, so the counts stay exact; requests already on the wire finish and are
acknowledged.  The worker's next call reports the generation it holds (``cg``, recorded in
``ctlseen``): `pause` returns once every live worker reported it, so nothing starts after it
returns.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scrapy_fleet.frontier.protocol import ControlState

#: seconds between two looks of a held request at the worker's control state (a resume is
#: seen at the worker's next frontier call, then within this)
GATE_POLL = 0.05

#: stats key counting the downloads held back by a pause
HELD_STAT = "fleet/control/held"


class WorkerControl:
    """The control state of this worker's last frontier reply.  Times are ``time.monotonic()``
    seconds; ``gen`` is the generation the worker holds (0: none seen)."""

    def __init__(self) -> None:
        self.gen = 0
        self.paused_until: float | None = None  #: the crawl's pause ends (inf: resume)
        self.hosts: dict[str, float] = {}  #: host -> when its pause ends (inf: unblock)

    def apply(self, state: ControlState) -> bool:
        """Hold *state* (a reply's); True when its generation is new to this worker."""
        now = time.monotonic()
        self.paused_until = None if state.paused is None else now + state.paused
        self.hosts = {h: now + left for h, left in state.hosts.items()}
        new = state.gen != self.gen
        self.gen = state.gen
        return new

    def holds(self, host: str) -> bool:
        """Whether a request to *host* must wait now (the crawl or the host is paused)."""
        now = time.monotonic()
        if self.paused_until is not None and now < self.paused_until:
            return True
        until = self.hosts.get(host)
        return until is not None and now < until


async def gate(crawler: Any, request: Any, host: str) -> None:
    """Wait while this worker's control state holds *host* (:class:`WorkerControl`); counts
    each held request once in ``fleet/control/held``."""
    from scrapy_fleet import engine_hooks

    ledger = engine_hooks.ledger_of(crawler)
    control: WorkerControl | None = getattr(ledger, "control", None)
    if control is None or not control.holds(host):
        return
    if crawler.stats is not None:
        crawler.stats.inc_value(HELD_STAT)
    while control.holds(host):
        await asyncio.sleep(GATE_POLL)
