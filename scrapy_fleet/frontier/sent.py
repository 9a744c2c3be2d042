"""A worker's frontier call as the pump sent it (frontier/pump.py), kept when it failed
without a reply: the pump's next call sends it again as it was, same op id, so a call that
ran gets its cached reply and one that did not runs now (docs/architecture.md).  So too, in a
partitioned crawl (frontier/partitions.py), a partition's part of a call and a lean push."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from scrapy_fleet.errors import CrawlStateLostError
from scrapy_fleet.frontier.dupecache import StaleDupeCache
from scrapy_fleet.frontier.leases import Lease, Out
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, unencoded
from scrapy_fleet.frontier.records import Push

if TYPE_CHECKING:
    from scrapy_fleet.frontier.client import AsyncFrontier


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


@dataclass
class SentPart:
    """A partition's part of a partitioned worker's call (frontier/partitions.py) as sent, kept
    when it failed without a reply: sent again as it was (its batch, its monitoring payload,
    its op id) before that partition's next part, so a part that ran gets its cached reply."""

    batch: CallBatch
    monitor: bytes
    op_id: str


@dataclass
class SentLean:
    """A lean push (lua/push_lean.lua) as sent: its op id, its argument (ARGV[1], which names
    the marker it may write) and its rows; kept when its reply was lost (it failed without
    one, or a later lean push of the same links failed), to be sent again as it was."""

    op_id: str
    arg: bytes
    rows: list[Push]
    #: the op id of the previous lean call to that partition, named as the evidence of the
    #: known duplicates left out (frontier/lean.py LeanDestination; "-": none)
    prev_op: str = "-"
    #: the indexes in *rows* of the pushes the argument carries (None: all; the others were
    #: left out as known duplicates)
    kept: list[int] | None = None
    #: its reply, once it came (a push kept because a later one of the same links failed
    #: is not sent again: the next lean call there deletes this one's reply cache)
    reply: bytes | None = None


def match_rows(kept: list[SentLean], rows: list[Push]
               ) -> tuple[list[tuple[SentLean, list[int]]], list[int]]:
    """The lean pushes of *kept* all of whose rows are among *rows*, each with the indexes in
    *rows* of its rows (in its order; each row of *rows* counts once), and the indexes of
    the rows none of them carries.  A kept push some of whose rows are gone is dropped."""
    free: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(rows):
        free.setdefault(tuple(row), []).append(i)
    out: list[tuple[SentLean, list[int]]] = []
    for sent in kept:
        taken: list[tuple[tuple[Any, ...], int]] = []
        for row in sent.rows:
            left = free.get(tuple(row))
            if not left:
                break
            taken.append((tuple(row), left.pop(0)))
        else:
            out.append((sent, [i for _, i in taken]))
            continue
        for back, i in taken:  # (not all there: given back)
            free[back].insert(0, i)
    used = {i for _, idx in out for i in idx}
    return out, [i for i in range(len(rows)) if i not in used]


Reply = CallResult | Exception | None


async def send_part(front: AsyncFrontier, kept: SentPart | None, part: CallBatch,
                    monitor: bytes, closing: bool,
                    encode: Callable[[CallBatch], None] | None = None) -> tuple[Reply, Reply]:
    """A partition's *part* of a call (with the monitoring payload *monitor*) through its
    client *front*, after its part *kept* as sent, if any, sent again as it was: (the reply
    or the error of *kept*, of *part*; None: not sent).  *part* is not sent when *kept*
    fails again, nor when empty.  *closing* (the final call): the leases *kept* gets are
    released with *part*, not reported.  *kept* refused for a stale filter generation (it
    did not run) goes again at once, same op id, its unencoded links encoded by *encode*
    (frontier/partdupes.py encode_part).

    Raises:
        CrawlStateLostError: the partition's marker is gone.
    """
    old: Reply = None
    if kept is not None:
        try:
            try:
                old = await front.call(kept.batch, kept.monitor, not unencoded(kept.batch),
                                       kept.op_id)
            except StaleDupeCache:
                if encode is None:
                    raise
                encode(kept.batch)
                old = await front.call(kept.batch, kept.monitor, True, kept.op_id)
        except CrawlStateLostError:
            raise
        except Exception as exc:
            return exc, None
        if closing and old.leased:
            part = replace(part, releases=part.releases
                           + [(e.entry_id, e.token) for e in old.leased])
            old.leased = []
    if part.is_empty() and not monitor:
        return old, None
    try:
        # (links left out unencoded, frontier/partdupes.py: a stale cache fails, StaleDupeCache)
        return old, await front.call(part, monitor, not unencoded(part))
    except CrawlStateLostError:
        raise
    except Exception as exc:
        return old, exc
