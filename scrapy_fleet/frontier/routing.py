"""How a partitioned crawl's worker names and splits its work (``FLEET_PARTITIONS`` > 1,
docs/partitions.md): entry ids that name their partition, a partition's parameters, and the
route of one pump batch over the partitions and the merge of their replies (used by
:class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier`); no IO."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from scrapy_fleet.frontier.lean import LeanResult
from scrapy_fleet.frontier.protocol import (
    CallBatch,
    CallResult,
    ControlState,
    FrontierParams,
    LeasedEntry,
)
from scrapy_fleet.frontier.records import Push
from scrapy_fleet.keys.crawl import STAGE_HOST
from scrapy_fleet.keys.partition import partition_of

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


def lease_partition(ref: str) -> int:
    """The partition of a lease by its entry id: *p* for ``"<p>:<id>"`` (:func:`entry_ref`,
    a partitioned crawl), 0 for any other id (one partition)."""
    p, sep, _ = ref.partition(ID_SEP)
    return int(p) if sep and p.isdigit() else 0


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
    FLEET_HOST_QUEUE_MAX stays exact (a host is in one partition); FLEET_BUDGET_PAGES
    becomes the partition's chunk of it (frontier/budgetchunks.py)."""
    if parts == 1:
        return params
    if params.budget_pages:
        params = replace(params, budget_pages=0, budget_chunked=True)
    if not params.queue_max:
        return params
    return replace(params, queue_max=-(-params.queue_max // parts))


@dataclass
class Route:
    """Where the pump's batch went: per partition its own batch; per push of the batch,
    (partition, index in that partition's pushes, foreign)."""

    per: dict[int, CallBatch] = field(default_factory=lambda: defaultdict(CallBatch))
    foreign: dict[int, list[Push]] = field(default_factory=lambda: defaultdict(list))
    pushes: list[tuple[int, int, bool]] = field(default_factory=list)
    #: per acknowledgement of the batch: (partition, 0-based index in its batch's acks)
    acks: list[tuple[int, int]] = field(default_factory=list)
    #: per partition: index in its foreign pushes -> the 1-based group of the pump's batch
    foreign_group: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))


def route(batch: CallBatch, parts: int, home: int, skip: set[int] | None = None) -> Route:
    """Split the pump's *batch* over *parts* partitions (*home*: the worker's, which the
    heartbeat and unstorable records go to); the acknowledgements of the groups in *skip*
    (1-based) are left out with their links (pushes marked ``(-1, -1, False)``)."""
    skip = skip or set()
    r = Route()
    for name in ("releases", "dead", "extends", "downloaded"):
        for item in getattr(batch, name):
            p, entry_id = split_ref(item[0])
            getattr(r.per[p], name).append((entry_id, *item[1:]))
    for g, ack in enumerate(batch.acks, 1):
        p, entry_id = split_ref(ack.entry)
        if g in skip:
            r.acks.append((p, -1))
            continue
        r.per[p].acks.append(ack.at(entry_id))
        r.acks.append((p, len(r.per[p].acks) - 1))
    for push in batch.pushes:
        host, group = push.host, push.group
        q = partition_of(host, parts)
        if group == 0:
            r.pushes.append((q, len(r.per[q].pushes), False))
            r.per[q].pushes.append(push)
            continue
        if group in skip:
            r.pushes.append((-1, -1, False))
            continue
        p, k = r.acks[group - 1]
        if p == q or type(push.payload) is not bytes:  # (a known duplicate: its page's)
            r.pushes.append((p, len(r.per[p].pushes), False))
            r.per[p].pushes.append(push.in_group(k + 1))
        else:
            r.pushes.append((q, len(r.foreign[q]), True))
            # a stored response names its page's entry: one per entry (docs/stages.md)
            r.foreign[q].append(push.lean(stored_source(batch.acks[group - 1].entry)
                                          if host == STAGE_HOST else ()))
            r.foreign_group[q].append(group)
    r.per[home].beat = batch.beat
    r.per[home].unstorable = list(batch.unstorable)
    return r


def concat(a: CallBatch, b: CallBatch) -> CallBatch:
    """*a* then *b* as one batch of the pump's format (b's groups renumbered after a's)."""
    n = len(a.acks)
    pushes = list(a.pushes) + [
        p.in_group(p.group + n) if p.group else p for p in b.pushes]
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
        if not push.group:
            due.add(partition_of(push.host, parts))
    for p, b in r.per.items():
        if (b.releases or b.dead or b.unstorable or len(b.acks) >= HOLD_ACKS
                or len(b.pushes) >= links or now - since.get(p, now) >= age
                or any(ack.defer for ack in b.acks)):
            due.add(p)
    return due


def extend_waiting(full: CallBatch, blocked: set[int], r: Route) -> None:
    """With the pump's heartbeat: extend the leases of the pages of *blocked* (waiting
    for a buffer of foreign links, or for a partition that cannot be reached), each in
    its own partition.  The pump no longer holds them, so without this a page waiting
    longer than FLEET_LEASE_TIMEOUT would be leased and fetched again."""
    for g in sorted(blocked):
        p, entry_id = split_ref(full.acks[g - 1].entry)
        r.per[p].extends.append((entry_id, full.acks[g - 1].token))


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
        if g in groups or split_ref(ack.entry)[0] in held:
            out.acks.append(ack)
            renumber[g] = len(out.acks)
    drop = drop or set()
    for i, push in enumerate(full.pushes):
        g = push.group
        if i in drop:
            continue
        if g and g in renumber:
            out.pushes.append(push.in_group(renumber[g]))
        elif not g and partition_of(push.host, parts) in held:
            out.pushes.append(push)
    for name in ("releases", "dead", "extends", "downloaded"):
        getattr(out, name).extend(x for x in getattr(full, name)
                                  if split_ref(x[0])[0] in held)
    if home in held:
        out.unstorable = list(full.unstorable)
    return out


#: the counts of a CallResult that a partition's two replies of one call add up
_COUNTS = ("pushed", "duplicates", "acked", "released", "reclaimed", "dead_lettered", "parked",
           "deferred", "resumed", "cached")


def join_results(resent: CallResult, then: CallResult | None) -> CallResult:
    """One partition's reply to a call that sent its part failed without a reply again
    (*resent*) and then its new part (*then*, None: none went): the leases, lost leases and
    counts of both; the rest (state after the call, per-push flags) the new part's, or no
    flags when only the old part went (its pushes are not the call's)."""
    if then is None:
        return replace(resent, push_flags=[], refused=[], seen=[])
    return replace(then, leased=resent.leased + then.leased, lost=resent.lost + then.lost,
                   bloom_full=resent.bloom_full or then.bloom_full,
                   prev_lost=resent.prev_lost or then.prev_lost,
                   **{name: getattr(resent, name) + getattr(then, name) for name in _COUNTS})


def merge_results(r: Route, by_part: dict[int, CallResult], lean: dict[int, LeanResult],
                  skipped: set[int], home: int) -> CallResult:
    """The reply to the pump's batch routed as *r*: the partitions' replies *by_part* and
    the lean pushes' *lean* (per destination) merged, entry ids ``"<p>:<id>"``; the pushes
    bound for a partition of *skipped* (failed, or held) flagged 0 (sent again later)."""
    results = list(by_part.values())
    flags, refused, seen = [], [], []
    # (each reply's index lists as sets once, not once per push)
    lean_seen = {q: set(x.seen) for q, x in lean.items()}
    part_refused = {q: set(x.refused) for q, x in by_part.items()}
    part_seen = {q: set(x.seen) for q, x in by_part.items()}
    for i, (q, j, foreign) in enumerate(r.pushes):
        if q < 0 or (not foreign and q in skipped) or (foreign and q not in lean):
            flags.append(0)  # held: sent again with the next call
        elif foreign:
            res_l = lean[q]
            flags.append(res_l.flags[j] if j < len(res_l.flags) else 0)
            if j in lean_seen[q]:
                seen.append(i)
        else:
            res = by_part[q]
            flags.append(res.push_flags[j] if j < len(res.push_flags) else 0)
            if j in part_refused[q]:
                refused.append(i)
            if j in part_seen[q]:
                seen.append(i)
    leased = [LeasedEntry(entry_ref(p, e.entry_id), e.token, e.payload, e.expiries)
              for p, res in by_part.items() for e in res.leased]
    lost = [entry_ref(p, x) for p, res in by_part.items() for x in res.lost]
    holds: dict[str, float] = {}
    for res in results:
        holds.update(res.holds)
    ready = [res.next_ready for res in results if res.next_ready is not None]
    idles = [res.idle_ms for res in results]
    s = lambda name: sum(getattr(res, name) for res in results)  # noqa: E731
    return CallResult(
        leased=leased, lost=lost, push_flags=flags, refused=refused,
        pushed=s("pushed") + sum(x.pushed for x in lean.values()),
        duplicates=s("duplicates") + sum(x.duplicates for x in lean.values()),
        acked=s("acked"), released=s("released"), reclaimed=s("reclaimed"),
        dead_lettered=s("dead_lettered"), parked=s("parked"), deferred=s("deferred"),
        resumed=s("resumed"), queued=s("queued"), inflight=s("inflight"),
        deferred_now=s("deferred_now"), size=s("size"),
        idle_ms=-1 if not idles or min(idles) < 0 else min(idles),
        now_ms=max((res.now_ms for res in results), default=0),
        bloom_full=any(res.bloom_full for res in results) or any(x.full for x in lean.values()),
        holds=holds,
        response_queue=(s_pair(results, 0), s_pair(results, 1)),
        next_ready=min(ready) if ready else None,
        marker=by_part[home].marker if home in by_part else "",
        seen=seen, bloom_gen=None,
        cached=s("cached") + sum(x.cached for x in lean.values()),
        prev_lost=any(res.prev_lost for res in results),
        control=merge_control(results))


def merge_control(results: list[CallResult]) -> ControlState | None:
    """The crawl control the partitions' replies report (each partition holds all of it:
    commands/control.py writes to every one), merged (:meth:`ControlState.merge`)."""
    merged: ControlState | None = None
    for res in results:
        if res.control is not None:
            merged = res.control.merge(merged)
    return merged


def foreign_dests(keep: CallBatch, parts: int) -> set[int]:
    """The partitions (of *parts*) *keep* (pump format) holds links for that are not their
    page's: the buffers of foreign links."""
    dests = set()
    for push in keep.pushes:
        g = push.group
        if g and type(push.payload) is bytes:  # (a known duplicate goes with its page's part)
            q = partition_of(push.host, parts)
            if q != split_ref(keep.acks[g - 1].entry)[0]:
                dests.add(q)
    return dests
