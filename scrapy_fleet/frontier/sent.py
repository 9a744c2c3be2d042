"""A worker's frontier call as the pump sent it (frontier/pump.py), kept when it failed
without a reply: the pump's next call sends it again as it was, same op id, so a call that
ran gets its cached reply and one that did not runs now (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

from scrapy_fleet.frontier.leases import Lease, Out
from scrapy_fleet.frontier.protocol import CallBatch


@dataclass
class SentCall:
    """A call as sent: its batch, what of the book's buffers it carried (the first *n_out*
    of the outbox, *n_done* of the done, *n_dead* of the dead letters: *outbox*, *done*),
    whether it was the final one, its monitoring payload (ARGV[2], its counter deltas
    pending until confirmed), and its op id once it failed (None before)."""

    batch: CallBatch
    n_out: int
    n_done: int
    n_dead: int
    final: bool
    monitor: bytes
    outbox: list[Out]
    done: list[Lease]
    op_id: str | None = None


def entry_ids(batch: CallBatch) -> set[str]:
    """The entry ids of the leases *batch* names (acknowledged, extended, released, dead
    letters, download notices)."""
    return {str(item[0]) for name in ("acks", "extends", "releases", "dead", "downloaded")
            for item in getattr(batch, name)}
