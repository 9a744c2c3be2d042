"""A worker's lease book: its local buffers and what its components tell it about the
requests it leased, with no I/O.  The pump (frontier/pump.py) owns one and sends its
buffers in each frontier call; the scheduler (frontier/scheduler.py) buffers and takes
requests through it; the other components get it as their
:class:`~scrapy_fleet.frontier.ledger.LeaseLedger` (``engine_hooks.ledger_of``), the stage
hook as its ``StageScheduler`` (stages/roles.py).

Interface, in three parts (the buffers are public attributes for the pump only; the
scheduler uses the methods: tests/test_layers.py checks it):

* **buffering** (the scheduler's Scrapy methods): ``buffer(request, key, priority,
  delay_ms, parent)``, ``parent_of(request)``, ``take()``, ``finished(request)``,
  ``pending``, ``len(book)``, ``state``, ``withheld``, and for a request pushed with
  ``scrapy fleet push`` that passes the start hook: ``settle_start``, ``start_failed``,
  ``forget_start``;
* **the lease ledger**: ``closing``, ``draining``, ``start_active``, ``outbox_size``,
  ``first_unpushed_start``, ``note_parent``, ``hold_left``, ``note_hold``,
  ``download_over``, ``note_exit_wait``, ``give_back``, ``dead_letter``, ``note_failure``,
  ``withhold_acknowledgements``;
* **the stage hook**: ``config``, ``crawler``, ``spider``, ``inc``, ``holds_lease``,
  ``lost_lease``, ``attach_stored``.

Buffers: the prefetch (leased and decoded, not yet handed to the engine), the requests in
flight, those done (acknowledged with their links at the next call), downloads over (their
host's concurrency slot goes back), the outbox (requests without a parent in flight), dead
letters and leases given back.  A link the worker's DupeCache knows to be in the fleet's
Bloom filter is buffered as its Request, unencoded: the call leaves it out, and it is
encoded only if the frontier asks for the whole call again (:meth:`LeaseBook.materialize`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy_fleet import codec, engine_hooks
from scrapy_fleet.browser import pagemethods
from scrapy_fleet.errors import FleetError, RequestEncodeError
from scrapy_fleet.frontier.control import WorkerControl
from scrapy_fleet.frontier.leases import Lease, Out, callback_failure, unstorable_record
from scrapy_fleet.frontier.protocol import clamp_priority
from scrapy_fleet.frontier.routing import lease_partition
from scrapy_fleet.keys.crawl import STAGE_HOST
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.recrawl.record import revisit_record

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.frontier.dupecache import DupeCache

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # one logger for the scheduler

#: the buffers, public attributes of a LeaseBook that only the pump (its frontier calls)
#: reads and writes; the scheduler and the other components use the book's methods
BUFFERS = ("prefetch", "inflight", "done", "downloaded", "outbox", "start_pending",
           "outbox_hold_until", "by_entry", "dead", "starting", "unstorable", "given_back",
           "fleet_done", "drain_started", "holds", "dupes", "poke")

#: lua/proxies.lua's reasons to wait that mean no exit of the pool can carry a request
NO_EXIT = frozenset({"dead", "empty"})


def _nothing() -> None:
    """The default ``poke``: no pump is listening."""


class LeaseBook:
    """The buffers and leases of one worker (see the module docstring for its interface).
    Stats: ``scheduler/enqueued*``, ``scheduler/dequeued*``, ``fleet/frontier/*``,
    ``fleet/codec/*`` (docs/stats.md)."""

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        self.spider: Spider | None = None
        #: the worker's DupeCache (the frontier client's), None before it connects
        self.dupes: DupeCache | None = None
        #: called when something was buffered that a frontier call should carry soon
        self.poke: Callable[[], None] = _nothing
        #: the partitions whose leases are held back after a stall that may have made this
        #: worker dead to them (set by the pump: FrontierPump.held_partitions)
        self.held_parts: Callable[[], set[int]] = set
        self.prefetch: deque[tuple[Request, Lease]] = deque()
        self.inflight: dict[int, tuple[Request, Lease]] = {}  #: id(request) -> its lease
        self.done: list[Lease] = []
        self.downloaded: list[Lease] = []  #: downloads over, not yet told to the frontier
        self.outbox: list[Out] = []  #: requests without a parent in flight
        self._enqueued = self._dequeued = 0  # not yet in the stats (flush_counts)
        #: id(outbox entry) -> index of a start request (codec.START_META_KEY) not yet
        #: accepted by the frontier
        self.start_pending: dict[int, int] = {}
        #: FleetSpiderMiddleware is reading start requests, or waiting to take them over:
        #: an idle frontier does not close this worker then (more may come)
        self.start_active = False
        self.outbox_hold_until = 0.0  #: the frontier refused them: retry after this time
        self.by_entry: dict[str, Lease] = {}  #: entry id -> lease, for requests in flight
        self._parents: dict[int, tuple[Request, Lease]] = {}  # id(child) -> (child, lease)
        self.dead: list[tuple[Lease, str]] = []  #: (lease, reason) for the dead letters
        #: leases of pushed start requests in the spider middlewares' start hook (held like
        #: the prefetch until settle_start, start_failed or forget_start)
        self.starting: list[Lease] = []
        #: the scheduler's start hook: gets each leased request pushed with `scrapy fleet
        #: push` (its lease is held meanwhile); None: such requests join the prefetch
        self.on_pushed: Callable[[Request, Lease], None] | None = None
        #: failure records of requests without a parent that could not be encoded
        self.unstorable: list[bytes] = []
        # id(request) -> why it waits for a proxy exit (FleetProxyMiddleware)
        self._exit_waits: dict[int, str] = {}
        #: leases given back while draining (released at the next call, never acknowledged)
        self.given_back: list[Lease] = []
        #: why finished requests are no longer acknowledged, or None
        self.withheld: str | None = None
        #: the fleet was idle at the last call (FLEET_IDLE_TIMEOUT): nothing more to lease
        self.fleet_done = False
        #: the scheduler is closing (its last frontier call is under way or done)
        self.closing = False
        #: time.monotonic() when the engine began to close (SIGTERM), or None
        self.drain_started: float | None = None
        #: host -> time.monotonic() until which it is on hold, from the last frontier call
        self.holds: dict[str, float] = {}
        #: crawl control (issue 34): the pauses the last frontier call reported
        self.control = WorkerControl()
        #: recrawl: the Bloom key of a request (the scheduler's filter), sent with a revisit
        #: record for its sitemap-lastmod place entry (docs/recrawl.md); None: not sent
        self.bloom_key_of: Callable[[Request], bytes] | None = None

    def _known_duplicate(self, key: bytes, request: Request, parent: Lease | None) -> bool:
        """Does this worker's DupeCache know *key* to be in the fleet's Bloom filter (so the
        next frontier call leaves the request, found by *parent*, out)?  Never for a request
        holding a live browser page: it is encoded at once, to be refused and its page
        closed."""
        dupes = self.dupes
        return (dupes is not None
                and dupes.knows(key, parent.entry_id if parent is not None else None)
                and pagemethods.PAGE_META_KEY not in request.meta)

    def encode_link(self, request: Request) -> tuple[bytes, str] | None:
        """*request*, buffered as a known duplicate, encoded after all, with its host key (a
        partitioned crawl's frontier client, whose cache no longer knows it: partdupes.py);
        None when it cannot be encoded (logged, counted and recorded as failed)."""
        payload = self._encode(request)
        if payload is None:
            return None
        return payload, politeness.host_key(request.url, self.config.politeness.host_key)

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
            self.inc("fleet/codec/encode_error")
            self.inc(f"fleet/codec/encode_error/{name}")
            if pagemethods.close_page_of(request.meta):
                self.inc("fleet/browser/page_closed")  # a dropped request leaks no page
            record = unstorable_record(request, f"codec/{name}", str(exc), self.config,
                                       parent.url if parent is not None else "")
            (parent.unstorable if parent is not None else self.unstorable).append(record)
            return None

    def materialize(self, outs: list[Out], parent: Lease | None = None) -> None:
        """Encode, in place, the requests of *outs* buffered as known duplicates that the
        DupeCache no longer holds (cleared after a failover or a purge, or the oldest keys
        forgotten): the next call sends them whole.  One that cannot be encoded is dropped
        (logged and counted as at enqueue)."""
        if not any(type(o[3]) is not bytes for o in outs):
            return
        kept: list[Out] = []
        for out in outs:
            url, key, priority, payload, _, delay_ms, lastmod = out
            if isinstance(payload, bytes) or self._known_duplicate(key, payload, parent):
                kept.append(out)
                continue
            encoded = self._encode(payload, parent)
            start_index = self.start_pending.pop(id(out), None)
            if encoded is None:
                continue
            new: Out = (url, key, priority, encoded,
                         politeness.host_key(url, self.config.politeness.host_key), delay_ms,
                         lastmod)
            if start_index is not None:
                self.start_pending[id(new)] = start_index
            kept.append(new)
        outs[:] = kept

    def flush_counts(self) -> None:
        """Add the requests enqueued and dequeued since the last call to the stats (counted
        in plain ints per request: a stats call costs more than the rest of a duplicate)."""
        if self._enqueued:
            self.inc("scheduler/enqueued/redis", self._enqueued)
            self.inc("scheduler/enqueued", self._enqueued)
            self._enqueued = 0
        if self._dequeued:
            self.inc("scheduler/dequeued/redis", self._dequeued)
            self.inc("scheduler/dequeued", self._dequeued)
            self._dequeued = 0

    def held_leases(self) -> list[Lease]:
        """Every lease this worker holds and has not lost (prefetched, in the start hook,
        given back, in flight)."""
        held = [lease for _, lease in self.prefetch] + self.starting + self.given_back
        return held + [lease for _, lease in self.inflight.values() if not lease.lost]

    @property
    def state(self) -> str:
        """The worker's state as its heartbeat reports it (docs/monitoring.md): ``closing``,
        ``draining``, ``idle``, ``no_exit``, ``parsing`` or ``fetching``."""
        if self.closing:
            return "closing"
        if self.drain_started is not None:
            return "draining"
        if not (self.prefetch or self.inflight):
            return "idle"
        if any(why in NO_EXIT for why in self._exit_waits.values()):
            return "no_exit"  # requests wait for a proxy exit, and the pool has none live
        # a parse worker (FLEET_ROLE = "parse") holds stored responses: it fetches nothing
        return "parsing" if self.config.stages.role == "parse" else "fetching"

    def hold_left(self, host: str) -> float:
        """Seconds *host* is still on hold as of the last frontier call (no I/O)."""
        return max(0.0, self.holds.get(host, 0.0) - time.monotonic())

    @property
    def pending(self) -> bool:
        """Work is left for this worker (Scrapy's ``has_pending_requests``): requests
        buffered, in flight or in the start hook, or a fleet not idle yet."""
        return bool(self.prefetch or self.outbox or self.inflight or self.done
                    or self.starting or not self.fleet_done)

    def __len__(self) -> int:
        """Requests prefetched or in the outbox."""
        return len(self.prefetch) + len(self.outbox)

    # -- buffering (the scheduler's Scrapy methods) ----------------------------------------

    def buffer(self, request: Request, key: bytes, priority: int, delay_ms: int,
               parent: Lease | None = None, lastmod: int = 0) -> bool:
        """Buffer *request* for a coming frontier call (no I/O): with the acknowledgement of
        the lease it was found by (*parent*, else :meth:`parent_of`), or else in the outbox.
        *key*: its Bloom key (``b""``: not filtered); *priority*: already clamped to the
        frontier's range; *delay_ms*: how long it waits once queued (milliseconds); *lastmod*:
        its sitemap ``<lastmod>`` (epoch seconds, 0 none: such a request is always sent, never
        left out as a known duplicate: the frontier compares it with the URL's last fetch).
        Returns False when it cannot be encoded (logged, counted and recorded as failed)."""
        if parent is None:
            parent = self.parent_of(request)
        out: Out
        if key and not lastmod and self._known_duplicate(key, request, parent):
            # most links of a crawl: the call leaves it out, so it is encoded only if the
            # frontier asks for the whole call again (materialize)
            out = (request.url, key, priority, request, "", delay_ms, 0)
        else:
            payload = self._encode(request, parent)
            if payload is None:
                return False
            out = (request.url, key, priority, payload,
                   politeness.host_key(request.url, self.config.politeness.host_key), delay_ms,
                   lastmod)
        if parent is not None:
            parent.children.append(out)
        else:
            self.outbox.append(out)
            start_index = request.meta.get(codec.START_META_KEY)
            if isinstance(start_index, int):
                self.start_pending[id(out)] = start_index
        self._enqueued += 1  # counted into the stats before each frontier call (flush_counts)
        self.poke()
        return True

    def parent_of(self, request: Request) -> Lease | None:
        """The lease *request* goes with: the one of the request whose callback yielded it
        (:meth:`note_parent`, forgotten once asked), or the one whose entry id it carries
        (a redirect or retry of a request in flight); None for a request of its own."""
        noted = self._parents.pop(id(request), None)
        if noted is not None and noted[0] is request:
            return noted[1]
        entry_id = request.meta.get(codec.LEASE_META_KEY)
        if isinstance(entry_id, str):
            lease = self.by_entry.get(entry_id)
            if lease is not None and id(request) not in self.inflight:
                return lease
        return None

    def take(self, held: set[int] | frozenset[int] = frozenset()) -> Request | None:
        """The next prefetched request, now in flight (Scrapy's ``next_request``: no I/O),
        skipping those leased from a partition of *held* (they stay prefetched, in order);
        None when there is none."""
        if not self.prefetch:
            return None
        if held:
            at = next((i for i, (_, lease) in enumerate(self.prefetch)
                       if lease_partition(lease.entry_id) not in held), None)
            if at is None:
                return None
            self.prefetch.rotate(-at)
            request, lease = self.prefetch.popleft()
            self.prefetch.rotate(at)
        else:
            request, lease = self.prefetch.popleft()
        self.inflight[id(request)] = (request, lease)
        self.by_entry[lease.entry_id] = lease
        request.meta[codec.LEASE_META_KEY] = lease.entry_id
        lease.url = request.url
        self._dequeued += 1
        if len(self.prefetch) <= self.config.prefetch // 2:
            self.poke()
        return request

    def finished(self, request: Request) -> None:
        """The engine is done with *request* (engine_hooks.on_request_done): its lease is
        acknowledged at the next call with the links it yielded (not while acknowledgements
        are withheld; not when the lease was lost)."""
        if self.withheld is not None:
            if id(request) in self.inflight:  # stays held: released by the final flush
                self.inc("fleet/frontier/withheld")
            return
        entry = self.inflight.pop(id(request), None)
        if entry is None:
            return
        lease = entry[1]
        self._forget_entry(lease)
        if lease.lost:
            # another worker fetches this request again and will push its links (counted in
            # fleet/frontier/lease_lost when the reply said so: frontier/lostleases.py)
            return
        self.done.append(lease)
        self.poke()

    def settle_start(self, lease: Lease, main: Request | None) -> None:
        """The start hook is done with the pushed request of *lease*: *main* is fetched under
        the lease (it joins the prefetch), or, when None, the lease is acknowledged as done
        (with the requests buffered for it)."""
        self.starting.remove(lease)
        if main is None:
            self.done.append(lease)
            self.poke()
            return
        self.prefetch.append((main, lease))
        engine_hooks.wake_engine(self.crawler)

    def start_failed(self, lease: Lease, reason: str) -> None:
        """The start hook raised on the pushed request of *lease*: its entry goes to the dead
        letters with *reason* (cut to 500 characters), unless the lease was lost meanwhile.
        Stat ``fleet/frontier/dead_letter``."""
        self.starting.remove(lease)
        if lease.lost:
            return
        self.inc("fleet/frontier/dead_letter")
        self.dead.append((lease, reason[:500]))
        self.poke()

    def forget_start(self, lease: Lease) -> None:
        """Drop the lease of a pushed request in the start hook (lost: its new holder runs the
        hook)."""
        self.starting.remove(lease)

    # -- the lease ledger (frontier/ledger.py) and the stage hook (stages/roles.py) --------

    def note_parent(self, child: Request, parent: Request | None) -> None:
        """Record that *child* was yielded by the callback of *parent* (a request this
        worker leased), so that it is pushed with *parent*'s acknowledgement."""
        if parent is None:
            return
        entry = self.inflight.get(id(parent))
        if entry is not None:
            self._parents[id(child)] = (child, entry[1])

    @property
    def draining(self) -> bool:
        """The worker is shutting down (SIGTERM, idle close): its engine takes no more
        requests."""
        return self.closing or self.drain_started is not None or \
            engine_hooks.engine_closing(self.crawler)

    def first_unpushed_start(self) -> int | None:
        """Index of the first start request (``FleetSpiderMiddleware`` numbers them) that this
        worker holds and the frontier has not accepted yet, or None.  Every start request
        before it was pushed, found a duplicate, or dropped with an error."""
        return min(self.start_pending.values(), default=None)

    @property
    def outbox_size(self) -> int:
        """Requests buffered locally, waiting to be pushed (with or without a parent)."""
        return len(self.outbox) + sum(len(lease.children) for lease in self.done)

    def withhold_acknowledgements(self, reason: str) -> None:
        """Acknowledge no request from now on, and lease no more: the requests this worker
        finishes stay leased by it and are released when it closes (back to the queue, no
        expiry counted), so another worker fetches them again.  For a component that learns
        that their output was not handed on: ``MongoPipeline`` after a failure no retry heals
        (*reason*: its close reason).  Stat ``fleet/frontier/withheld``: requests finished
        and not acknowledged."""
        if self.withheld is None:
            self.withheld = reason
            logger.warning("Fleet worker stops acknowledging requests (%s): the requests it "
                           "still finishes go back to the frontier when it closes", reason,
                           extra={"spider": self.spider})

    def note_failure(self, request: Request, record: bytes) -> bool:
        """*request* (leased by this worker, in flight) failed for good: *record* (an encoded
        ``failures.record.FailureRecord``) goes to Redis with its acknowledgement, atomically.
        The first record of a request is kept.  Returns False when the request is not one of
        this worker's leases in flight, or has a record already."""
        entry = self.inflight.get(id(request))
        lease = entry[1] if entry is not None else self.by_entry.get(
            request.meta.get(codec.LEASE_META_KEY, ""))
        if lease is None or lease.failure is not None:
            return False
        lease.failure = record
        return True

    def note_revisit(self, request: Request, state: list[object] | None,
                     interval: float = 0.0) -> bool:
        """recrawl (docs/recrawl.md): leased *request* is revisited in *interval* seconds with
        *state* (recrawl/schedule.py) in its meta, or not revisited (*state* None), written
        with its acknowledgement.  Returns False when it is not a lease of this worker in
        flight (or its leased request cannot be read back)."""
        entry = self.inflight.get(id(request))
        lease = entry[1] if entry is not None else self.by_entry.get(
            request.meta.get(codec.LEASE_META_KEY, ""))
        if lease is None:
            return False
        key = b""
        if self.bloom_key_of is not None and not request.dont_filter:
            try:
                key = self.bloom_key_of(request)
            except ValueError:  # (a URL the fingerprinter cannot canonicalize)
                key = b""
        if state is None:
            lease.revisit = key  # (a revisit's place entry, if any, goes with it)
            return True
        try:
            lease.revisit = revisit_record(
                lease.payload, state, interval,
                politeness.host_key(request.url, self.config.politeness.host_key),
                clamp_priority(request.priority), key)
        except FleetError as exc:  # RequestDecodeError / RequestEncodeError
            logger.warning("Recrawl: %s is not tracked: %s", request.url, exc,
                           extra={"spider": self.spider})
            self.inc("fleet/recrawl/unstorable")
            lease.revisit = b""
            return False
        return True

    def dead_letter(self, request: Request, reason: str) -> bool:
        """Send the leased *request* (the object ``take`` returned, still in flight) to the
        dead letters with *reason* (cut to 500 characters) at the next frontier call, instead
        of acknowledging it when the engine is done with it; ``scrapy fleet dead`` lists it.
        False when this worker holds no lease for it.  Stat ``fleet/frontier/dead_letter``."""
        entry = self.inflight.get(id(request))
        if entry is None or entry[0] is not request or entry[1].lost:
            return False
        del self.inflight[id(request)]
        lease = entry[1]
        self._forget_entry(lease)
        self.dead.append((lease, reason[:500]))
        self.inc("fleet/frontier/dead_letter")
        self.poke()
        return True

    def callback_failed(self, lease: Lease, exc: BaseException) -> None:
        """The entry of *lease* names a callback or errback the spider cannot take
        (``__init__``, a missing method: codec.callback_problem): never fetched, acknowledged
        with its failure record (``spider/CallbackError``: ``scrapy fleet failed`` lists it,
        ``retry`` fetches it once the spider has the method), counted in
        ``fleet/failed/noted`` and logged (ERROR)."""
        lease.failure = callback_failure(lease, exc, self.config)
        logger.error("Frontier entry %s not fetched: %s (recorded as failed: "
                     "spider/CallbackError)", lease.entry_id, exc, extra={"spider": self.spider})
        self.inc("fleet/failed/noted")
        self.inc("fleet/failed/noted/spider/CallbackError")
        self.done.append(lease)
        self.poke()

    def note_exit_wait(self, request: Request, why: str | None) -> None:
        """``FleetProxyMiddleware``: *request* waits for a proxy exit, for lua/proxies.lua's
        reason *why* (``empty``, ``dead``, ``cooling``, ``probe``, ``caps``), or no longer
        waits (None).  While one waits because the pool has no exit that may carry it
        (``dead``, ``empty``) the worker's heartbeat state is ``no_exit``, which status, top
        and the dashboard show, with the alert ``proxy_no_exit`` (monitoring/alerts.py)."""
        if why is None:
            self._exit_waits.pop(id(request), None)
        else:
            self._exit_waits[id(request)] = why

    def give_back(self, request: Request) -> bool:
        """Release the lease of *request* (in flight, never sent: it only waited for a proxy
        exit) at the next frontier call instead of acknowledging it, so that another worker
        fetches it: for a draining worker, whose engine would otherwise wait for it until
        FLEET_DRAIN_TIMEOUT.  False when this worker holds no lease for it.  Stat
        ``fleet/frontier/given_back``."""
        self._exit_waits.pop(id(request), None)
        entry = self.inflight.get(id(request))
        if entry is None or entry[0] is not request or entry[1].lost:
            return False
        del self.inflight[id(request)]
        self._forget_entry(entry[1])
        self.given_back.append(entry[1])
        self.inc("fleet/frontier/given_back")
        self.poke()
        return True

    def note_hold(self, host: str, seconds: float) -> None:
        """Put *host* on hold for *seconds* at once (others learn it at their next call)."""
        self.holds[host] = max(self.holds.get(host, 0.0), time.monotonic() + seconds)

    def download_over(self, request: Request, report: tuple[object, ...] | None = None
                      ) -> None:
        """A leased request's download is over (response or failure): its host's concurrency
        slot goes back to the fleet with the next frontier call, while the response is still
        being parsed, as Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN counts downloads only.
        ``FleetPolitenessMiddleware`` calls it once it has put the host on hold if the answer
        asks for that, so that no slot is handed on before the hold.  Redirects and retries
        of the request carry the same entry id; only the first download counts.  *report*:
        (outcome, latency ms, reason, proxy exit id or "") for the host's adaptive controller
        (lua/adaptive.lua), sent with the slot."""
        lease = self._lease_of(request)
        if lease is None or lease.downloaded or lease.lost:
            return
        lease.downloaded = True
        lease.report = report
        self.downloaded.append(lease)
        self.poke()

    def holds_lease(self, request: Request) -> bool:
        """Is *request* (or a redirect/retry made from it) a request this worker leased and
        still holds?"""
        lease = self._lease_of(request)
        return lease is not None and not lease.lost

    def send_safe(self, request: Request) -> bool:
        """May leased *request* (or a redirect/retry made from it) leave for the network now
        (no I/O)?  False while the partition it was leased from is held after a stall that
        may have made this worker dead to it (frontier/liveness.py StallGuard), until a
        frontier call has said whether the lease is still this worker's.  True for a request
        this worker does not hold a lease of (a lost one: :meth:`lost_lease`)."""
        lease = self._lease_of(request)
        if lease is None or lease.lost:
            return True
        return lease_partition(lease.entry_id) not in self.held_parts()

    def lost_lease(self, request: Request) -> bool:
        """Was *request* (or a redirect/retry made from it) leased by this worker, and is that
        lease lost (leased again elsewhere: its new holder fetches it again)?"""
        lease = self._lease_of(request)
        return lease is not None and lease.lost

    def attach_stored(self, request: Request, payload: bytes) -> None:
        """Send the stored response *payload* of *request* with its acknowledgement (one
        atomic frontier call: the request is done exactly when its response is stored)."""
        lease = self._lease_of(request)
        assert lease is not None
        lease.children.append((request.url, b"", clamp_priority(request.priority), payload,
                               STAGE_HOST, 0, 0))

    def _lease_of(self, request: Request) -> Lease | None:
        """The lease of *request*: its own while it is in flight (this worker may hold a newer
        lease of the same entry, leased again after this one was lost), else the one whose
        entry id it carries (a redirect or retry made from a request in flight)."""
        entry = self.inflight.get(id(request))
        if entry is not None and entry[0] is request:
            return entry[1]
        return self.by_entry.get(request.meta.get(codec.LEASE_META_KEY, ""))

    def _forget_entry(self, lease: Lease) -> None:
        """*lease* is no longer in flight: its entry id no longer names it (unless this
        worker leased the entry again meanwhile: then it names that newer lease)."""
        if self.by_entry.get(lease.entry_id) is lease:
            del self.by_entry[lease.entry_id]

    def inc(self, key: str, count: int = 1) -> None:
        """Add *count* to this worker's Scrapy stat *key*."""
        if self.stats is not None:
            self.stats.inc_value(key, count)
