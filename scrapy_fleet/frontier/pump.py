"""The pump: a worker's frontier calls, one at a time (each names the previous one's op id,
so a retried call is replayed, not run twice: docs/architecture.md).

A component that :class:`~scrapy_fleet.frontier.scheduler.FleetScheduler` (the Scrapy side)
holds.  It owns the worker's :class:`~scrapy_fleet.frontier.book.LeaseBook` (the buffers and
leases, no I/O; ``pump.book``), sends what the book buffered in each call and files the
reply back into it.  Its interface, :class:`FrontierPump`:

* ``start(frontier, stage)``: start the loop over a connected frontier client, a
  :class:`~scrapy_fleet.frontier.port.WorkerFrontier` (``frontier``: the client, settable
  for a pump driven by hand);
* ``close(reason)``: stop the loop, make the final call(s), leave the worker list;
* ``call(final)``: one frontier call now; ``receive(result)``: file a call's reply;
* ``wait_time()``, ``poked``: when the loop calls next;
* ``book``, ``monitor`` (the heartbeat: monitoring/heartbeat.py), ``lost`` (the leases
  reported lost, counted and warned of: frontier/lostleases.py), ``stage``;
* ``stalls`` (the liveness thread and the stalls, frontier/liveness.py),
  ``held_partitions()``.

Nothing else reaches its private attributes (tests/test_layers.py).  Of its frontier client
it uses only the :class:`~scrapy_fleet.frontier.port.WorkerFrontier` interface: ``call`` and
``last_op``, ``dupes`` (the book's DupeCache), ``unreplicated``/``wait_replicas``, ``buffer``
(what the client keeps itself between calls, None at P = 1: a partitioned crawl's links for
other partitions), and ``keys``/``client`` once, to leave the worker list at close.

When it calls: when poked (something buffered, the prefetch half empty; also right after a
call that could not carry every finished page), after waiting FLEET_FLUSH_INTERVAL for more
of a burst, when a host's turn comes (``next_ready``), every
FLEET_POLL_INTERVAL while the prefetch is short, and every FLEET_HEARTBEAT_INTERVAL
(``FLEET_LEASE_TIMEOUT / 3`` at most: lease extensions and the heartbeat), and when the
client's own buffer is due (``flush_in``), even with nothing else to send.  Redis
unreachable: back-off from 0.1 s doubling to 10 s, then that call again (frontier/sent.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from typing import TYPE_CHECKING

import redis

from scrapy_fleet import engine_hooks, outage
from scrapy_fleet.errors import CrawlStateLostError, RedisUnavailableError
from scrapy_fleet.frontier import budgets, control
from scrapy_fleet.frontier.book import LeaseBook
from scrapy_fleet.frontier.dupecache import StaleDupeCache
from scrapy_fleet.frontier.liveness import StallGuard, leave
from scrapy_fleet.frontier.lostleases import LostLeases
from scrapy_fleet.frontier.protocol import CallBatch, CallResult
from scrapy_fleet.frontier.records import links
from scrapy_fleet.frontier.replies import ReplyFiler
from scrapy_fleet.frontier.routing import lease_partition
from scrapy_fleet.frontier.sent import SentCall, entry_ids
from scrapy_fleet.frontier.wake import wait_set
from scrapy_fleet.monitoring.heartbeat import WorkerMonitor
from scrapy_fleet.redis_client import is_oom

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.frontier.port import WorkerFrontier
    from scrapy_fleet.stages.roles import StageRole

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # one logger for the scheduler

#: links per frontier call (an acknowledgement and its links are never split: a page with more
#: links goes alone).  100 links the worker does not know take ~1.7 ms of Redis (all new;
#: bench_push.py --batches, 2026-12-01): under the 2 ms bound of issue 12
PUSH_CHUNK = 100

#: stored responses a parse worker (FLEET_ROLE = "parse") holds leased at most
PARSE_HELD = 2


class FrontierPump:
    """The frontier calls of one worker (see the module docstring for its interface).
    Stats: ``fleet/frontier/*``, ``fleet/redis/*``, ``fleet/backpressure/*``,
    ``fleet/dupefilter/*`` (docs/stats.md)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        #: the worker's buffers and leases, which each call carries and files the reply into
        self.book = LeaseBook(crawler, config)
        self.book.poke = self._poke
        self.book.held_parts = self.held_partitions
        self._frontier: WorkerFrontier | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._unreplicated = 0  # calls seen not acknowledged by the replicas (WAIT)
        self.oom = outage.OutOfMemory()  #: Redis refusing calls with OOM: logged as a spell
        self._last_extend = 0.0
        self._last_call = 0.0  #: time.monotonic() of the last call sent (control.CONTROL_POLL)
        self._budget_closing = False  # the crawl's budget is spent: closing (issue 34)
        #: the leases reported lost: counted and warned of (those of a call that failed
        #: without a reply: lost to the outage, not to a stall)
        self.lost = LostLeases(self.book.inc, config.lease_timeout, lambda: self.book.spider,
                               config.monitoring.worker_dead_after)
        #: files each reply's counts, lost leases and new leases into the book
        self.replies = ReplyFiler(self.book, self.lost, config.request_classes)
        #: that call, sent again as it was (same op id) before any new batch: one that ran
        #: gets its cached reply (its leases, its acknowledgements confirmed)
        self._unanswered: SentCall | None = None
        self._state_lost = False  # Redis lost the crawl's state: write nothing more there
        #: stages (FLEET_ROLE): the download hook, and the response queue as last seen
        self.stage: StageRole | None = None
        #: time.monotonic() when the next host may be fetched (from the last frontier reply)
        self._next_ready_at: float | None = None
        #: the worker's sign of life from a thread, and its stalls (frontier/liveness.py)
        self.stalls = StallGuard(config.monitoring.worker_dead_after)
        #: heartbeat and fleet-wide counter deltas, sent with each frontier call
        self.monitor = WorkerMonitor(self.stats, config, time.time(), socket.gethostname(),
                                     os.getpid())
        concurrency = crawler.settings.getint("CONCURRENT_REQUESTS")
        #: leases this worker holds at most: its downloader's concurrency and a quarter more
        self._max_held = concurrency + max(1, concurrency // 4)
        if config.stages.role == "parse":
            # parsing is processor-bound and one callback at a time: a parse worker holds
            # few stored responses, so one that dies leaves few to parse again
            self._max_held = PARSE_HELD

    @property
    def frontier(self) -> WorkerFrontier | None:
        """The frontier client the calls go through (None before ``start``)."""
        return self._frontier

    @frontier.setter
    def frontier(self, frontier: WorkerFrontier | None) -> None:
        self._frontier = frontier
        self.book.dupes = frontier.dupes if frontier is not None else None

    def start(self, frontier: WorkerFrontier, stage: StageRole | None = None) -> None:
        """Start the pump's loop, a task on the running asyncio loop, over *frontier* (a
        connected client); *stage*: the worker's stage hook (FLEET_ROLE), which may stop
        leasing and is told the response queue at each call."""
        self.frontier = frontier
        self.stage = stage
        self.stalls.start_beat(self.config.redis_url, self.config.worker_id,
                               frontier.keys.all_partitions(self.config.partitions),
                               self.config.redis_timeout)
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._pump())
        self._wake.set()

    async def close(self, reason: str) -> None:
        """Stop the loop, then the final call(s): acknowledge what is done, push what is
        buffered, release every other lease; leave the worker list and close the frontier
        client.  Redis unreachable or the crawl's state lost: logged, not raised."""
        self.book.closing = True
        if self._task is not None and self._wake is not None:
            self._wake.set()
            try:
                await self._task
            except Exception:
                logger.exception("Fleet pump failed")
        if self.frontier is not None:
            await self._final_flush(reason)
            self.stalls.stop_beat(self.book.inc)
            if not self._state_lost:
                await self._leave()
            await self.frontier.close()
        self.book.flush_counts()

    def held_partitions(self) -> set[int]:
        """The partitions whose leased requests may not be taken from the prefetch nor sent
        now (no I/O): those this worker may have been dead to after a stall
        (frontier/liveness.py StallGuard; one partition: 0).  When a hold begins, the next
        call extends every lease held; its reply drops the lost ones from the prefetch and
        marks those given to the downloader lost, ends the hold, and the engine is woken
        (``fleet/frontier/revalidated`` counts the stalls so seen)."""
        stalls, book = self.stalls, self.book
        if stalls.quiet():
            return set()
        leased = {lease_partition(lease.entry_id) for _, lease in book.prefetch}
        leased.update(lease_partition(lease.entry_id)
                      for _, lease in book.inflight.values() if not lease.lost)
        leased.update(lease_partition(lease.entry_id) for lease in book.starting)
        held = stalls.check(leased)
        if stalls.revalidation_due():
            self._last_extend = 0.0  # (the next call is a heartbeat: every lease extended)
            book.inc("fleet/frontier/revalidated")
            self._poke()
        return held

    @property
    def poked(self) -> bool:
        """A call is due at once (something was buffered or taken since the last one)."""
        return self._wake is not None and self._wake.is_set()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    @property
    def _heartbeat(self) -> float:
        """Seconds between two calls at most: lease extensions and the worker's heartbeat."""
        return min(self.config.lease_timeout / 3, self.config.monitoring.heartbeat_interval)

    def wait_time(self) -> float:
        """Seconds the pump's loop waits, unless poked, before its next call (no I/O)."""
        book = self.book
        until_extend = max(0.0, self._last_extend + self._heartbeat - time.monotonic())
        if book.drain_started is not None and (book.inflight or book.prefetch):
            left = book.drain_started + self.config.drain_timeout - time.monotonic()
            until_extend = min(until_extend, max(0.05, left))
        buffer = self.frontier.buffer if self.frontier is not None else None
        due = buffer.flush_in() if buffer is not None else None
        if due is not None:  # work the client keeps (a partitioned crawl's)
            until_extend = min(until_extend, max(0.005, due))
        if book.prefetch:  # requests that may start: a pause is seen within CONTROL_POLL
            until_extend = min(until_extend, max(
                0.005, self._last_call + control.CONTROL_POLL - time.monotonic()))
        if len(book.prefetch) < self.config.prefetch and not book.fleet_done:
            wait = min(self.config.poll_interval, until_extend)
            if self._next_ready_at is not None:  # a host's turn comes before the next poll
                wait = min(wait, max(0.005, self._next_ready_at - time.monotonic()))
            return wait
        return until_extend

    async def _pump(self) -> None:
        book = self.book
        assert self._wake is not None
        backoff = 0.1
        while not book.closing:
            await wait_set(self._wake, self.wait_time())
            if book.closing:
                return
            self._wake.clear()
            if self._check_drain():
                await self._drain_exit()
                return
            if self.config.flush_interval and (book.outbox or book.done or book.downloaded):
                await asyncio.sleep(self.config.flush_interval)  # coalesce a burst
            sent_at = time.monotonic()
            try:
                await self.call(final=False)
                backoff = 0.1
                if book.done or (book.outbox and time.monotonic() >= book.outbox_hold_until):
                    # a call carries PUSH_CHUNK links at most: the rest goes at once, not at
                    # the next poll (a backlog of finished pages drained 8 per 0.5 s)
                    self._poke()
                outages = outage.tracker(self.config.redis_url).outages
                if outages and self.stats is not None:
                    self.stats.set_value("fleet/redis/outages", outages)
            except CrawlStateLostError as exc:
                self._lose_state(exc)
                return
            except RedisUnavailableError as exc:
                book.inc("fleet/redis/errors")
                outage.tracker(self.config.redis_url).failed(exc, backoff, sent_at)
                logger.debug("Fleet frontier unreachable, retrying in %.1f s: %s", backoff, exc,
                             extra={"spider": book.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:
                book.inc("fleet/redis/errors")
                logger.exception("Fleet frontier call failed", extra={"spider": book.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _leave(self) -> None:
        """Leave the worker list (frontier/liveness.py ``leave``)."""
        assert self.frontier is not None
        await leave(self.frontier.client, self.frontier.keys, self.config.worker_id,
                    self.config.partitions)

    def _lose_state(self, exc: CrawlStateLostError) -> None:
        """Redis no longer holds the crawl (restarted without its data, purged): stop with a
        clear error and a non-zero exit status instead of finishing early as if the crawl
        were done; nothing more is written to Redis (it would seed a partial crawl)."""
        book = self.book
        self._state_lost = True
        book.inc("fleet/frontier/state_lost")
        logger.error("Fleet worker stops: %s. The pages this crawl had queued are not in Redis "
                     "any more: restore Redis's data (appendonly) or push the crawl again; "
                     "%d request(s) this worker holds are dropped", exc,
                     len(book.prefetch) + len(book.inflight) + len(book.done),
                     extra={"spider": book.spider})
        engine_hooks.fail_exit_status(self.crawler, "fleet_state_lost")
        engine_hooks.close_spider(self.crawler, "fleet_state_lost")

    def _check_drain(self) -> bool:
        """Note when the engine begins to close (SIGTERM: Scrapy's graceful shutdown); once
        FLEET_DRAIN_TIMEOUT has passed since with requests still in progress, release every
        lease and end the process with status 0 (as a pod's grace period would, but with
        nothing left leased).  Returns True when the pump must stop."""
        book = self.book
        if book.drain_started is None:
            if engine_hooks.engine_closing(self.crawler):
                book.drain_started = time.monotonic()
                log = logger.info if (book.prefetch or book.inflight) else logger.debug
                log("Fleet worker draining: its %d prefetched lease(s) go back to the frontier "
                    "now, the %d request(s) in progress have %.0f s (FLEET_DRAIN_TIMEOUT) to "
                    "finish", len(book.prefetch), len(book.inflight),
                    self.config.drain_timeout, extra={"spider": book.spider})
                self._poke()
            return False
        if time.monotonic() - book.drain_started < self.config.drain_timeout:
            return False
        # only requests still in progress hold the exit up; a slow close of the pipelines
        # (nothing leased any more) is left to finish
        return bool(book.inflight or book.prefetch)

    async def _drain_exit(self) -> None:
        book = self.book
        logger.warning("Fleet worker still busy %.0f s after the shutdown began "
                       "(FLEET_DRAIN_TIMEOUT): releasing its %d lease(s) and exiting",
                       self.config.drain_timeout, len(book.held_leases()),
                       extra={"spider": book.spider})
        book.closing = True
        try:
            await self._final_flush("drain timeout")
            self.stalls.stop_beat(self.book.inc)
            await self._leave()
        finally:
            logging.shutdown()
            os._exit(0)

    def _build_batch(self, final: bool) -> tuple[CallBatch, int, int, int]:
        """The next call: finished requests with their links (all of a request's links in
        one call), requests without a parent, dead letters, heartbeats, a lease request."""
        book = self.book
        batch = CallBatch(control_gen=book.control.gen, poll=bool(book.prefetch) and (
            time.monotonic() - self._last_call >= control.CONTROL_POLL))
        n_done = 0
        for lease in book.done:
            book.materialize(lease.children, lease)
            if n_done and len(batch.pushes) + len(lease.children) > PUSH_CHUNK:
                break
            n_done += 1
            batch.acks.append(lease.ack())
            batch.pushes += links(lease.children, n_done)
        n_out = 0
        if final or time.monotonic() >= book.outbox_hold_until:
            book.materialize(book.outbox)
            n_out = max(0, min(len(book.outbox), PUSH_CHUNK - len(batch.pushes)))
            batch.pushes += links(book.outbox[:n_out], 0)
        batch.unstorable = book.unstorable[:PUSH_CHUNK]
        dead = list(book.dead)
        batch.dead = [(lease.entry_id, lease.token, reason) for lease, reason in dead]
        batch.downloaded = [lease.download_report() for lease in book.downloaded]
        now = time.monotonic()
        if final:
            batch.releases = [(lease.entry_id, lease.token) for lease in book.held_leases()]
        else:
            # draining: what was leased and not started goes back at once (and what only
            # waited for a proxy exit: give_back)
            batch.releases = [(lease.entry_id, lease.token) for lease in book.given_back] + (
                [(lease.entry_id, lease.token) for _, lease in book.prefetch]
                if book.drain_started is not None else [])
            if now - self._last_extend >= self._heartbeat:
                # the heartbeat is due (with or without leases to extend: an idle worker
                # must not see it due again at once, or it would poll in a tight loop)
                self._last_extend = now
                batch.beat = True
                releasing = {entry_id for entry_id, _ in batch.releases}
                batch.extends = [(lease.entry_id, lease.token) for lease in book.held_leases()
                                 if lease.entry_id not in releasing]
            # a lease holds its host's concurrency slot until its download is over
            # (FLEET_HOST_CONCURRENCY counts them), so a worker holds little more than it can
            # download at once; a pushed request in the start hook (book.starting) is one of
            # them: it joins the prefetch once the hook is done (left out, a fetch worker took
            # as many again meanwhile and passed FLEET_RESPONSE_QUEUE_MAX by that much)
            held = len(book.prefetch) + len(book.inflight) + len(book.starting)
            want = min(self.config.prefetch - len(book.prefetch) - len(book.starting),
                       self._max_held - held)
            if (want > 0 and not book.fleet_done and book.withheld is None
                    and not (self.stage is not None and self.stage.queue_full)
                    and book.drain_started is None):
                batch.take = want
        return batch, n_out, n_done, len(dead)  # (every download notice goes with it)

    async def call(self, final: bool = False, again: bool = True) -> CallResult | None:
        """One frontier call now with what is buffered (what the pump's loop does when it
        wakes); *final*: the closing call (releases every lease held, leases nothing).  Returns
        the reply, or None when there was nothing to send or Redis was out of memory (the
        buffers are kept then).

        Raises:
            CrawlStateLostError: Redis no longer holds the crawl.
            RedisUnavailableError: Redis cannot be reached (the buffers are kept).
        """
        book = self.book
        assert self.frontier is not None
        sent, self._unanswered = self._unanswered, None
        fresh = sent is None
        if sent is None:
            book.flush_counts()
            batch, n_out, n_done, n_dead = self._build_batch(final)
            buffer = self.frontier.buffer
            if batch.is_empty() and (buffer is None or buffer.flush_in() != 0) and not (
                    final and self.monitor.unsent()):  # (0: the client's buffer is due;
                return None  # the closing call carries the counter deltas not confirmed)
            # leases held once this call is done (what it releases is gone then), with the
            # pages whose acknowledgement waits in a partitioned client (still leased)
            waiting = buffer.acks_held if buffer is not None else 0
            held = max(0, len(book.held_leases()) - len(batch.releases)) + waiting
            state = "fetching" if waiting and book.state == "idle" else book.state
            monitor = self.monitor.payload("closing" if final else state, held,
                                           engine_hooks.active_downloads(self.crawler))
            sent = SentCall(batch, n_out, n_done, n_dead, final, monitor,
                            book.outbox[:n_out], book.done[:n_done])
            self._last_call = time.monotonic()
        batch, n_out, n_done, n_dead = sent.batch, sent.n_out, sent.n_done, sent.n_dead
        outbox, done = sent.outbox, sent.done
        started = time.monotonic()
        try:
            # links buffered as known duplicates have no payload yet: after a refusal the
            # call is built again (with the cache cleared, they are encoded then)
            result = await self.frontier.call(batch, sent.monitor, resend=False,
                                              **({"op_id": sent.op_id} if sent.op_id else {}))
        except StaleDupeCache:
            if not again:
                raise
            book.inc("fleet/dupefilter/cache_cleared")
            return await self.call(final, again=False)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # Redis refused the call before its first write: nothing changed; keep it all
            book.inc("fleet/backpressure/oom")
            self.oom.refused(extra={"spider": book.spider})  # (logged once, then each 30 s)
            await asyncio.sleep(self.config.poll_interval * 4)
            return None
        except Exception as exc:
            if isinstance(exc, RedisUnavailableError):
                self.lost.unanswered(entry_ids(batch))
            # no reply: it may have run; sent again as it was (a client naming its op id)
            sent.op_id = self.frontier.last_op
            if sent.op_id is not None:  # (at once after the back-off: its leases wait)
                self._unanswered = sent
                self._poke()
            raise
        self.oom.recovered(extra={"spider": book.spider})
        if self.frontier.unreplicated > self._unreplicated:
            book.inc("fleet/redis/unreplicated", self.frontier.unreplicated - self._unreplicated)
            if not self._unreplicated:
                logger.warning("Start requests pushed but not acknowledged by "
                               "FLEET_REDIS_WAIT_REPLICAS=%d replica(s) in time: a failover "
                               "now would lose them (counted in fleet/redis/unreplicated)",
                               self.frontier.wait_replicas, extra={"spider": book.spider})
            self._unreplicated = self.frontier.unreplicated
        # the call succeeded: drop what it carried from the local buffers (a partitioned
        # crawl: unless the part carrying the counter deltas failed; they go again)
        if result.monitor_confirmed:
            self.monitor.confirmed()
        if batch.releases and not final:
            released = {entry_id for entry_id, _ in batch.releases}
            book.prefetch = deque((r, lease) for r, lease in book.prefetch
                                  if lease.entry_id not in released)
            book.given_back = [g for g in book.given_back if g.entry_id not in released]
        del book.done[:n_done]
        del book.dead[:n_dead]
        del book.unstorable[:len(batch.unstorable)]
        del book.downloaded[:len(batch.downloaded)]
        if result.refused:
            refused = set(result.refused)
            base = len(batch.pushes) - n_out
            kept = [o for i, o in enumerate(outbox) if base + i in refused]
            book.outbox[:n_out] = kept
            book.outbox_hold_until = time.monotonic() + self.config.poll_interval
            book.inc("fleet/backpressure/refused", len(kept))
        else:
            del book.outbox[:n_out]
        if book.start_pending:
            refused_ids = {id(o) for o in book.outbox}
            for o in outbox:
                if id(o) not in refused_ids:
                    book.start_pending.pop(id(o), None)
        children = [c for lease in done for c in lease.children]
        self.replies.account(result, children + outbox, sent_tokens(batch))
        self.lost.answered(entry_ids(batch))
        if not sent.final:
            self.receive(result)
        if self.stalls.confirmed(started, fresh and batch.beat, result.reached):
            engine_hooks.wake_engine(self.crawler)
        if final and not sent.final:  # (that was a call sent again: now the final one)
            return await self.call(final=True)
        return result

    def receive(self, result: CallResult) -> None:
        """Apply the reply *result* of a (non-final) frontier call: the hosts' holds, the next
        host's turn, the response queue, the new leases (decoded into the prefetch, or to the
        start hook ``on_pushed``; an entry that cannot be decoded goes to the dead letters),
        and whether the fleet is idle; wakes the engine when there is work for it."""
        book = self.book
        now = time.monotonic()
        # the fleet's holds, and this worker's own not yet in them (its 429 noted while this
        # call was on its way: book.note_hold): the later end of each
        holds = {h: until for h, until in book.holds.items() if until > now}
        for h, left in result.holds.items():
            holds[h] = max(holds.get(h, 0.0), now + left)
        book.holds = holds
        if result.control is not None and book.control.apply(result.control):
            self._poke()  # (the next call reports the new generation: `pause` waits for it)
        self._next_ready_at = None if result.next_ready is None else now + result.next_ready
        if self.stage is not None:
            self.stage.note_response_queue(result.response_queue)
        got = self.replies.lease(result.leased)
        if got:
            book.inc("fleet/frontier/leased", got)
        idle_timeout = self.config.idle_timeout
        idle = (idle_timeout is not None and result.idle_ms >= idle_timeout * 1000
                and not (book.prefetch or book.inflight or book.done or book.outbox
                         or book.starting or book.start_active))
        if idle and not book.fleet_done:
            logger.info("Fleet idle for %.1f s (FLEET_IDLE_TIMEOUT=%s): closing",
                        result.idle_ms / 1000, idle_timeout, extra={"spider": book.spider})
        # not sticky: work pushed since (start requests read after this worker's first call,
        # another worker's pushes) makes it lease again; the engine closes only once the
        # start requests are done and nothing is pending
        book.fleet_done = idle
        if result.budget_spent and not (book.prefetch or book.inflight or book.done
                                        or book.outbox or book.starting):
            self._budget_closing = budgets.close_for_budget(
                self.crawler, book, result.budget_spent, self._budget_closing)
        if got or book.fleet_done:
            engine_hooks.wake_engine(self.crawler)

    async def _final_flush(self, reason: str) -> None:
        """Acknowledge what is done, push what is buffered, release every other lease."""
        book = self.book
        assert self.frontier is not None
        if self._state_lost:
            return
        if self.frontier.buffer is not None:  # what the client keeps goes with the final call
            self.frontier.buffer.flush_now()
        try:
            for _ in range(1000):
                before = (len(book.outbox), len(book.done))
                result = await self.call(final=True)
                if result is not None:
                    book.prefetch.clear()
                    book.inflight.clear()
                if result is None or not (book.outbox or book.done):
                    break
                if (len(book.outbox), len(book.done)) == before:
                    break  # the frontier refuses them: it is full
            if book.outbox:
                book.inc("fleet/backpressure/lost_at_close", len(book.outbox))
                logger.warning("Fleet worker closing (%s) with %d request(s) the full frontier "
                               "refused (start requests or links from errbacks); they are "
                               "dropped", reason, len(book.outbox),
                               extra={"spider": book.spider})
        except CrawlStateLostError as exc:
            self._lose_state(exc)
        except RedisUnavailableError as exc:
            logger.error("Fleet worker closing (%s) without reaching Redis: %d requests not "
                         "pushed, %d not acknowledged; their parents' leases will expire and "
                         "be fetched again. %s", reason, len(book.outbox), len(book.done),
                         exc, extra={"spider": book.spider})


def sent_tokens(batch: CallBatch) -> dict[str, set[int]]:
    """Entry id -> the fencing tokens *batch* carried for it (its acknowledgements, lease
    extensions, download reports, give-backs and dead letters): what a reply's ``lost``
    refers to."""
    tokens: dict[str, set[int]] = {}
    for row in (*batch.acks, *batch.extends, *batch.downloaded, *batch.releases, *batch.dead):
        tokens.setdefault(str(row[0]), set()).add(int(row[1]))
    return tokens

