"""How a partitioned crawl's worker names and splits its work (``FLEET_PARTITIONS`` > 1,
docs/partitions.md): entry ids that name their partition, a partition's parameters, and the
route of one pump batch over the partitions (used by
:class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier`); no IO."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams

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
