"""A crawl's frontier partitioned by host (``FLEET_PARTITIONS`` = P > 1, docs/partitions.md).

Each partition is a complete frontier of today's layout under its own hash tag
(:meth:`scrapy_fleet.keys.crawl.CrawlKeys.partition`): its queue, Bloom filter, leases, politeness
state, counters, failed and dead records.  A host's URLs all live in the partition
:func:`scrapy_fleet.keys.partition_of` names, so every guarantee that is atomic inside one
frontier call (dedup, fencing, per-host rate and concurrency, robots.txt, holds, bounds) stays
atomic inside the host's partition.  On a Redis Cluster the partitions spread over the masters
by slot; on one server they are only hash tags.

:class:`PartitionedFrontier` has the surface of :class:`~scrapy_fleet.frontier.client.
AsyncFrontier` the pump uses (``call``, ``connect``, ``close``, ``keys``, ``client``,
``dupes``), so the worker's pump runs unchanged on it.  One call of the pump becomes:

1. the links of a finished page for another partition than the page's (*foreign* links) are
   pushed there first, one lean call per destination (lua/push_lean.lua), concurrently,
   buffered per destination across calls (FLEET_PARTITION_FLUSH, :data:`FLUSH_LINKS`, and at
   close, :meth:`flush_now`); the pages whose links wait, wait with them here, unacknowledged;
2. then one frontier call per partition the batch touches, concurrently (entry ids
   ``"<p>:<id>"``; local links with their page's acknowledgement; the lease request split by
   :class:`~scrapy_fleet.frontier.picker.PartitionPicker`, the home first).  A part that is
   only acknowledgements, download notices and extends, for a partition this call does not
   otherwise reach, is **held** for that partition's next call
   (:func:`~scrapy_fleet.frontier.routing.hold_due`; at most :attr:`PartitionedFrontier.
   hold_age`, HOLD_ACKS acknowledgements, :data:`FLUSH_LINKS` links, a heartbeat, the close).

A page is thus acknowledged only after every foreign push carrying its links has returned
(**push before ack**), so unfinished work is always visible in some partition: queued, leased,
deferred or parked.  A page one of whose foreign links was refused (that partition is full) is
not acknowledged but deferred on its own partition (FLEET_BACKPRESSURE_DELAY), to be fetched
again: nothing is lost and no partition grows past its bound.

A failure without a reply (Redis unreachable through the retries) may hide a call that ran.
A partition's part that failed so is kept as sent (frontier/sent.py ``SentPart``) and sent
again as it was, same op id, before that partition's next part (the other partitions go on
meanwhile); so is a lean push (``SentLean``), before that destination's new links.  When
no part of a call went through, one partition it did not reach is called: if it answers, the
call goes on as a partial failure; else (an outage) it raises after keeping its work here, and
the pump sends its batch again with :attr:`PartitionedFrontier.last_op` (as at P = 1).

Idle close: when the partitions a call reached all report idle for FLEET_IDLE_TIMEOUT, every
partition is probed (lua/partition_probe.lua); the fleet is idle only when each of them is
idle that long on its own clock (push before ack: no work can hide between partitions):
frontier/partview.py, with the response queue of the stage partition.

The cache of known duplicates (FLEET_DUPEFILTER_CACHE) is split over the partitions' clients
(the links of their own pages) and the lean pushes' destinations (foreign links:
:class:`~scrapy_fleet.frontier.lean.LeanDestination`), half each; a link its page's
partition knows waits unencoded, as on P = 1 (frontier/partdupes.py).  Monitoring goes
with the call to the home partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import zlib
from typing import TYPE_CHECKING, Any

import redis

from scrapy_fleet import lua, redis_client
from scrapy_fleet.errors import CrawlStateLostError
from scrapy_fleet.frontier.budgetchunks import ChunkBudget
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.dupecache import DupeCache, StaleDupeCache
from scrapy_fleet.frontier.lean import LeanDestination, LeanResult
from scrapy_fleet.frontier.partdupes import Encoder, PartitionDupes, encode_part, materialize
from scrapy_fleet.frontier.partview import FleetIdleness, ResponseQueueView
from scrapy_fleet.frontier.picker import PartitionPicker
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams, state_lost, typed
from scrapy_fleet.frontier.records import Push
from scrapy_fleet.frontier.routing import (
    concat,
    extend_waiting,
    foreign_dests,
    hold_due,
    join_results,
    merge_results,
    partition_params,
    route,
    subset,
)
from scrapy_fleet.frontier.sent import SentLean, SentPart, match_rows, send_part
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.monitoring.heartbeat import heartbeat_only

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

#: foreign links buffered for one partition that make it due at once, and the links of one
#: lean call at most (a buffer past it goes in several): the pump's PUSH_CHUNK
FLUSH_LINKS = 100


def _lost(exc: redis.ResponseError, url: str, p: int) -> CrawlStateLostError | None:
    lost = state_lost(exc, url)
    if lost is None:
        return None
    return CrawlStateLostError(f"partition {p}: {lost}")


# -- the worker's frontier ----------------------------------------------------------------------

class PartitionedFrontier:
    """The frontier of a crawl with P > 1 partitions, for a worker (see module docstring).

    Raises:
        RedisUnavailableError: from :meth:`connect` and :meth:`call`, as AsyncFrontier.
        CrawlStateLostError: a partition's marker is gone (the message names the partition).
    """

    def __init__(self, url: str, keys: CrawlKeys, worker: str, params: FrontierParams,
                 parts: int, timeout: float = 10.0, retries: int = 3, wait_replicas: int = 0,
                 idle_timeout: float | None = None, dupe_cache: int = 0,
                 flush_age: float = 0.0, encode: Encoder | None = None,
                 stats: StatsCollector | None = None) -> None:
        self.url = url
        self.stats = stats  #: the crawl's stats, ``fleet/partitions/*`` set after each call
        self.keys = keys  #: the control keys (the crawl's own tag)
        self.parts = parts
        self.worker = worker
        #: FLEET_QUEUE_MAX is the crawl's: each partition holds its share, rounded up
        self.params = partition_params(params, parts)
        self.retries = retries
        self.wait_replicas = wait_replicas
        self.part_keys = keys.all_partitions(parts)
        #: each partition's client keeps its own cache of known duplicates (FLEET_DUPEFILTER_
        #: CACHE / 2P keys), for the links of its own pages (foreign links: lean_dests)
        #: one client for every partition (a cluster client routes each call by its keys' slot):
        #: one cluster client per partition cost each worker P slot-map and COMMAND reads at
        #: start and P connections per master
        self.client: redis.asyncio.Redis = redis_client.make_client(url, timeout, is_async=True)
        self.fronts = [AsyncFrontier(url, k, worker, self.params, timeout, retries, wait_replicas,
                                     dupe_cache=dupe_cache // (2 * parts), client=self.client)
                       for k in self.part_keys]
        #: per destination partition, the known duplicates of the lean pushes there (and
        #: their evidence, frontier/lean.py): the other half of FLEET_DUPEFILTER_CACHE
        self.lean_dests = [LeanDestination(k, dupe_cache // (2 * parts))
                           for k in self.part_keys]
        self._lean = lua.load(self.client, "push_lean.lua")
        #: FLEET_BUDGET_PAGES: each partition leases against its chunk (budgetchunks.py)
        self.chunks = (ChunkBudget(self.client, keys, self.part_keys, params.budget_pages)
                       if self.params.budget_chunked else None)
        #: whether the fleet is idle, over every partition (frontier/partview.py)
        self.idleness = FleetIdleness(self.client, url, retries, self.part_keys, idle_timeout)
        self.probe = self.idleness.probe  #: lua/partition_probe.lua on every partition
        #: the pump's view: a link its partition's cache knows, for its page's partition,
        #: is buffered unencoded (partdupes.py; *encode*: encodes it if it must be sent)
        self.encode = encode
        self.dupes = (PartitionDupes([f.dupes for f in self.fronts]) if encode is not None
                      else DupeCache(0))
        #: where the lease requests go (the home partition first: module docstring)
        self.picker = PartitionPicker(parts, partition_of(params.lease_only_host, parts)
                                      if params.lease_only_host  # a parse worker: one host
                                      else zlib.crc32(worker.encode("utf-8", "surrogatepass"))
                                      % parts)
        self.roundtrips = 0
        self.foreign_calls = 0  #: lean pushes sent
        self.lean_links = self.lean_dupes = 0  #: links the lean pushes sent, duplicates
        self.deferred_parents = 0  #: pages deferred because a foreign push was refused
        self.partition_errors = 0  #: partition calls that failed (their part was held)
        self._held: CallBatch | None = None
        #: FLEET_PARTITION_FLUSH (seconds; 0: foreign links pushed at every call)
        self.flush_age = flush_age
        #: per partition with foreign links buffered: when the oldest of them was buffered
        self._since: dict[int, float] = {}
        self._force = False  #: flush_now: every buffer is due
        #: the parts of the pump's calls held for a partition this worker does not call
        #: (acknowledgements with their own links, download notices: module docstring), sent
        #: with its next call, or once the oldest waited this long (FLEET_PARTITION_FLUSH, a
        #: quarter of the lease timeout at most; 0: never held), or at HOLD_ACKS of them
        self.hold_age = min(flush_age, self.params.lease_timeout / 4)
        #: per partition whose part is held: since when
        self._hold_since: dict[int, float] = {}
        self._retry: set[int] = set()  #: partitions whose last call failed: due at once
        #: per partition, its part of a call that failed without a reply, as sent; and per
        #: destination, the lean pushes whose reply was lost: each sent again as it was
        #: (same op id) before anything new for it (frontier/sent.py)
        self._sent: dict[int, SentPart] = {}
        self._lean_sent: dict[int, list[SentLean]] = {}
        #: when those are due (a back-off), and the calls that failed in a row
        self._resend_after: float | None = None
        self._resend_fails = 0
        #: (last_op, the pump's batch) of a call that raised with its work held here
        self._absorbed: tuple[str, CallBatch] | None = None
        self.held_parts = 0  #: partition parts held for a later call, so far
        #: the response queue (stages) as its partition last reported it, reported with
        #: every reply (frontier/partview.py)
        self.response_queue = ResponseQueueView(parts)
        #: the partition whose call carried counter deltas that failed (None: none): they go
        #: there again, unchanged, until it answers (its ``cs`` skips a batch it applied
        #: already, whose reply was lost; another partition would count it twice)
        self._deltas_part: int | None = None
        #: False after a call whose monitoring payload did not get through, or was not sent
        #: (leasing elsewhere with no heartbeat due): the pump keeps its counter deltas and
        #: sends them again (monitoring/heartbeat.py ``confirmed``)
        self.monitor_confirmed = True
        #: the partitions whose part of the last call got its reply (each a sign of this
        #: worker's life there: frontier/liveness.py StallGuard)
        self.reached: set[int] = set()

    @property
    def home(self) -> int:
        """The home partition: lease requests go there first, the heartbeat with it."""
        return self.picker.home

    @home.setter
    def home(self, p: int) -> None:
        self.picker.home = p

    @property
    def unreplicated(self) -> int:
        return sum(f.unreplicated for f in self.fronts)

    @property
    def marker(self) -> str:
        return self.fronts[self.home].marker

    @property
    def buffer(self) -> PartitionedFrontier:
        """This client keeps work between calls (:meth:`flush_in`, :meth:`flush_now`,
        :attr:`acks_held`: frontier/port.py FrontierBuffer)."""
        return self

    def flush_now(self) -> None:
        """Make every buffer of foreign links due (the worker is closing): the next call
        pushes them all, and the pages waiting for them are acknowledged."""
        self._force = True

    def flush_in(self) -> float | None:
        """Seconds until a buffer of foreign links is due (0: now); None when nothing is
        buffered.  The pump calls then even with nothing of its own to send."""
        if not self._since and not self._hold_since and self._resend_after is None:
            return None
        if self._force:
            return 0.0
        now = time.monotonic()
        due = [t + self.hold_age - now for t in self._hold_since.values()]
        if self._resend_after is not None:
            due.append(self._resend_after - now)
        if self._since and self.flush_age > 0:
            due.append(min(self._since.values()) + self.flush_age - now)
        # (flush_age 0: nothing waits: only what a partition refused, sent with the next call)
        return max(0.0, min(due)) if due else None

    def _due(self, q: int, links: int, now: float) -> bool:
        return (self._force or self.flush_age <= 0 or links >= FLUSH_LINKS or q in self._lean_sent
                or now - self._since.get(q, now) >= self.flush_age)

    async def connect(self, patience: float = 30.0) -> None:
        """Reach every partition (and check its layout), then the control keys."""
        for front in self.fronts:
            await front.connect(patience)

    async def close(self) -> None:
        for front in self.fronts:
            await front.close()
        await self.client.aclose()

    # -- routing

    async def _push_foreign(self, q: int, pushes: list[Push]) -> LeanResult:
        """Push *pushes* into partition *q*, :data:`FLUSH_LINKS` per lean call, one after
        the other; the reply of them all (indexes into *pushes*).  The lean pushes kept for
        *q* (their reply lost) whose rows are all in *pushes* go first, as they were (same op
        id: one that ran replies its cached reply); if one fails, those sent (but one that
        failed with a reply) are kept to go so again."""
        kept, rest = match_rows(self._lean_sent.pop(q, []), pushes)
        chunks: list[tuple[SentLean | None, list[int]]] = [*kept, *(
            (None, rest[k:k + FLUSH_LINKS]) for k in range(0, len(rest), FLUSH_LINKS))]
        made: list[SentLean] = []
        out = LeanResult([0] * len(pushes), [], [], 0, 0, False, "")
        for sent, idx in chunks:
            if sent is None:  # (made when it goes: it names the previous call's op id)
                sent = self.lean_dests[q].prepare([pushes[i] for i in idx], self.params,
                                                  self.fronts[q].marker)
            made.append(sent)
            try:
                res = await self._push_chunk(q, sent)
            except CrawlStateLostError:
                raise
            except Exception as exc:
                self._lean_sent[q] = made[:len(made) - isinstance(exc, redis.ResponseError)]
                raise
            out.add(res, idx)
        return out

    async def _push_chunk(self, q: int, sent: SentLean) -> LeanResult:
        async def run(keys: list[str], arg: bytes) -> bytes:
            async def attempt() -> bytes:
                self.roundtrips += 1
                return await self._lean(keys=keys, args=[arg])  # type: ignore[no-any-return]

            return await redis_client.call_retrying_async(  # type: ignore[no-any-return]
                attempt, self.url, self.retries, self.client)

        try:
            result = await self.lean_dests[q].send(run, sent, self.params,
                                                    self.fronts[q].marker)
        except redis.ResponseError as exc:
            lost = _lost(exc, self.url, q)
            if lost is not None:
                raise lost from None
            raise
        self.foreign_calls += 1
        self.lean_links += len(sent.rows)
        self.lean_dupes += result.duplicates
        if not self.fronts[q].marker:
            self.fronts[q].calls.marker = result.marker
        return result

    async def call(self, batch: CallBatch, monitor: bytes = b"", resend: bool = True,
                   op_id: str | None = None) -> CallResult:
        """:meth:`run`, then the reply's ``reached`` and ``monitor_confirmed`` and the stats
        ``fleet/partitions/*`` (docs/stats.md).  *resend* is not used: a part refused for a
        stale cache of duplicates is handled here, per partition (frontier/sent.py
        ``send_part``)."""
        result = await self.run(batch, monitor, op_id)
        result.reached = frozenset(self.reached)
        result.monitor_confirmed = self.monitor_confirmed
        if self.stats is not None:
            for name, value in self.partition_counts().items():
                self.stats.set_value(f"fleet/partitions/{name}", value)
        return result

    async def run(self, batch: CallBatch, monitor: bytes = b"",
                  op_id: str | None = None) -> CallResult:
        """Run the pump's *batch* over the partitions (module docstring): foreign links
        first, then one frontier call per partition touched, concurrently.  The reply's
        entry ids are ``"<p>:<id>"``; its counts are sums, its ``idle_ms`` the fleet's
        (every partition probed) once the partitions reached look idle long enough.

        A partition that cannot be reached does not stop the others: what was bound for it
        (and the pages whose links for it could not be pushed) is held here and sent again
        with the next call (:attr:`held`); its pushes are reported as not new.  A part (or a
        lean push) that failed without a reply may have run: it is sent again as it was,
        same op id, before that partition's next part (frontier/sent.py).

        *op_id*: :attr:`last_op` after a call that raised, with the same *batch*: that
        call's work is held here already (nothing new is taken from *batch*).

        Raises:
            RedisUnavailableError: no partition of the call could be reached (the pump
                sends the batch again, with :attr:`last_op` when the call may have run).
            CrawlStateLostError: naming the partition.
        """
        pump_batch = batch = typed(batch)  # (a caller outside the worker may give tuples)
        replay = op_id is not None and self._absorbed == (op_id, batch)
        if replay:
            batch = CallBatch()  # (the failed call's work is held here already)
        self._absorbed = None
        held, self._held = self._held, None
        if held is not None and self.encode is not None:
            materialize(held, [f.dupes for f in self.fronts], self.encode)
        full = concat(held, batch) if held is not None else batch
        off = len(full.pushes) - len(batch.pushes)  # the pump's pushes start here
        first = route(full, self.parts, self.home)
        for q in set(self._lean_sent) - set(first.foreign):
            del self._lean_sent[q]  # (its links are not here: nothing to send again)
        lean: dict[int, LeanResult] = {}
        blocked: set[int] = set()  # groups whose links for some partition are not in yet
        lean_errors: list[Exception] = []
        now = time.monotonic()
        waiting = {q for q, rows in first.foreign.items() if not self._due(q, len(rows), now)}
        for q in waiting:  # buffered: their pages wait here, unacknowledged
            blocked.update(first.foreign_group[q])
        if len(waiting) < len(first.foreign):
            qs = sorted(set(first.foreign) - waiting)
            done = await asyncio.gather(*(self._push_foreign(q, first.foreign[q])
                                          for q in qs), return_exceptions=True)
            for q, res in zip(qs, done, strict=True):
                if isinstance(res, CrawlStateLostError):
                    raise res
                if isinstance(res, BaseException):
                    if not isinstance(res, Exception):
                        raise res
                    blocked.update(first.foreign_group[q])
                    lean_errors.append(res)
                    self._note_failure(q, res)
                else:
                    lean[q] = res
        r = route(full, self.parts, self.home, blocked) if blocked else first
        if batch.beat:
            extend_waiting(full, blocked, r)
        # push before ack: a page one of whose foreign links was refused is deferred
        refused_groups = {first.foreign_group[q][i] for q, res in lean.items()
                          for i in res.refused} - blocked
        for group in refused_groups:
            p, k = r.acks[group - 1]
            r.per[p].acks[k] = r.per[p].acks[k].deferred()
            self.deferred_parents += 1
        # the parts for partitions this call need not reach wait for their next call
        payloads = self._payloads(monitor)
        due = set(r.per)
        if self.hold_age > 0 and not (self._force or batch.beat):
            due = hold_due(r, full, self.parts, {self.home, *payloads, *self._retry,
                                                 *self._sent},
                           self._hold_since, now, self.hold_age, FLUSH_LINKS)
        # the lease request, split over the partitions that have work (picker.py): those
        # this call frees a slot in (a download notice, a release: a lease holds its host's
        # slot until its download is over, so an acknowledgement frees none), even with a
        # part that would be held (the lease request takes it along, as P = 1 leases with
        # the notice; held, a capped partition's notices waited FLEET_PARTITION_FLUSH while
        # its worker asked its empty home: 0.26 empty lease calls per page, one host, P = 8),
        # and those it pushes into (for a held part, only when not known to be capped)
        slots = {p: len(b.downloaded) + len(b.releases) for p, b in r.per.items()}
        parted = {p for p, b in r.per.items() if not b.is_empty()}
        takes = self.picker.plan(batch.take, now, {p for p, n in slots.items() if n},
                                 {p for p, b in r.per.items() if b.pushes}, parted - due)
        hold = parted - due - set(takes)
        for p in hold:
            del r.per[p]
        for p, n in takes.items():
            r.per[p].take = n
        calls = [(p, b) for p, b in sorted(r.per.items()) if not b.is_empty()]
        # monitoring: the home's payload (or the partition owed the deltas), not sent alone
        # while leasing elsewhere with no heartbeat due (it waits; the pump keeps it)
        if payloads and not (set(payloads) & set(dict(calls)) or batch.beat or not batch.take):
            payloads = {}
        for p in payloads:
            if p not in dict(calls):
                calls.append((p, CallBatch(beat=True)))
        stage_part = self.response_queue.part
        if batch.beat and self.response_queue.last is not None and stage_part not in dict(calls):
            calls.append((stage_part, CallBatch(beat=True)))
        calls += [(p, CallBatch()) for p in sorted(set(self._sent) - set(dict(calls)))]
        for _, one in calls:  # (crawl control: each call reports the generation held)
            one.control_gen = batch.control_gen
        if self.chunks is not None:  # (a chunk of the crawl's page budget where needed)
            await self.chunks.reserve({p: b.take for p, b in calls})
        kept = dict(self._sent)  # (the parts sent again first, their refused pushes)
        encode = self.encode
        results = await asyncio.gather(*(
            send_part(self.fronts[p], kept.get(p), b, payloads.get(p, b""),
                      self._force and not replay,
                      None if encode is None else lambda part: encode_part(part, encode))
            for p, b in calls), return_exceptions=True)
        by_part: dict[int, CallResult] = {}
        resent: dict[int, CallResult] = {}
        failed: set[int] = set()  # (a part not through: held, or kept as sent)
        errors: list[Exception] = []
        for (p, b), got in zip(calls, results, strict=True):
            if isinstance(got, BaseException):
                raise got  # (CrawlStateLostError, or not an Exception)
            old, part = got
            sent_calls = (old is not None) + (part is not None)
            self.roundtrips += sent_calls
            self.picker.part_calls[p] += sent_calls
            if isinstance(old, CallResult):
                resent[p] = old
                del self._sent[p]
                self.picker.note(p, kept[p].batch.take, len(old.leased), old.queued,
                                 old.next_ready, time.monotonic(),
                                 len(kept[p].batch.downloaded) + len(kept[p].batch.releases))
            exc = old if isinstance(old, Exception) else part
            if isinstance(exc, Exception):
                failed.add(p)
                errors.append(exc)
                self._note_failure(p, exc)
                self.picker.note(p, takes.get(p, 0), 0, 0, None, time.monotonic())
                op = self.fronts[p].last_op
                if exc is part and op and not isinstance(exc, (redis.ResponseError,
                                                               StaleDupeCache)):
                    self._sent[p] = SentPart(b, payloads.get(p, b""), op)  # (it may have run)
            elif isinstance(part, CallResult):
                by_part[p] = part
                if self.chunks is not None:
                    self.chunks.note(p, part.budget_left)
                self.picker.note(p, takes.get(p, 0), len(part.leased), part.queued,
                                 part.next_ready, time.monotonic(), slots.get(p, 0))
        if errors and not (by_part or resent or lean) and any(  # (one that may have run)
                not isinstance(e, (redis.ResponseError, StaleDupeCache)) for e in errors):
            await self._reach_another(failed, by_part)
        if monitor:
            deltas_part = self.home if self._deltas_part is None else self._deltas_part
            self.monitor_confirmed = bool(payloads) and deltas_part in by_part
            if payloads:
                self._deltas_part = None if self.monitor_confirmed else deltas_part
        for p, old in resent.items():
            by_part[p] = join_results(old, by_part.get(p))
        self.reached = set(by_part)
        noreply = [e for e in errors + lean_errors  # (refused before any write: did not run)
                   if not isinstance(e, (redis.ResponseError, StaleDupeCache))]
        if errors and not by_part and not lean and not noreply:
            self._held = held  # nothing went through, nothing ran: the pump sends it again
            raise errors[0]
        # the links of a waiting page already taken by their partition are not sent again
        pushed = {i for i, (q, j, foreign) in enumerate(first.pushes)
                  if foreign and q in lean and j not in set(lean[q].refused)}
        # (a part kept as sent is not held: it goes again as it was)
        as_sent = {p for p in failed if p in self._sent and self._sent[p] is not kept.get(p)}
        keep = subset(full, blocked, (failed - as_sent) | hold, self.parts, self.home, pushed)
        for p, old in resent.items():  # (pushes without a parent it refused: pushed again)
            keep.pushes += [kept[p].batch.pushes[j] for j in old.refused]
        self._note_buffers(keep, now, set(first.foreign) - waiting)
        self._retry = failed
        # (what is kept as sent goes again after a back-off: 0.1 s doubling to 10 s)
        self._resend_fails = self._resend_fails + 1 if errors or lean_errors else 0
        self._resend_after = (now + min(10.0, 0.1 * 2 ** min(self._resend_fails - 1, 7))
                              if self._sent or self._lean_sent else None)
        self._hold_since = {p: self._hold_since.get(p, now) for p in hold}
        self.held_parts += len(hold)
        merged = merge_results(r, by_part, lean, failed | hold, self.home)
        self.response_queue.note(lean, by_part)
        merged.response_queue = self.response_queue.seen(keep)
        refused_held = [full.pushes[i] for i in merged.refused if i < off]
        merged.refused = [i - off for i in merged.refused if i >= off]
        merged.seen = [i - off for i in merged.seen if i >= off]
        merged.push_flags = merged.push_flags[off:]
        if refused_held:
            keep.pushes += refused_held
        self._held = None if keep.is_empty() else keep
        if errors and not by_part and not lean:
            # nothing went through but something may have run: this call's work is held
            # here (and kept as sent); the pump sends the batch again with last_op
            self._absorbed = (uuid.uuid4().hex, pump_batch)
            raise noreply[0]
        if self.chunks is not None and not merged.leased and await self.chunks.spent():
            merged.budget_spent = "budget_pages"  # (every partition's chunk, the home's)
        merged.next_ready = self.picker.after_call(batch.take, len(merged.leased),
                                                   merged.next_ready, time.monotonic())
        # (a probe that fails: busy; the call went through, it is not raised nor sent again)
        merged.idle_ms = await self.idleness.idle_ms(merged.idle_ms, self.waiting_work,
                                                     self.picker)
        return merged

    async def _reach_another(self, failed: set[int], by_part: dict[int, CallResult]) -> None:
        """No part of this call got through: call one partition it did not reach (the home
        first), with nothing to do.  If it answers, the others are not down with the failed
        ones (a partition's slot being moved, its master failed over): the call goes on as one
        whose failed parts are held or kept as sent, and the pump with new work; else it is an
        outage, raised (the pump sends its batch again)."""
        for p in sorted(set(range(self.parts)) - failed, key=lambda q: q != self.home)[:1]:
            try:
                by_part[p] = await self.fronts[p].call(CallBatch())
            except CrawlStateLostError:
                raise
            except Exception:  # (unreachable too: an outage, raised by the caller)
                return
            self.roundtrips += 1
            self.picker.part_calls[p] += 1

    @property
    def waiting_work(self) -> bool:
        """Work is held here, or kept to be sent again as it was."""
        return bool(self._held is not None or self._sent or self._lean_sent)

    @property
    def last_op(self) -> str | None:
        """After :meth:`call` raised with work held here that may have run: the id to send
        that batch again with (the pump's ``op_id``, frontier/pump.py); None otherwise."""
        return self._absorbed[0] if self._absorbed is not None else None

    def _payloads(self, monitor: bytes) -> dict[int, bytes]:
        """partition -> the monitoring payload (lua/monitoring.lua) its call carries: the
        home's, with the counter deltas, or, while deltas wait for the partition that failed
        to take them, the whole payload there and the heartbeat alone to the home."""
        if not monitor:
            return {}
        if self._deltas_part is None or self._deltas_part == self.home:
            return {self.home: monitor}
        return {self._deltas_part: monitor, self.home: heartbeat_only(monitor)}

    def partition_counts(self) -> dict[str, Any]:
        """This worker's counts (stats ``fleet/partitions/*``, docs/stats.md)."""
        return {**self.picker.counts(), "lean_calls": self.foreign_calls,
                "held_parts": self.held_parts, **(self.chunks.counts() if self.chunks else {})}

    @property
    def held(self) -> int:
        """Acknowledgements and pushes held for a partition that could not be reached."""
        return 0 if self._held is None else len(self._held.acks) + len(self._held.pushes)

    @property
    def acks_held(self) -> int:
        """Pages acknowledged by the pump whose acknowledgement waits here (held for its
        partition's next call, or in a part kept to be sent again): their leases are still
        in Redis, so the worker's heartbeat counts them among the leases it holds."""
        return ((0 if self._held is None else len(self._held.acks))
                + sum(len(part.batch.acks) for part in self._sent.values()))

    def _note_failure(self, p: int, exc: Exception) -> None:
        self.partition_errors += 1
        logger.debug("Fleet partition %d unreachable, its part of the call is held: %s",
                     p, exc)

    def _note_buffers(self, keep: CallBatch, now: float, tried: set[int]) -> None:
        """Start the clock of every partition *keep* holds foreign links for (again for
        those *tried* in this call: refused, or not reached); stop the others'."""
        self._since = {q: now if q in tried else self._since.get(q, now)
                       for q in foreign_dests(keep, self.parts)}
