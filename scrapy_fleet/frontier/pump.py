"""The pump of :class:`~scrapy_fleet.frontier.scheduler.FleetScheduler`: the worker's local
buffers and its frontier calls, one at a time (each names the previous one's op id, so a
retried call is replayed, not run twice: docs/architecture.md).

Buffers: the prefetch (leased and decoded, not yet handed to the engine), the requests in
flight, those done (acknowledged with their links at the next call), downloads over (their
host's concurrency slot goes back), the outbox (requests without a parent in flight) and dead
letters.  A link the worker's DupeCache knows to be in the fleet's Bloom filter is buffered
as its Request, unencoded: the call leaves it out, and it is encoded only if the frontier
asks for the whole call again (:meth:`FrontierPump._materialize`).

When it calls: when poked (something buffered, the prefetch half empty; also right after a
call that could not carry every finished page), after waiting FLEET_FLUSH_INTERVAL for more
of a burst, when a host's turn comes (``next_ready``), every
FLEET_POLL_INTERVAL while the prefetch is short, and every FLEET_HEARTBEAT_INTERVAL
(``FLEET_LEASE_TIMEOUT / 3`` at most: lease extensions and the heartbeat).  Redis
unreachable: back-off from 0.1 s doubling to 10 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from scrapy_fleet import codec, engine_hooks, outage
from scrapy_fleet.browser import pagemethods
from scrapy_fleet.errors import CrawlStateLostError, RedisUnavailableError, RequestEncodeError
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.dupecache import StaleDupeCache
from scrapy_fleet.frontier.leases import Lease, Out, unstorable_record
from scrapy_fleet.frontier.protocol import CallBatch, CallResult
from scrapy_fleet.frontier.wake import wait_set
from scrapy_fleet.monitoring.heartbeat import WorkerMonitor
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.redis_client import is_oom
from scrapy_fleet.stages import records as stored_responses
from scrapy_fleet.stages.roles import STORED_META_KEY

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.stages.roles import StageRole

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # one logger for the scheduler

#: links per frontier call (an acknowledgement and its links are never split: a page with more
#: links goes alone).  100 links the worker does not know take ~1.7 ms of Redis (all new;
#: bench_push.py --batches, 2026-12-01): under the 2 ms bound of issue 12
PUSH_CHUNK = 100

#: stored responses a parse worker (FLEET_ROLE = "parse") holds leased at most
PARSE_HELD = 2
#: lua/proxies.lua's reasons to wait that mean no exit of the pool can carry a request
NO_EXIT = frozenset({"dead", "empty"})


class FrontierPump:
    """The buffers and the pump of a FleetScheduler (its base class; see module docstring).
    Stats: ``fleet/frontier/*``, ``fleet/redis/*``, ``fleet/backpressure/*``,
    ``fleet/dupefilter/*`` (docs/stats.md)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.spider: Spider | None = None
        self.frontier: AsyncFrontier | None = None
        self._prefetch: deque[tuple[Request, Lease]] = deque()
        self._inflight: dict[int, tuple[Request, Lease]] = {}
        self._done: list[Lease] = []
        self._downloaded: list[Lease] = []  # downloads over, not yet told to the frontier
        self._outbox: list[Out] = []  # requests without a parent in flight
        self._enqueued = self._dequeued = 0  # not yet in the stats (_flush_counts)
        #: id(outbox entry) -> index of a start request (codec.START_META_KEY) not yet
        #: accepted by the frontier
        self._start_pending: dict[int, int] = {}
        #: FleetSpiderMiddleware is reading start requests, or waiting to take them over:
        #: an idle frontier does not close this worker then (more may come)
        self.start_active = False
        self._outbox_hold_until = 0.0  # the frontier refused them: retry after this time
        self._by_entry: dict[str, Lease] = {}  # entry id -> lease, for requests in flight
        self._dead: list[tuple[Lease, str]] = []
        #: leases of pushed start requests in the spider middlewares' start hook (held like
        #: the prefetch), which on_pushed (the scheduler's) takes them to
        self._starting: list[Lease] = []
        self.on_pushed: Callable[[Request, Lease], None] | None = None
        #: failure records of requests without a parent that could not be encoded
        self._unstorable: list[bytes] = []
        #: id(request) -> why it waits for a proxy exit (FleetProxyMiddleware); leases given
        #: back while draining (released at the next call, never acknowledged)
        self._exit_waits: dict[int, str] = {}
        self._give_back: list[Lease] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._unreplicated = 0  # calls seen not acknowledged by the replicas (WAIT)
        self._fleet_done = False
        self._last_extend = 0.0
        self._logged_dupe = False
        self._lost_total = 0
        self._withheld: str | None = None  # why finished requests are no longer acknowledged
        self._state_lost = False  # Redis lost the crawl's state: write nothing more there
        #: host -> time.monotonic() until which it is on hold, from the last frontier call
        self.holds: dict[str, float] = {}
        #: stages (FLEET_ROLE): the download hook, and the response queue as last seen
        self.stage: StageRole | None = None
        #: time.monotonic() when the next host may be fetched (from the last frontier reply)
        self._next_ready_at: float | None = None
        #: heartbeat and fleet-wide counter deltas, sent with each frontier call
        self.monitor = WorkerMonitor(self.stats, config, time.time(), socket.gethostname(),
                                     os.getpid())
        self._drain_started: float | None = None  # monotonic time the engine began to close
        concurrency = crawler.settings.getint("CONCURRENT_REQUESTS")
        #: leases this worker holds at most: its downloader's concurrency and a quarter more
        self._max_held = concurrency + max(1, concurrency // 4)
        if config.role == "parse":
            # parsing is processor-bound and one callback at a time: a parse worker holds
            # few stored responses, so one that dies leaves few to parse again
            self._max_held = PARSE_HELD

    def _known_duplicate(self, key: bytes, request: Request) -> bool:
        """Does this worker's DupeCache know *key* to be in the fleet's Bloom filter (so the
        next frontier call leaves the request out)?  Never for a request holding a live
        browser page: it is encoded at once, to be refused and its page closed."""
        dupes = self.frontier.dupes if self.frontier is not None else None
        return (dupes is not None and dupes.gen is not None and key in dupes
                and pagemethods.PAGE_META_KEY not in request.meta)

    def _encode(self, request: Request, parent: Lease | None = None) -> bytes | None:
        """``codec.encode(request)``, or None when it cannot be encoded: logged, counted and
        recorded among the failed requests (``codec/<error class>``), with the
        acknowledgement of *parent* (the leased request whose callback yielded it) or alone."""
        try:
            return codec.encode(request, self.spider)
        except RequestEncodeError as exc:
            logger.error("%s; request recorded as failed (scrapy fleet failed)", exc,
                         extra={"spider": self.spider})
            name = type(exc.__cause__ or exc).__name__
            self._inc("fleet/codec/encode_error")
            self._inc(f"fleet/codec/encode_error/{name}")
            if pagemethods.close_page_of(request.meta):
                self._inc("fleet/browser/page_closed")  # a dropped request leaks no page
            record = unstorable_record(request, f"codec/{name}", str(exc), self.config,
                                       parent.url if parent is not None else "")
            (parent.unstorable if parent is not None else self._unstorable).append(record)
            return None

    def _materialize(self, outs: list[Out], parent: Lease | None = None) -> None:
        """Encode, in place, the requests of *outs* buffered as known duplicates that the
        DupeCache no longer holds (cleared after a failover or a purge, or the oldest keys
        forgotten): the next call sends them whole.  One that cannot be encoded is dropped
        (logged and counted as at enqueue)."""
        if not any(type(o[3]) is not bytes for o in outs):
            return
        kept: list[Out] = []
        for out in outs:
            url, key, priority, payload, _, delay_ms = out
            if isinstance(payload, bytes) or self._known_duplicate(key, payload):
                kept.append(out)
                continue
            encoded = self._encode(payload, parent)
            start_index = self._start_pending.pop(id(out), None)
            if encoded is None:
                continue
            new: Out = (url, key, priority, encoded,
                         politeness.host_key(url, self.config.host_key), delay_ms)
            if start_index is not None:
                self._start_pending[id(new)] = start_index
            kept.append(new)
        outs[:] = kept

    def _flush_counts(self) -> None:
        """Add the requests enqueued and dequeued since the last call to the stats (counted
        in plain ints per request: a stats call costs more than the rest of a duplicate)."""
        if self._enqueued:
            self._inc("scheduler/enqueued/redis", self._enqueued)
            self._inc("scheduler/enqueued", self._enqueued)
            self._enqueued = 0
        if self._dequeued:
            self._inc("scheduler/dequeued/redis", self._dequeued)
            self._inc("scheduler/dequeued", self._dequeued)
            self._dequeued = 0

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _held_leases(self) -> list[Lease]:
        held = [lease for _, lease in self._prefetch] + self._starting + self._give_back
        return held + [lease for _, lease in self._inflight.values() if not lease.lost]

    @property
    def _heartbeat(self) -> float:
        """Seconds between two calls at most: lease extensions and the worker's heartbeat."""
        return min(self.config.lease_timeout / 3, self.config.heartbeat_interval)

    def _wait_time(self) -> float:
        until_extend = max(0.0, self._last_extend + self._heartbeat - time.monotonic())
        if self._drain_started is not None and (self._inflight or self._prefetch):
            left = self._drain_started + self.config.drain_timeout - time.monotonic()
            until_extend = min(until_extend, max(0.05, left))
        if len(self._prefetch) < self.config.prefetch and not self._fleet_done:
            wait = min(self.config.poll_interval, until_extend)
            if self._next_ready_at is not None:  # a host's turn comes before the next poll
                wait = min(wait, max(0.005, self._next_ready_at - time.monotonic()))
            return wait
        return until_extend

    async def _pump(self) -> None:
        assert self._wake is not None
        backoff = 0.1
        while not self._closing:
            await wait_set(self._wake, self._wait_time())
            if self._closing:
                return
            self._wake.clear()
            if self._check_drain():
                await self._drain_exit()
                return
            if self.config.flush_interval and (self._outbox or self._done or self._downloaded):
                await asyncio.sleep(self.config.flush_interval)  # coalesce a burst
            sent_at = time.monotonic()
            try:
                await self._call_once(final=False)
                backoff = 0.1
                if self._done or (self._outbox
                                  and time.monotonic() >= self._outbox_hold_until):
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
                self._inc("fleet/redis/errors")
                outage.tracker(self.config.redis_url).failed(exc, backoff, sent_at)
                logger.debug("Fleet frontier unreachable, retrying in %.1f s: %s", backoff, exc,
                             extra={"spider": self.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
            except Exception:
                self._inc("fleet/redis/errors")
                logger.exception("Fleet frontier call failed", extra={"spider": self.spider})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _leave(self) -> None:
        """Leave the worker list and drop this worker's heartbeat and its id's claim (best
        effort: they expire by themselves, after FLEET_WORKER_FORGET_AFTER and
        FLEET_WORKER_DEAD_AFTER)."""
        assert self.frontier is not None
        keys = self.frontier.keys
        try:
            async with self.frontier.client.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.workers, self.config.worker_id)
                pipe.delete(keys.worker_info(self.config.worker_id),
                            keys.worker_claim(self.config.worker_id))
                await pipe.execute()
        except Exception:
            pass

    def _lose_state(self, exc: CrawlStateLostError) -> None:
        """Redis no longer holds the crawl (restarted without its data, purged): stop with a
        clear error and a non-zero exit status instead of finishing early as if the crawl
        were done; nothing more is written to Redis (it would seed a partial crawl)."""
        self._state_lost = True
        self._inc("fleet/frontier/state_lost")
        logger.error("Fleet worker stops: %s. The pages this crawl had queued are not in Redis "
                     "any more: restore Redis's data (appendonly) or push the crawl again; "
                     "%d request(s) this worker holds are dropped", exc,
                     len(self._prefetch) + len(self._inflight) + len(self._done),
                     extra={"spider": self.spider})
        engine_hooks.fail_exit_status(self.crawler, "fleet_state_lost")
        engine_hooks.close_spider(self.crawler, "fleet_state_lost")

    def _state(self) -> str:
        if self._closing:
            return "closing"
        if self._drain_started is not None:
            return "draining"
        if not (self._prefetch or self._inflight):
            return "idle"
        if any(why in NO_EXIT for why in self._exit_waits.values()):
            return "no_exit"  # requests wait for a proxy exit, and the pool has none live
        # a parse worker (FLEET_ROLE = "parse") holds stored responses: it fetches nothing
        return "parsing" if self.config.role == "parse" else "fetching"

    def _downloads(self) -> int:
        engine = engine_hooks.running_engine(self.crawler)
        return len(getattr(getattr(engine, "downloader", None), "active", ()) or ())

    def _check_drain(self) -> bool:
        """Note when the engine begins to close (SIGTERM: Scrapy's graceful shutdown); once
        FLEET_DRAIN_TIMEOUT has passed since with requests still in progress, release every
        lease and end the process with status 0 (as a pod's grace period would, but with
        nothing left leased).  Returns True when the pump must stop."""
        engine = engine_hooks.running_engine(self.crawler)
        slot = getattr(engine, "_slot", None)
        if self._drain_started is None:
            if slot is not None and getattr(slot, "closing", None) is not None:
                self._drain_started = time.monotonic()
                log = logger.info if (self._prefetch or self._inflight) else logger.debug
                log("Fleet worker draining: its %d prefetched lease(s) go back to the frontier "
                    "now, the %d request(s) in progress have %.0f s (FLEET_DRAIN_TIMEOUT) to "
                    "finish", len(self._prefetch), len(self._inflight),
                    self.config.drain_timeout, extra={"spider": self.spider})
                self._poke()
            return False
        if time.monotonic() - self._drain_started < self.config.drain_timeout:
            return False
        # only requests still in progress hold the exit up; a slow close of the pipelines
        # (nothing leased any more) is left to finish
        return bool(self._inflight or self._prefetch)

    async def _drain_exit(self) -> None:
        logger.warning("Fleet worker still busy %.0f s after the shutdown began "
                       "(FLEET_DRAIN_TIMEOUT): releasing its %d lease(s) and exiting",
                       self.config.drain_timeout, len(self._held_leases()),
                       extra={"spider": self.spider})
        self._closing = True
        try:
            await self._final_flush("drain timeout")
            await self._leave()
        finally:
            logging.shutdown()
            os._exit(0)

    def _build_batch(self, final: bool) -> tuple[CallBatch, int, int, int]:
        """The next call: finished requests with their links (all of a request's links in
        one call), requests without a parent, dead letters, heartbeats, a lease request."""
        batch = CallBatch()
        n_done = 0
        for lease in self._done:
            self._materialize(lease.children, lease)
            if n_done and len(batch.pushes) + len(lease.children) > PUSH_CHUNK:
                break
            n_done += 1
            batch.acks.append(lease.ack())
            batch.pushes += [(key, prio, payload, n_done, host, delay)
                             for _, key, prio, payload, host, delay in lease.children]
        n_out = 0
        if final or time.monotonic() >= self._outbox_hold_until:
            self._materialize(self._outbox)
            n_out = max(0, min(len(self._outbox), PUSH_CHUNK - len(batch.pushes)))
            batch.pushes += [(key, prio, payload, 0, host, delay)
                             for _, key, prio, payload, host, delay in self._outbox[:n_out]]
        batch.unstorable = self._unstorable[:PUSH_CHUNK]
        dead = list(self._dead)
        batch.dead = [(lease.entry_id, lease.token, reason) for lease, reason in dead]
        batch.downloaded = [(lease.entry_id, lease.token) for lease in self._downloaded]
        now = time.monotonic()
        if final:
            batch.releases = [(lease.entry_id, lease.token) for lease in self._held_leases()]
        else:
            # draining: what was leased and not started goes back at once (and what only
            # waited for a proxy exit: give_back)
            batch.releases = [(lease.entry_id, lease.token) for lease in self._give_back] + (
                [(lease.entry_id, lease.token) for _, lease in self._prefetch]
                if self._drain_started is not None else [])
            if now - self._last_extend >= self._heartbeat:
                # the heartbeat is due (with or without leases to extend: an idle worker
                # must not see it due again at once, or it would poll in a tight loop)
                self._last_extend = now
                batch.beat = True
                releasing = {entry_id for entry_id, _ in batch.releases}
                batch.extends = [(lease.entry_id, lease.token) for lease in self._held_leases()
                                 if lease.entry_id not in releasing]
            # a lease holds its host's concurrency slot until its download is over
            # (FLEET_HOST_CONCURRENCY counts them), so a worker holds little more than it can
            # download at once
            held = len(self._prefetch) + len(self._inflight)
            want = min(self.config.prefetch - len(self._prefetch), self._max_held - held)
            if (want > 0 and not self._fleet_done and self._withheld is None
                    and not (self.stage is not None and self.stage.queue_full)
                    and self._drain_started is None):
                batch.take = want
        return batch, n_out, n_done, len(dead)  # (every download notice goes with it)

    async def _call_once(self, final: bool, again: bool = True) -> CallResult | None:
        assert self.frontier is not None
        self._flush_counts()
        batch, n_out, n_done, n_dead = self._build_batch(final)
        if batch.is_empty():
            return None
        outbox = self._outbox[:n_out]
        done = self._done[:n_done]
        # leases held once this call is done (what it releases is gone then)
        held = max(0, len(self._held_leases()) - len(batch.releases))
        monitor = self.monitor.payload("closing" if final else self._state(), held,
                                       self._downloads())
        try:
            # links buffered as known duplicates have no payload yet: after a refusal the
            # call is built again (with the cache cleared, they are encoded then)
            result = await self.frontier.call(batch, monitor, resend=False)
        except StaleDupeCache:
            if not again:
                raise
            self._inc("fleet/dupefilter/cache_cleared")
            return await self._call_once(final, again=False)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # Redis refused the call before its first write: nothing changed; keep it all
            self._inc("fleet/backpressure/oom")
            logger.warning("Redis is out of memory (maxmemory): pausing pushes and "
                           "acknowledgements until it has room", extra={"spider": self.spider})
            await asyncio.sleep(self.config.poll_interval * 4)
            return None
        if self.frontier.unreplicated > self._unreplicated:
            self._inc("fleet/redis/unreplicated", self.frontier.unreplicated - self._unreplicated)
            if not self._unreplicated:
                logger.warning("Start requests pushed but not acknowledged by "
                               "FLEET_REDIS_WAIT_REPLICAS=%d replica(s) in time: a failover "
                               "now would lose them (counted in fleet/redis/unreplicated)",
                               self.frontier.wait_replicas, extra={"spider": self.spider})
            self._unreplicated = self.frontier.unreplicated
        # the call succeeded: drop what it carried from the local buffers
        self.monitor.confirmed()
        if batch.releases and not final:
            released = {entry_id for entry_id, _ in batch.releases}
            self._prefetch = deque((r, lease) for r, lease in self._prefetch
                                   if lease.entry_id not in released)
            self._give_back = [g for g in self._give_back if g.entry_id not in released]
        del self._done[:n_done]
        del self._dead[:n_dead]
        del self._unstorable[:len(batch.unstorable)]
        del self._downloaded[:len(batch.downloaded)]
        if result.refused:
            refused = set(result.refused)
            base = len(batch.pushes) - n_out
            kept = [o for i, o in enumerate(outbox) if base + i in refused]
            self._outbox[:n_out] = kept
            self._outbox_hold_until = time.monotonic() + self.config.poll_interval
            self._inc("fleet/backpressure/refused", len(kept))
        else:
            del self._outbox[:n_out]
        if self._start_pending:
            refused_ids = {id(o) for o in self._outbox}
            for o in outbox:
                if id(o) not in refused_ids:
                    self._start_pending.pop(id(o), None)
        children = [c for lease in done for c in lease.children]
        self._account(result, batch, children + outbox)
        if not final:
            self._receive(result)
        return result

    def _account(self, result: CallResult, batch: CallBatch, sent: list[Out]) -> None:
        self._inc("fleet/redis/roundtrips")
        for key, count in (("fleet/frontier/pushed", result.pushed),
                           ("fleet/dupefilter/cached", result.cached),
                           ("fleet/frontier/acked", result.acked),
                           ("fleet/backpressure/deferred", result.deferred),
                           ("fleet/backpressure/resumed", result.resumed),
                           ("fleet/frontier/released", result.released),
                           ("fleet/frontier/reclaimed", result.reclaimed)):
            if count:
                self._inc(key, count)
        if result.duplicates:
            self._inc("dupefilter/filtered", result.duplicates)
            self._inc("fleet/dupefilter/filtered", result.duplicates)
            if not self._logged_dupe:
                first = next((url for (url, *_), flag in zip(sent, result.push_flags,
                                                              strict=False) if not flag), "?")
                logger.debug("Filtered duplicate request: <GET %s> - no more duplicates will be "
                             "shown", first, extra={"spider": self.spider})
                self._logged_dupe = True
        if result.parked:
            self._inc("fleet/backpressure/parked", result.parked)
            logger.debug("Frontier full: %d request(s) parked until the frontier has room "
                         "for the rest of their links", result.parked,
                         extra={"spider": self.spider})
        if result.bloom_full:
            logger.warning("The fleet's Bloom filter is at its last slice; its false-positive "
                           "rate grows from here. Raise FLEET_DUPEFILTER_CAPACITY and purge.",
                           extra={"spider": self.spider})
        lost = set(result.lost)
        if lost:
            self._inc("fleet/frontier/lease_lost", len(lost))
            self._lost_total += len(lost)
            if self._lost_total <= 5 or self._lost_total % 100 < len(lost):
                logger.warning(
                    "%d lease(s) lost (%d so far): their requests were leased again elsewhere "
                    "(this worker stalled longer than FLEET_LEASE_TIMEOUT=%s s?), or the crawl "
                    "was purged / Redis lost its data; those pages may be fetched again and "
                    "their links are left to the new holder", len(lost), self._lost_total,
                    self.config.lease_timeout, extra={"spider": self.spider})
            self._prefetch = deque((r, lease) for r, lease in self._prefetch
                                   if lease.entry_id not in lost)
            for lease in [lease for _, lease in self._inflight.values()] + self._starting:
                if lease.entry_id in lost:
                    lease.lost = True

    def hold_left(self, host: str) -> float:
        """Seconds *host* is still on hold as of the last frontier call (no I/O)."""
        return max(0.0, self.holds.get(host, 0.0) - time.monotonic())

    def _receive(self, result: CallResult) -> None:
        now = time.monotonic()
        self.holds = {h: now + left for h, left in result.holds.items()}
        self._next_ready_at = None if result.next_ready is None else now + result.next_ready
        if self.stage is not None:
            self.stage.note_response_queue(result.response_queue)
        got = 0
        for entry in result.leased:
            lease = Lease(entry.entry_id, entry.token)
            lease.payload = entry.payload
            try:
                if stored_responses.is_stored(entry.payload):
                    request, stored = stored_responses.decode(
                        entry.payload, self.spider, self.config.request_classes)
                    request.meta[STORED_META_KEY] = stored
                else:
                    request = codec.decode(entry.payload, self.spider,
                                           self.config.request_classes)
            except Exception as exc:  # RequestDecodeError, or anything a Request class raises
                logger.error("Frontier entry %s cannot be used (%s); moved to dead letters",
                             entry.entry_id, exc, extra={"spider": self.spider})
                self._dead.append((lease, f"{type(exc).__name__}: {exc}"[:500]))
                self._inc("fleet/frontier/dead_letter")
                self._poke()
                continue
            if entry.expiries:
                self._inc("fleet/frontier/redelivered")
            if codec.PUSHED_META_KEY in request.meta and self.on_pushed is not None:
                self.on_pushed(request, lease)  # the spider middlewares' start hook first
            else:
                self._prefetch.append((request, lease))
            got += 1
        if got:
            self._inc("fleet/frontier/leased", got)
        idle_timeout = self.config.idle_timeout
        idle = (idle_timeout is not None and result.idle_ms >= idle_timeout * 1000
                and not (self._prefetch or self._inflight or self._done or self._outbox
                         or self._starting or self.start_active))
        if idle and not self._fleet_done:
            logger.info("Fleet idle for %.1f s (FLEET_IDLE_TIMEOUT=%s): closing",
                        result.idle_ms / 1000, idle_timeout, extra={"spider": self.spider})
        # not sticky: work pushed since (start requests read after this worker's first call,
        # another worker's pushes) makes it lease again; the engine closes only once the
        # start requests are done and nothing is pending
        self._fleet_done = idle
        if got or self._fleet_done:
            engine_hooks.wake_engine(self.crawler)

    async def _final_flush(self, reason: str) -> None:
        """Acknowledge what is done, push what is buffered, release every other lease."""
        assert self.frontier is not None
        if self._state_lost:
            return
        try:
            for _ in range(1000):
                before = (len(self._outbox), len(self._done))
                result = await self._call_once(final=True)
                if result is not None:
                    self._prefetch.clear()
                    self._inflight.clear()
                if result is None or not (self._outbox or self._done):
                    break
                if (len(self._outbox), len(self._done)) == before:
                    break  # the frontier refuses them: it is full
            if self._outbox:
                self._inc("fleet/backpressure/lost_at_close", len(self._outbox))
                logger.warning("Fleet worker closing (%s) with %d request(s) the full frontier "
                               "refused (start requests or links from errbacks); they are "
                               "dropped", reason, len(self._outbox),
                               extra={"spider": self.spider})
        except CrawlStateLostError as exc:
            self._lose_state(exc)
        except RedisUnavailableError as exc:
            logger.error("Fleet worker closing (%s) without reaching Redis: %d requests not "
                         "pushed, %d not acknowledged; their parents' leases will expire and "
                         "be fetched again. %s", reason, len(self._outbox), len(self._done),
                         exc, extra={"spider": self.spider})

    def inc(self, key: str, count: int = 1) -> None:
        """Add *count* to this worker's Scrapy stat *key*."""
        if self.stats is not None:
            self.stats.inc_value(key, count)

    _inc = inc
