"""The call protocol of lua/frontier.lua: what one call carries, what it gets back.

:class:`CallBatch` is what a worker sends (lua/frontier.lua documents each field) and
:class:`FrontierParams` the per-crawl constants sent with it, packed by :func:`call_argv` into
ARGV[1] (the call's own fields) and ARGV[3] (the constants; :func:`call_args`: all in
ARGV[1]); :class:`CallResult` is the parsed reply (:class:`LeasedEntry` per lease).  Also
here: the fill-in of payloads a replayed reply leaves out (a call repeated after a lost reply
with the same op id gets the first reply back, without the payloads), the error of a lost
crawl marker, and the reads of the frontier's size, shared by the asyncio client
(``client.py``) and the blocking one (``admin.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack
import redis

from scrapy_fleet.errors import CrawlStateLostError
from scrapy_fleet.frontier.records import Ack, Push, ack_row, as_ack, as_push, push_rows
from scrapy_fleet.keys.crawl import CrawlKeys

OP_TTL_MS = 300_000
#: expired leases one call reclaims at most (a reclaim storm is spread over calls; each
#: reclaim costs ~10 µs of Redis time: bench/bench_capacity.py --storm)
RECLAIM_LIMIT = 50
#: largest |Request.priority| the frontier orders by (lua/hosts.lua checks it too): the
#: scheduler clamps larger ones (the request itself keeps its priority), pushes refuse them
PRIORITY_LIMIT = 2**31


def clamp_priority(priority: int) -> int:
    """*priority* within +-PRIORITY_LIMIT (the frontier's order of requests beyond it is
    that of the limit)."""
    return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, int(priority)))


@dataclass
class CallBatch:
    """One worker call.  Ids are entry ids (str), tokens fencing tokens (int), priorities ints.

    ``pushes`` holds :class:`~scrapy_fleet.frontier.records.Push` records and ``acks``
    :class:`~scrapy_fleet.frontier.records.Ack` records (their fields: frontier/records.py;
    packed to the wire there).  A client given tuples of their documented layouts (the push
    helper, tests) makes them records at its entry (:func:`typed`).  ``unstorable``
    holds the records of requests without a parent that could not be encoded (start
    requests...).
    """

    acks: list[Ack] = field(default_factory=list)
    releases: list[tuple[str, int]] = field(default_factory=list)
    dead: list[tuple[str, int, str]] = field(default_factory=list)
    extends: list[tuple[str, int]] = field(default_factory=list)
    pushes: list[Push] = field(default_factory=list)
    take: int = 0
    #: leases whose download is over: their host's concurrency slot is free (the lease
    #: itself lasts until its acknowledgement)
    #: (id, token) or (id, token, outcome, latency ms, reason, proxy exit id or ""): the
    #: download report of the adaptive controller (lua/step_adapt.lua; outcome 0 clean, 1
    #: overload, 2 neither)
    downloaded: list[tuple[Any, ...]] = field(default_factory=list)
    #: a heartbeat is due: the call is made even with nothing else to carry
    beat: bool = False
    #: failure records of requests without a parent that could not be encoded
    unstorable: list[bytes] = field(default_factory=list)
    #: the crawl-control generation the worker holds (issue 34; 0: none): recorded by the
    #: call (K.ctlseen), so that `pause` knows every live worker has seen it
    control_gen: int = 0
    #: a look at the crawl control is due (frontier/control.py CONTROL_POLL): the call is
    #: made even with nothing else to carry (nothing more is sent: every call reads it)
    poll: bool = False

    def is_empty(self) -> bool:
        return not (self.acks or self.releases or self.dead or self.extends or self.pushes
                    or self.take or self.downloaded or self.beat or self.unstorable
                    or self.poll)


def typed(batch: CallBatch) -> CallBatch:
    """*batch* with its pushes and acknowledgements as records, in place (those given as
    tuples of the documented layouts by callers outside the worker); returns *batch*."""
    if not set(map(type, batch.pushes)) <= {Push}:  # (map and set: no Python loop)
        batch.pushes = [as_push(p) for p in batch.pushes]
    if not set(map(type, batch.acks)) <= {Ack}:
        batch.acks = [as_ack(a) for a in batch.acks]
    return batch


def unencoded(batch: CallBatch) -> bool:
    """*batch* holds a link buffered unencoded: a known duplicate whose payload is still the
    Request (frontier/partdupes.py); a call of it refused for a stale filter generation cannot
    be sent again whole."""
    return any(type(push.payload) is not bytes for push in batch.pushes)


@dataclass(frozen=True)
class LeasedEntry:
    entry_id: str
    token: int
    payload: bytes
    expiries: int  #: how many leases of this entry expired before


@dataclass
class CallResult:
    leased: list[LeasedEntry]
    lost: list[str]  #: entries whose ack/extend carried a stale token
    push_flags: list[int]  #: per push, 1 new entry / 0 duplicate, refused or not pushed
    refused: list[int]  #: indexes of pushes without a parent refused because of the bounds
    pushed: int
    duplicates: int
    acked: int
    released: int
    reclaimed: int
    dead_lettered: int
    parked: int  #: acknowledgements turned into parkings (links left over)
    deferred: int  #: acknowledgements turned into deferrals (no link could be pushed)
    resumed: int  #: parked requests returned to the queue by this call
    queued: int  #: entries waiting, after this call
    inflight: int  #: entries leased fleet-wide, after this call
    deferred_now: int  #: deferred entries (waiting for a later time), after this call
    size: int  #: queued + inflight + deferred_now: what FLEET_QUEUE_MAX bounds
    idle_ms: int  #: how long the fleet has been idle (nothing queued or leased), -1 if busy
    now_ms: int  #: Redis server time
    bloom_full: bool
    holds: dict[str, float] = field(default_factory=dict)  #: host -> seconds of hold left
    #: stored responses waiting for a parse worker (stages): count and bytes
    response_queue: tuple[int, int] = (0, 0)
    #: seconds until the next host may be fetched (its GCRA turn, a hold), when the call
    #: leased fewer requests than it asked for; None: no host is waiting for a time
    next_ready: float | None = None
    marker: str = ""  #: the crawl marker (lua/failed.lua), "" when none was written
    #: indexes of the pushes the Bloom filter (or this call) had seen: duplicates
    seen: list[int] = field(default_factory=list)
    #: generation id of the Bloom filter the pushes were checked against (None: none were)
    bloom_gen: str | None = None
    #: of the duplicates, pushes the worker's cache knew (left out of the call)
    cached: int = 0
    #: the reply cache of this client's previous call was gone (expired, or lost in a
    #: failover with that call's writes): what the client learnt of the filter is not trusted
    prev_lost: bool = False
    #: the call had no events and cached no reply (lua/step_reply.lua): a repeat of its op id
    #: runs it again, and the client's next call names the same previous op as this one did
    uncached: bool = False
    #: recrawl: URLs tracked for revisits (scheduled or in the frontier as a revisit)
    revisits_tracked: int = 0
    #: recrawl: seconds until the next scheduled revisit is due (0: due now; None: none)
    next_revisit: float | None = None
    #: budgets: the crawl's close reason ("budget_pages", "budget_seconds") once its budget
    #: is spent and nothing is in flight ("": not so; lua/step_budget.lua)
    budget_spent: str = ""
    #: budgets at P > 1 (FrontierParams.budget_chunked): the pages left in this partition's
    #: chunk of the crawl's page budget after the call (None: not told; lua/step_budget.lua)
    budget_left: int | None = None
    #: crawl control (issue 34; None: never used): the state the worker holds until its next
    #: call (frontier/control.py)
    control: ControlState | None = None
    #: (filled by the worker's client, not read from the reply) the partitions whose part of
    #: the call got its reply: each a sign of this worker's life there (frontier/liveness.py);
    #: one partition: 0
    reached: frozenset[int] = frozenset({0})
    #: (filled by the worker's client) the call's monitoring payload, with its counter
    #: deltas, got through: False, the pump keeps the deltas and sends them again
    monitor_confirmed: bool = True

    @classmethod
    def from_reply(cls, reply: bytes) -> CallResult:
        # Redis's cmsgpack packs every string as msgpack "raw": read them as bytes.
        d = {k.decode(): v for k, v in msgpack.unpackb(reply, raw=True).items()}
        leased = [LeasedEntry(e[0].decode(), int(e[1]), e[2], int(e[3]))
                  for e in d.get("leased", [])]
        return cls(
            leased=leased,
            lost=[x.decode() for x in d.get("lost", [])],
            push_flags=[int(x) for x in d.get("pf", [])],
            refused=[int(x) for x in d.get("rf", [])],
            parked=int(d.get("parked", 0)), deferred=int(d.get("deferred", 0)),
            resumed=int(d.get("resumed", 0)), deferred_now=int(d.get("dn", 0)),
            size=int(d.get("size", 0)),
            pushed=int(d.get("new", 0)), duplicates=int(d.get("dup", 0)),
            acked=int(d.get("acked", 0)), released=int(d.get("released", 0)),
            reclaimed=int(d.get("reclaimed", 0)), dead_lettered=int(d.get("dead", 0)),
            queued=int(d.get("queued", 0)), inflight=int(d.get("inflight", 0)),
            idle_ms=int(d.get("idle", -1)), now_ms=int(d.get("now", 0)),
            bloom_full=bool(d.get("full", False)),
            holds={h.decode(): float(left) / 1000 for h, left in d.get("holds", [])},
            next_ready=float(d["nr"]) / 1000 if d.get("nr") is not None else None,
            response_queue=as_pair(d.get("rq")),
            marker=(d.get("mk") or b"").decode(errors="replace"),
            seen=[int(x) for x in d.get("pd", [])],
            bloom_gen=d["bg"].decode() if isinstance(d.get("bg"), bytes) else None,
            prev_lost=bool(d.get("pl", 0)),
            uncached=bool(d.get("nc", 0)),
            revisits_tracked=as_pair(d.get("rv"))[0],
            next_revisit=(float(d["rv"][1]) / 1000 if isinstance(d.get("rv"), (list, tuple))
                          and len(d["rv"]) == 2 and int(d["rv"][1]) >= 0 else None),
            budget_spent=(d.get("bx") or b"").decode(errors="replace"),
            budget_left=None if d.get("bq") is None else int(d["bq"]),
            control=ControlState.from_reply(d.get("cz")),
        )


@dataclass(frozen=True)
class ControlState:
    """The crawl control a frontier call reports (lua/step_control.lua, reply field ``cz``):
    *gen*, its generation; *paused*: seconds the crawl stays paused (None: running; inf:
    until resumed); *hosts*: host -> seconds it stays paused or blocked (inf: until
    unblocked)."""

    gen: int
    paused: float | None
    hosts: dict[str, float]

    @classmethod
    def from_reply(cls, value: Any) -> ControlState | None:
        """*value* (``[gen, ms left (-1 running, 0 until resumed), [[host, ms left]...]]``)
        as a state; None when absent or not of that shape."""
        if not isinstance(value, (list, tuple)) or len(value) != 3:
            return None
        return cls(int(value[0]), _left(int(value[1])),
                   {h.decode(errors="replace"): _left(int(ms)) or 0.0 for h, ms in value[2]})

    def merge(self, other: ControlState | None) -> ControlState:
        """The state of two partitions' replies: the later generation, paused when either
        says so, every host either names."""
        if other is None:
            return self
        pauses = [p for p in (self.paused, other.paused) if p is not None]
        return ControlState(max(self.gen, other.gen), max(pauses) if pauses else None,
                            {**self.hosts, **other.hosts})


def _left(ms: int) -> float | None:
    """Seconds of a pause from its ms left: None when not paused (-1), inf for 0 (until
    resumed)."""
    return None if ms < 0 else float("inf") if ms == 0 else ms / 1000


def as_pair(value: Any) -> tuple[int, int]:
    """``[count, bytes]`` of the reply's ``rq`` (0, 0 when absent)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    return 0, 0


@dataclass(frozen=True)
class FrontierParams:
    """Per-crawl constants sent with every call.  Times in seconds."""

    lease_timeout: float = 30.0
    max_leases: int = 3
    bloom_capacity: int = 1_000_000
    bloom_error_rate: float = 0.001
    queue_max: int | None = None  #: FLEET_QUEUE_MAX
    host_queue_max: int | None = None  #: FLEET_HOST_QUEUE_MAX
    defer_delay: float = 10.0  #: FLEET_BACKPRESSURE_DELAY
    host_interval: float = 0.0  #: seconds between two requests to one host, fleet-wide
    host_burst: int = 1  #: GCRA burst of a host
    host_concurrency: int = 0  #: requests in flight to one host, fleet-wide (0: no cap)
    robots: bool = False  #: ROBOTSTXT_OBEY: one scout per host until its robots.txt is known
    host_interval_is_rate: bool = False  #: host_interval comes from a rate (may catch up)
    #: stages (FLEET_ROLE): lease only from this host key ("" any), or never from this one
    lease_only_host: str = ""
    lease_except_host: str = ""
    failed_max: int = 10_000  #: FLEET_FAILED_MAX: failed requests kept, the oldest trimmed
    op_ttl: float = OP_TTL_MS / 1000  #: seconds a call's cached reply is kept (replays)
    recrawl_max: int = 0  #: FLEET_RECRAWL_MAX: tracked URLs at most (0: no bound)
    #: FLEET_WORKER_DEAD_AFTER: a lease holder silent this long is dead and its leases are
    #: reclaimed (lua/step_recover.lua); 0: only FLEET_LEASE_TIMEOUT ends a lease
    dead_after: float = 0.0
    #: budgets (issue 34, lua/step_budget.lua): FLEET_BUDGET_PAGES, FLEET_BUDGET_SECONDS,
    #: FLEET_HOST_BUDGET_PAGES (0: none; `scrapy fleet budget` stores numbers above them)
    budget_pages: int = 0
    budget_seconds: float = 0.0
    host_budget_pages: int = 0
    budget_items: int = 0  #: FLEET_BUDGET_ITEMS (CLOSESPIDER_ITEMCOUNT), 0: none
    budget_bytes: int = 0  #: FLEET_BUDGET_BYTES, 0: none
    #: P > 1 with a page budget: each partition leases against its chunk of it, reserved at
    #: the home (frontier/budgetchunks.py; budget_pages is then 0 in the partitions' calls)
    budget_chunked: bool = False
    #: FLEET_ADAPTIVE*: (beta, step, window s, latency factor g[, min rate /s]), None: no
    #: controller (lua/adaptive.lua)
    adaptive: tuple[float, ...] | None = None
    #: FLEET_CRAWL_WEIGHT: the crawl's share of a host's leases in its crawl group (sent only
    #: when the call's keys name a group: lua/step_group.lua)
    group_weight: float = 1.0


def call_constants(params: FrontierParams, group_member: str = "") -> dict[str, Any]:
    """The fields of lua/frontier.lua's argument that *params* gives (the same call after
    call): ARGV[3] of :func:`call_argv`, part of ARGV[1] in :func:`call_args`.
    *group_member*: the crawl's id when its keys are in a crawl group (``gi``, with ``gw``
    its weight: lua/step_group.lua), else ""."""
    return {
        **({"gi": group_member, "gw": params.group_weight} if group_member else {}),
        "lm": int(params.lease_timeout * 1000),
        "ml": params.max_leases,
        "ot": int(params.op_ttl * 1000),
        "bn": params.bloom_capacity,
        "bp": params.bloom_error_rate,
        "rc": RECLAIM_LIMIT,
        "qm": params.queue_max or 0,
        "hm": params.host_queue_max or 0,
        "dd": int(params.defer_delay * 1000),
        "pt": int(params.host_interval * 1000),
        "pb": params.host_burst,
        "pc": params.host_concurrency,
        "ro": 1 if params.robots else 0,
        "pr": 1 if params.host_interval_is_rate else 0,
        "ho": params.lease_only_host,
        "hx": params.lease_except_host,
        "fm": params.failed_max,
        "rvm": params.recrawl_max,
        "wd": int(params.dead_after * 1000),
        "bgp": params.budget_pages,
        "bgs": params.budget_seconds,
        "bgh": params.host_budget_pages,
        "bgi": params.budget_items,
        "bgb": params.budget_bytes,
        **({"bgc": 1} if params.budget_chunked else {}),
        **({"ad": 1, "ab": params.adaptive[0], "as": params.adaptive[1],
            "aw": int(params.adaptive[2] * 1000), "ag": params.adaptive[3],
            "am": params.adaptive[4] if len(params.adaptive) > 4 else 0.05}
           if params.adaptive else {"ad": 0}),
    }


def _call_fields(batch: CallBatch, worker: str, marker: str, left_out: int,
                 gen: str | None, lean: bool, first: bool = False) -> dict[str, Any]:
    """The fields of one call (*lean*: without those the script defaults alike: empty lists,
    no duplicates left out, no marker to write when the client requires one).  The one
    place a call's records are packed (records.push_row, records.ack_row); tuples of their
    documented layouts become records first (:func:`typed`)."""
    typed(batch)
    fields: dict[str, Any] = {
        "ld": left_out,
        "bg": gen or "",
        "w": worker,
        "a": [ack_row(a) for a in batch.acks],
        "r": [list(r) for r in batch.releases],
        "d": [list(d) for d in batch.dead],
        "x": [list(x) for x in batch.extends],
        "s": [list(x) for x in batch.downloaded],
        "p": push_rows(batch.pushes),
        "t": batch.take,
        "u": list(batch.unstorable),
        "mk": marker,
        # (the marker a call writes when the crawl has none: a call requiring one, mk, is
        # refused then)
        "mc": "" if lean and marker else uuid.uuid4().hex,
        # (a worker's first call: the leases under its id are a predecessor's,
        # lua/step_recover.lua recover_predecessor)
        "nw": 1 if first else 0,
        "cg": batch.control_gen,
    }
    if lean:
        return {k: v for k, v in fields.items() if v or k in ("w", "t")}
    return fields


def call_args(batch: CallBatch, worker: str, params: FrontierParams, marker: str = "",
              left_out: int = 0, gen: str | None = None, group_member: str = "") -> bytes:
    """ARGV[1] of lua/frontier.lua, every field in it.  *marker*: the crawl marker the
    client saw ("" before its first call, or for a client that must not require one, like
    the push helper); *left_out*: pushes the worker's DupeCache left out, known to be in the
    filter of generation *gen*."""
    return msgpack.packb({**_call_fields(batch, worker, marker, left_out, gen, False),
                          **call_constants(params, group_member)},
                         use_bin_type=False)  # Redis's cmsgpack cannot read msgpack "bin"


def call_argv(batch: CallBatch, worker: str, params: FrontierParams, marker: str = "",
              left_out: int = 0, gen: str | None = None,
              first: bool = False, group_member: str = "") -> tuple[bytes, bytes]:
    """ARGV[1] and ARGV[3] of lua/frontier.lua as the clients send them (arguments as
    :func:`call_args`'s): the call's own fields, without those the script defaults alike
    (empty lists...), and :func:`call_constants`, bytes identical call after call, which the
    script unpacks and checks once while its Functions library stays loaded
    (lua/step_check.lua).  *first*: the first call of a worker's client (``nw``)."""
    return (msgpack.packb(_call_fields(batch, worker, marker, left_out, gen, True, first),
                          use_bin_type=False),
            msgpack.packb(call_constants(params, group_member), use_bin_type=False))


def as_int(value: Any, default: Any = 0) -> Any:
    """*value* (bytes or str from Redis) as an int; *default* when it is not one (a value not
    written by the fleet must not stop ``status``)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default



def state_lost(exc: redis.ResponseError, url: str) -> CrawlStateLostError | None:
    """*exc* as a :class:`CrawlStateLostError` when frontier.lua found the crawl marker gone."""
    text = str(exc)
    if "fleet: crawl state lost" not in text:
        return None
    from scrapy_fleet.redact import redact

    return CrawlStateLostError(f"Redis at {redact(url)} has lost this crawl's state: "
                               f"{text.split('crawl state lost: ', 1)[-1]}")


def needs_payloads(result: CallResult) -> list[str]:
    """Entry ids whose payload is missing: the reply was a cached replay (see frontier.lua)."""
    return [e.entry_id for e in result.leased if not e.payload]


def fill_payloads(result: CallResult, payloads: list[Any]) -> CallResult:
    filled = []
    it = iter(payloads)
    for e in result.leased:
        if e.payload:
            filled.append(e)
        else:
            filled.append(LeasedEntry(e.entry_id, e.token, next(it) or b"", e.expiries))
    result.leased = filled
    return result


def frontier_size(queued: int, leased: int, deferred: int) -> int:
    """The frontier's size, which FLEET_QUEUE_MAX bounds: queued + leased + deferred entries
    (lua/queue.lua's Queue.size is the same sum, inside the scripts)."""
    return queued + leased + deferred


def queue_size_reads(pipe: Any, keys: CrawlKeys) -> None:
    """Queue on *pipe* (sync or asyncio) the reads :func:`size_of` adds up."""
    pipe.get(keys.queue_count)
    pipe.zcard(keys.leases)
    pipe.zcard(keys.deferred)


def size_of(replies: list[Any]) -> int:
    """The frontier's size from the replies of :func:`queue_size_reads`."""
    queued, leased, deferred = replies
    return frontier_size(as_int(queued), int(leased), int(deferred))
