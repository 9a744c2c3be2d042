"""A worker's side of crawl control (issue 34, docs/control.md): what the last frontier call
said of the crawl's pause and its paused or blocked hosts, and the gate every download passes.

The state is Redis's (lua/step_control.lua reads it atomically in each frontier call: a
paused crawl or host gets no lease); a worker holds only the copy its last reply carried
(:class:`WorkerControl`), to hold back the requests it leased *before* the pause at
:func:`gate`, the last step before a request goes on the wire (``engine_hooks.gate_sends``).
While the crawl is paused they wait there, still leased (the heartbeat extends them), and go
once it is resumed.  A request of a paused or blocked host (the crawl running) is given back
instead (released at the next call, ``fleet/control/given_back``): waiting, it would take one
of the worker's download slots from the hosts still served.  Either way no entry is fetched
twice or lost; requests already on the wire finish and are acknowledged.  The worker's next
call reports the generation it holds (``cg``, recorded in ``ctlseen``): `pause` returns once
every live worker reported it, so nothing starts after it returns.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scrapy.exceptions import IgnoreRequest

from scrapy_fleet.errors import FleetError
from scrapy_fleet.frontier.protocol import ControlState

#: seconds between two looks of a held request at the worker's control state (a resume is
#: seen at the worker's next frontier call, then within this)
GATE_POLL = 0.05

#: seconds a worker holding prefetched requests (not started yet) goes without a frontier
#: call at most, so that it learns of a pause within this and `pause` returns within about
#: twice this (frontier/pump.py: a call then carries nothing but what every call carries,
#: the generation held; a worker calling more often for its pages makes none)
CONTROL_POLL = 0.8

#: stats key counting the downloads held back by a pause
HELD_STAT = "fleet/control/held"
#: stats key counting the leases given back because their host is paused or blocked
GIVEN_BACK_STAT = "fleet/control/given_back"


class HostPaused(FleetError, IgnoreRequest):
    """A leased request of a paused or blocked host, given back to the frontier unsent (the
    engine drops it here; another worker fetches it once the host is resumed).  Like any
    ``IgnoreRequest``, the request's errback gets it; it is no failure."""


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

    def crawl_paused(self) -> bool:
        """Whether the whole crawl is paused now."""
        return self.paused_until is not None and time.monotonic() < self.paused_until

    def holds(self, host: str) -> bool:
        """Whether a request to *host* must wait now (the crawl or the host is paused)."""
        now = time.monotonic()
        if self.paused_until is not None and now < self.paused_until:
            return True
        until = self.hosts.get(host)
        return until is not None and now < until


async def gate(crawler: Any, request: Any, host: str) -> None:
    """Wait while this worker's control state holds *host* (:class:`WorkerControl`); counts
    each held request once in ``fleet/control/held``.

    Raises:
        HostPaused: the crawl runs but *host* is paused or blocked: the request's lease was
            given back (its entry is leased again once the host is resumed).
    """
    from scrapy_fleet import engine_hooks

    ledger = engine_hooks.ledger_of(crawler)
    control: WorkerControl | None = getattr(ledger, "control", None)
    if control is None or not control.holds(host):
        return
    if crawler.stats is not None:
        crawler.stats.inc_value(HELD_STAT)
    while control.holds(host):
        if not control.crawl_paused() and ledger is not None and ledger.give_back(request):
            if crawler.stats is not None:
                crawler.stats.inc_value(GIVEN_BACK_STAT)
            raise HostPaused(f"host {host} is paused or blocked: its lease goes back")
        await asyncio.sleep(GATE_POLL)


def read_state(client: Any, keys: Any, now_ms: int) -> dict[str, Any] | None:
    """The crawl control of *keys*' frontier at server time *now_ms*, for ``status``, ``top``
    and ``/metrics``: ``{"paused": bool, "until" (ms; 0: until resumed; -1: running), "by",
    "at" (ms), "why", "gen", "hosts": {host: {"kind" (pause|block), "until", "by", "why"}}}``
    (hosts whose pause is over left out); None when control was never used (no ``ctl`` key).

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    raw = client.get(keys.ctl)
    if raw is None:
        return None
    info = {f.decode(): v.decode(errors="replace")
            for f, v in client.hgetall(keys.control).items()}
    until = _int(info.get("until"), -1)
    hosts = {}
    for h, v in client.hgetall(keys.ctlhosts).items():
        parts = [*v.decode(errors="replace").split("|", 4), "", "", "", ""]
        u = _int(parts[0], -1)
        if u == 0 or u > now_ms:
            hosts[h.decode(errors="replace")] = {"kind": parts[1] or "pause", "until": u,
                                                 "by": parts[2], "why": parts[4]}
    return {"paused": until == 0 or until > now_ms, "until": until,
            "by": info.get("by", ""), "at": _int(info.get("at"), 0), "why": info.get("why", ""),
            "gen": _int(raw.split(b"|")[0], 0), "hosts": hosts}


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def status_line(state: dict[str, Any]) -> str:
    """The ``control`` line of ``status`` and ``top`` for :func:`read_state`'s *state*."""
    if state["paused"]:
        until = ("until resumed" if state["until"] == 0
                 else f"until {time.strftime('%H:%M:%S', time.gmtime(state['until'] / 1000))} "
                      "UTC")
        line = f"  control    PAUSED by {state['by']} {until}"
        if state["why"]:
            line += f" ({state['why']})"
    else:
        line = "  control    running"
    hosts = state["hosts"]
    if hosts:
        names = ", ".join(f"{h} ({v['kind']})" for h, v in sorted(hosts.items())[:10])
        line += f"; {len(hosts)} host(s) paused or blocked: {names}"
    return line
