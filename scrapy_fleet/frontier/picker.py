"""Which partitions a worker of a partitioned crawl leases from (issue 21, docs/partitions.md).

IO-free: :class:`PartitionPicker` keeps the worker's view of each partition, from the
replies of its own calls (every frontier call's reply carries its partition's queued count,
and, when it leased fewer than asked, when its next host may be fetched), and splits a lease
request (the pump's ``take``) over the partitions that have work:

* the **home** partition first (fairness across workers: each worker prefers its own), and
  all of the request while the home handed out all it was asked last time, but, once each
  2 P lease requests, one lease for a partition not seen for 2 P lease requests (so a
  partition that is no worker's home is never starved by homes that always have work), one
  the worker holds acknowledgements for first (they go with it);
* once the home came back short, the request is split over the home (when it may have work)
  and the other partitions that may: those with queued entries and no host waiting for a
  time or a free slot, and those this very call frees a slot in (a download notice or a
  release goes to them, even one the caller would hold for that partition's next call: the
  lease request rides on that call and takes the held part with it; an acknowledgement
  frees no slot, a lease holds its host's slot until its download is over), each up to its
  queued count, most queued first; then, with what is left, one lease each
  for the partitions never called yet (a discovery, all at once, concurrently) and for
  those not seen for 2 P lease requests: all of them when the work known anywhere is less
  than the request (a worker looking for work), else one, once each 2 P lease requests,
  as with a home that has work.  The sum is never more than asked, so a worker never holds
  more than it would on P = 1;
* when the only work known is at its hosts' cap or waiting for a turn, and this call frees
  no slot there (it only acknowledges, say), no partition is asked at all (``plan`` returns
  nothing: a *skipped* lease request): the empty home asked instead answered nothing to
  every such call, and the worker polled while the notices that would free a slot waited;
  a lease request with nothing known anywhere asks the home, as a poll;
* a partition found empty, or with all its hosts waiting, is asked again once the worker
  made 2 P lease requests since it was last seen (a count, not a time: a partition that
  stays empty costs at most one empty lease request per 2 P of the worker's; an idle
  worker polls every FLEET_POLL_INTERVAL, so it sees such a partition again within 2 P
  polls, and at once when the idle check's probe shows it holds work), when this call
  pushes requests into it, or, for one whose hosts are at their cap, when a download
  notice of this worker frees one of its slots;
* when the call leased fewer than asked and a partition still holds due work, the pump is
  told to call again at once (``next_ready`` 0), never to sleep a poll interval.

A partition this call pushes requests into may hand them out in the same call (the script
pushes before it leases): it is asked too.

The per-host politeness (rate, concurrency, robots.txt, holds) lives in each host's
partition, so taking from several at once keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a partition not seen for this many lease requests (times P) is asked again: one that
#: stays empty costs at most one lease request per STALE_ROUNDS * P of the worker's
STALE_ROUNDS = 2


@dataclass
class PartitionView:
    """What this worker knows of one partition, from its last reply."""

    #: queued entries as last seen (None: never called)
    queued: int | None = None
    #: the worker's lease-request count when it was last seen
    seen_call: int = 0
    #: its last lease request got fewer than asked
    short: bool = False
    #: monotonic time before which its next host may not be fetched (a GCRA turn, a hold);
    #: 0: none known
    ready_at: float = 0.0
    #: its last lease request got fewer than asked with no host waiting for a time: its hosts
    #: are at their concurrency cap (a download notice frees a slot)
    capped: bool = False


class PartitionPicker:
    """The lease requests of one worker over *parts* partitions, preferring *home*."""

    def __init__(self, parts: int, home: int) -> None:
        self.parts = parts
        self.home = home
        self.views = [PartitionView() for _ in range(parts)]
        self.calls = 0  #: lease requests (pump calls with a take) so far
        self._cursor = 0  #: rotates the order of the other partitions (none starves)
        #: the lease request that last asked a stale partition in a call of its own
        self._probed = 0
        #: per partition: this worker's frontier calls (counted by the caller), lease
        #: requests, those that got nothing, leases got
        self.part_calls = [0] * parts
        self.part_takes = [0] * parts
        self.part_empty = [0] * parts
        self.part_leased = [0] * parts
        #: lease requests (pump calls with a take) that got nothing from any partition
        self.empty_calls = 0
        #: lease requests not sent to any partition: the work known was all capped or waiting
        self.skipped = 0
        self._skipped = False  #: the last plan sent no lease request (skipped)
        #: the lease calls that got nothing, by why (the reply): the partition had nothing
        #: queued, its hosts with queued work were all at their cap, or waiting for a turn
        self.empty_no_work = 0
        self.empty_capped = 0
        self.empty_waiting = 0

    def counts(self) -> dict[str, int | list[int]]:
        """Totals and per-partition lists (indexed by partition) of :attr:`part_calls` and
        the lease requests :meth:`note` filed; ``empty_calls``: the worker's lease requests
        (each maybe split over several partitions) that got nothing at all."""
        return {"empty_calls": self.empty_calls, "skipped_lease_requests": self.skipped,
                "calls": sum(self.part_calls),
                "lease_calls": sum(self.part_takes),
                "empty_lease_calls": sum(self.part_empty),
                "empty_lease_calls_no_work": self.empty_no_work,
                "empty_lease_calls_capped": self.empty_capped,
                "empty_lease_calls_waiting": self.empty_waiting,
                "home": self.home,
                "calls_by_partition": list(self.part_calls),
                "lease_calls_by_partition": list(self.part_takes),
                "empty_lease_calls_by_partition": list(self.part_empty),
                "leased_by_partition": list(self.part_leased)}

    def _stale(self, v: PartitionView) -> bool:
        return self.calls - v.seen_call >= STALE_ROUNDS * self.parts

    def plan(self, want: int, now: float, freed: set[int],
             fed: set[int] | None = None, waiting: set[int] | None = None) -> dict[int, int]:
        """Split a lease request of *want* entries: partition -> how many (sum <= *want*,
        each >= 1; empty: no lease request, :attr:`skipped`).  *freed*: the partitions this
        call frees a slot in (its download notices or releases go there, in a part sent or
        held); *fed*: those it pushes requests into (the script pushes before it leases);
        *waiting*: those whose part of the call would be held (partitions.py), preferred for
        the lease of a stale partition; a held part that pushes into a partition whose hosts
        are at their cap or waiting does not make it *fed* (its own hosts' links, mostly: it
        waits for a freed slot with its part)."""
        fed = fed or set()
        held = waiting or set()
        self._skipped = False
        if want <= 0:
            return {}
        self.calls += 1
        home = self.views[self.home]
        if not (home.short or home.capped) or home.queued is None:
            # never starve a partition no worker calls home: one lease of the request for
            # a partition not seen for 2 P lease requests, once each 2 P lease requests at
            # most (each costs a frontier call, and the acknowledgement of what it leases
            # another, or a ride on one): the one this worker holds acknowledgements or
            # download notices for (*waiting*: they go with it), else the one not seen longest
            stale = [p for p in range(self.parts) if p != self.home and home.queued is not None
                     and self._stale(self.views[p])]
            if want < 2 or not stale or self.calls - self._probed < STALE_ROUNDS * self.parts:
                return {self.home: want}
            p = min(stale, key=lambda q: (q not in held, self.views[q].seen_call))
            self.views[p].seen_call = self.calls  # (asked now: not stale again for 2 P)
            self._probed = self.calls
            return {self.home: want - 1, p: 1}
        others = [(self.home + 1 + (self._cursor + i) % (self.parts - 1)) % self.parts
                  for i in range(self.parts - 1)]
        self._cursor = (self._cursor + 1) % max(1, self.parts - 1)
        order = [self.home, *others]

        def work(p: int) -> int:  # queued entries known (0: never seen, or stale)
            v = self.views[p]
            return 0 if v.queued is None or self._stale(v) else max(0, v.queued)

        def ready(p: int) -> bool:  # known work it may hand out now
            v = self.views[p]
            free = not v.capped and v.ready_at <= now
            if p in fed and (p not in held or free):
                return True
            return work(p) > 0 and (p in freed or free)

        # the home first, then the partitions known to have work (most queued first)
        known = ([self.home] if ready(self.home) else []) + sorted(
            (p for p in others if ready(p)), key=lambda p: -work(p))
        unknown = [p for p in order if self.views[p].queued is None]
        stale = [p for p in order if p not in known and p not in unknown
                 and self._stale(self.views[p])]
        probe: list[int] = []
        if stale and sum(work(p) for p in order) >= want:
            # work enough known (some of it maybe waiting for a slot or a turn): one lease
            # of a request for a partition not seen for 2 P lease requests, once each 2 P
            # lease requests at most, as with a home that has work (all of them at once:
            # P - 1 empty lease calls each 2 P requests), the one this worker holds a part
            # for first (it goes with it), else the one not seen longest
            if (not known or want >= 2) and self.calls - self._probed >= STALE_ROUNDS * self.parts:
                probe = [min(stale, key=lambda q: (q not in held, self.views[q].seen_call))]
                self.views[probe[0]].seen_call = self.calls
                self._probed = self.calls
            stale = probe
        targets = known + unknown + stale
        if not targets and any(work(p) for p in order):
            # the work known is all at its hosts' cap or waiting for a turn, and this call
            # frees no slot there: no lease request at all (the download notices freeing a
            # slot ask it in their call; a turn makes the pump call then: next_ready);
            # asking the empty home instead cost an empty lease call per pump call
            self._skipped = True
            self.skipped += 1
            return {}
        if not targets:
            return {self.home: want}  # nothing known anywhere: the home, as a poll
        # the partitions with known work first, as much as they hold (but the probe's lease);
        # then one lease each for those to discover or see again, with what is left
        share: dict[int, int] = {}
        left = want - len(probe)
        for p in known:
            if left <= 0:
                break
            share[p] = min(left, max(1, work(p)))
            left -= share[p]
        left += len(probe)
        for p in unknown + stale:
            if left <= 0:
                break
            share[p] = 1
            left -= 1
        if left > 0:  # (counts of this call's pushes unknown) the first takes the rest
            share[targets[0]] += left
        return share

    def note(self, p: int, asked: int, leased: int, queued: int,
             next_ready: float | None, now: float, freed: int = 0) -> None:
        """File the reply of partition *p* (*asked*: its lease request, 0: none;
        *leased*: what it got; *queued*: its queued count after the call; *next_ready*:
        seconds until its next host may be fetched, when it leased fewer than asked;
        *freed*: the slots the call freed there, its download notices and releases).

        A partition at its cap that hands out all it is asked, and at least the slots
        this call freed, is taken to be at its cap still (it handed out the slots freed):
        asked again with the next slot freed, not by the next call that frees none (which
        got nothing); a slot freed by a call that asked it for nothing makes it due."""
        v = self.views[p]
        v.queued = queued
        if not asked:
            v.capped = v.capped and not freed  # (a slot freed there, none taken)
            return
        self.part_takes[p] += 1
        self.part_leased[p] += leased
        self.part_empty[p] += leased == 0
        if leased == 0:
            if queued <= 0:
                self.empty_no_work += 1
            elif next_ready is None:
                self.empty_capped += 1
            else:
                self.empty_waiting += 1
        v.seen_call = self.calls
        v.short = leased < asked
        v.ready_at = now + next_ready if v.short and next_ready is not None else 0.0
        v.capped = queued > 0 and ((next_ready is None and v.short)
                                   or (v.capped and not v.short and 0 < freed <= leased))

    def note_probe(self, p: int, queued: int) -> None:
        """Partition *p* holds *queued* entries (lua/partition_probe.lua's answer)."""
        self.views[p].queued = queued

    def after_call(self, want: int, leased: int, next_ready: float | None,
                   now: float) -> float | None:
        """The ``next_ready`` of a call that asked for *want* leases and got *leased*
        (*next_ready*: the partitions' own, the least): when it got fewer, the pump calls
        again as soon as a partition known to have work may hand it out (at once when one
        may now), not only at its next poll."""
        if not want or leased >= want:
            return next_ready
        self.empty_calls += leased == 0 and not self._skipped
        ready = self.next_ready(now)
        if ready is None:
            return next_ready
        return ready if next_ready is None else min(ready, next_ready)

    def next_ready(self, now: float) -> float | None:
        """Seconds until a partition may hand out a lease (0: one may now, or one was never
        asked: a worker that starts on an empty home discovers the others at once), from
        what this worker knows; None: none known to have work."""
        waits = []
        for p, v in enumerate(self.views):
            if v.queued is None:
                return 0.0
            if self._stale(v):
                continue  # (seen again at the next poll)
            if v.queued > 0 and not v.capped:
                waits.append(max(0.0, v.ready_at - now))
            if p == self.home and not (v.short or v.capped) and v.queued > 0:
                waits.append(0.0)
        return min(waits) if waits else None
