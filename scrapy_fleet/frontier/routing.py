"""How a partitioned crawl's worker names and splits its work (``FLEET_PARTITIONS`` > 1,
docs/partitions.md): entry ids that name their partition, a partition's parameters, and the
route of one pump batch over the partitions (used by
:class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier`); no IO."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams
from scrapy_fleet.keys import partition_of

#: separator of a partition's index and an entry id in the ids a PartitionedFrontier hands out
ID_SEP = ":"


def entry_ref(p: int, entry_id: str) -> str:
    """The id of entry *entry_id* of partition *p* as the worker (and the commands) see it."""
    return f"{p}{ID_SEP}{entry_id}"


def split_ref(ref: str) -> tuple[int, str]:
    """``(partition, entry id)`` of an id made by :func:`entry_ref`.

    Raises:
        ValueError: *ref* is not of that form.
    """
    p, sep, entry_id = ref.partition(ID_SEP)
    if not sep or not p.isdigit():
        raise ValueError(f"not a partitioned entry id: {ref!r}")
    return int(p), entry_id


#: Redis's bitmap offsets (BITFIELD) are below this: an entry number past it has no bit
STORED_FROM_BITS = 2**32


def stored_source(ref: str) -> tuple[int, int] | tuple[()]:
    """``(partition, entry number)`` of the leased page *ref* (an id of :func:`entry_ref`)
    whose stored response goes to another partition, sent with it: that partition queues one
    stored response per entry (lua/push_lean.lua, ``stored_from``); ``()`` for an id whose
    number (its digits after a one-letter prefix: ``r`` a revisit...) is past
    :data:`STORED_FROM_BITS`, or that has none."""
    p, entry_id = split_ref(ref)
    number = entry_id[1:] if entry_id[:1] and not entry_id[:1].isdigit() else entry_id
    if not number.isdigit() or int(number) >= STORED_FROM_BITS:
        return ()
    return p, int(number)


def partition_params(params: FrontierParams, parts: int) -> FrontierParams:
    """*params* of one partition of *parts*: FLEET_QUEUE_MAX split evenly (rounded up);
    FLEET_HOST_QUEUE_MAX stays exact (a host is in one partition)."""
    if not params.queue_max or parts == 1:
        return params
    return replace(params, queue_max=-(-params.queue_max // parts))



@dataclass
class Route:
    """Where the pump's batch went: per partition its own batch; per push of the batch,
    (partition, index in that partition's pushes, foreign)."""

    per: dict[int, CallBatch] = field(default_factory=lambda: defaultdict(CallBatch))
    foreign: dict[int, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    pushes: list[tuple[int, int, bool]] = field(default_factory=list)
    #: per acknowledgement of the batch: (partition, 0-based index in its batch's acks)
    acks: list[tuple[int, int]] = field(default_factory=list)
    #: per partition: index in its foreign pushes -> the 1-based group of the pump's batch
    foreign_group: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))


def concat(a: CallBatch, b: CallBatch) -> CallBatch:
    """*a* then *b* as one batch of the pump's format (b's groups renumbered after a's)."""
    n = len(a.acks)
    pushes = list(a.pushes) + [
        (p[0], p[1], p[2], int(p[3]) + n if int(p[3]) else 0, *p[4:]) if len(p) > 3 else p
        for p in b.pushes]
    return CallBatch(acks=a.acks + b.acks, releases=a.releases + b.releases,
                     dead=a.dead + b.dead, extends=a.extends + b.extends, pushes=pushes,
                     take=b.take, downloaded=a.downloaded + b.downloaded, beat=b.beat,
                     unstorable=a.unstorable + b.unstorable)


def s_pair(results: list[CallResult], i: int) -> int:
    """The sum over *results* of their stored-responses figure *i* (0: count, 1: bytes)."""
    return sum(res.response_queue[i] for res in results)


#: acknowledgements held for a partition this worker does not call (its part of the pump's
#: calls: docs/partitions.md) that make that part due at once
HOLD_ACKS = 32


def group_of(push: tuple[Any, ...]) -> int:
    """The 1-based acknowledgement group of a push of the pump's format (0: no parent)."""
    return int(push[3]) if len(push) > 3 else 0


def host_of(push: tuple[Any, ...]) -> str:
    return push[4] if len(push) > 4 else ""  # type: ignore[no-any-return]


def hold_due(r: Route, full: CallBatch, parts: int, always: set[int],
             since: dict[int, float], now: float, age: float, links: int) -> set[int]:
    """The partitions whose part of *r* goes in this call: *always* (the home, the
    partitions owed a monitoring payload or whose last call failed), those with a push
    without a parent, a release, a dead letter, an unstorable record or a deferred page
    (what the pump or a refusal expects an answer to), and those whose part has waited *age*
    seconds since *since* or holds :data:`HOLD_ACKS` acknowledgements or *links* links.  The
    others' parts (acknowledgements with their own links, download notices) may wait for
    the partition's next call."""
    due = set(always)
    for push in full.pushes:
        if not group_of(push):
            due.add(partition_of(host_of(push), parts))
    for p, b in r.per.items():
        if (b.releases or b.dead or b.unstorable or len(b.acks) >= HOLD_ACKS
                or len(b.pushes) >= links or now - since.get(p, now) >= age
                or any(len(ack) > 4 and ack[4] for ack in b.acks)):
            due.add(p)
    return due


def extend_waiting(full: CallBatch, blocked: set[int], r: Route) -> None:
    """With the pump's heartbeat: extend the leases of the pages of *blocked* (waiting
    for a buffer of foreign links, or for a partition that cannot be reached), each in
    its own partition.  The pump no longer holds them, so without this a page waiting
    longer than FLEET_LEASE_TIMEOUT would be leased and fetched again."""
    for g in sorted(blocked):
        p, entry_id = split_ref(full.acks[g - 1][0])
        r.per[p].extends.append((entry_id, full.acks[g - 1][1]))


def subset(full: CallBatch, groups: set[int], held: set[int], parts: int, home: int,
           drop: set[int] | None = None) -> CallBatch:
    """The part of *full* (pump format) to send again: the acknowledgements of *groups*
    and those of partitions *held* with all their links (but the pushes of index in *drop*),
    and everything else bound for *held* (of *parts* partitions; *home* the worker's)."""
    out = CallBatch()
    if not groups and not held:
        return out
    renumber: dict[int, int] = {}
    for g, ack in enumerate(full.acks, 1):
        if g in groups or split_ref(ack[0])[0] in held:
            out.acks.append(ack)
            renumber[g] = len(out.acks)
    drop = drop or set()
    for i, push in enumerate(full.pushes):
        g = group_of(push)
        if i in drop:
            continue
        if g and g in renumber:
            out.pushes.append((push[0], push[1], push[2], renumber[g], *push[4:]))
        elif not g and partition_of(host_of(push), parts) in held:
            out.pushes.append(push)
    for name in ("releases", "dead", "extends", "downloaded"):
        getattr(out, name).extend(x for x in getattr(full, name)
                                  if split_ref(x[0])[0] in held)
    if home in held:
        out.unstorable = list(full.unstorable)
    return out
