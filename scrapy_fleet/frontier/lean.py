"""The lean push call of a partitioned crawl (lua/push_lean.lua, docs/partitions.md): its
argument and its reply.  Used by :class:`~scrapy_fleet.frontier.partitions.
PartitionedFrontier` for foreign links and by the push command."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack

from scrapy_fleet.frontier.protocol import OP_TTL_MS, FrontierParams


def lean_args(pushes: list[tuple[Any, ...]], params: FrontierParams, marker: str) -> bytes:
    """ARGV[1] of lua/push_lean.lua: *pushes* are ``(bloom key, priority, payload, host,
    delay ms[, lastmod s[, partition, entry number]])`` (the last two: a stored response's
    page, routing.stored_source)."""
    return msgpack.packb({
        "p": [[p[0], int(p[1]), p[2], p[3], int(p[4]) if len(p) > 4 else 0,
               int(p[5]) if len(p) > 5 else 0, *p[6:8]] for p in pushes],
        "bn": params.bloom_capacity, "bp": params.bloom_error_rate,
        "qm": params.queue_max or 0, "hm": params.host_queue_max or 0,
        "ot": OP_TTL_MS, "mk": marker, "mc": uuid.uuid4().hex,
    }, use_bin_type=False)


@dataclass
class LeanResult:
    """Reply of lua/push_lean.lua (indexes 0-based, into the call's pushes)."""

    flags: list[int]
    refused: list[int]
    seen: list[int]
    pushed: int
    duplicates: int
    full: bool
    marker: str
    size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: (stored responses, their bytes) when a push was a stored response (FLEET_ROLE)
    rq: tuple[int, int] | None = None

    @classmethod
    def from_reply(cls, reply: bytes) -> LeanResult:
        d = {k.decode(): v for k, v in msgpack.unpackb(reply, raw=True).items()}
        rq = d.get("rq")
        return cls([int(x) for x in d.get("pf", [])], [int(x) for x in d.get("rf", [])],
                   [int(x) for x in d.get("pd", [])], int(d.get("new", 0)),
                   int(d.get("dup", 0)), bool(d.get("full", False)),
                   (d.get("mk") or b"").decode(errors="replace"),
                   int(d["size"]) if d.get("size") is not None else None,
                   rq=(int(rq[0]), int(rq[1])) if isinstance(rq, list) and len(rq) == 2
                   else None)
