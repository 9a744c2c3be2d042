"""The lean push call of a partitioned crawl (lua/push_lean.lua, docs/partitions.md): its
argument and its reply, and a worker's known duplicates of one destination partition
(:class:`LeanDestination`).  Used by :class:`~scrapy_fleet.frontier.partitions.
PartitionedFrontier` for foreign links and by the push command."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import redis

from scrapy_fleet.frontier.dupecache import STALE_GENERATION, DupeCache
from scrapy_fleet.frontier.protocol import OP_TTL_MS, FrontierParams
from scrapy_fleet.frontier.records import Push, as_lean, lean_row
from scrapy_fleet.frontier.sent import SentLean
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys


def lean_args(pushes: Sequence[Sequence[Any]], params: FrontierParams, marker: str,
              left_out: int = 0, gen: str | None = None) -> bytes:
    """ARGV[1] of lua/push_lean.lua: *pushes* are :class:`Push` records (packed by
    records.lean_row; the worker's) or tuples of the lean layout ``(bloom key, priority,
    payload, host[, delay ms[, lastmod s[, partition, entry number]]])`` (records.as_lean;
    the push helper's); *left_out*: links the client left out as known duplicates of
    filter generation *gen* (the script checks that evidence before any write)."""
    extra: dict[str, Any] = {"lo": left_out, "bg": gen or ""} if left_out else {}
    return msgpack.packb({
        "p": [lean_row(as_lean(p)) for p in pushes],
        "bn": params.bloom_capacity, "bp": params.bloom_error_rate,
        "qm": params.queue_max or 0, "hm": params.host_queue_max or 0,
        "ot": OP_TTL_MS, "mk": marker, "mc": uuid.uuid4().hex, **extra,
    }, use_bin_type=False)


@dataclass
class LeanResult:
    """Reply of lua/push_lean.lua (indexes 0-based, into the call's pushes)."""

    flags: list[int]
    refused: list[int]
    seen: list[int]
    pushed: int
    duplicates: int
    full: bool
    marker: str
    size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: (stored responses, their bytes) when a push was a stored response (FLEET_ROLE)
    rq: tuple[int, int] | None = None
    #: the filter's generation (None: the call read no filter)
    gen: str | None = None
    #: the reply cache of this client's previous lean call to the partition was gone (a
    #: failover may have rolled the partition back): what the client knew of it is void
    prev_lost: bool = False
    #: pushes the client's cache left out (known duplicates; counted in ``duplicates``)
    cached: int = 0

    @classmethod
    def from_reply(cls, reply: bytes) -> LeanResult:
        d = {k.decode(): v for k, v in msgpack.unpackb(reply, raw=True).items()}
        rq = d.get("rq")
        bg = d.get("bg")
        return cls([int(x) for x in d.get("pf", [])], [int(x) for x in d.get("rf", [])],
                   [int(x) for x in d.get("pd", [])], int(d.get("new", 0)),
                   int(d.get("dup", 0)), bool(d.get("full", False)),
                   (d.get("mk") or b"").decode(errors="replace"),
                   int(d["size"]) if d.get("size") is not None else None,
                   rq=(int(rq[0]), int(rq[1])) if isinstance(rq, list) and len(rq) == 2
                   else None,
                   gen=bg.decode(errors="replace") if isinstance(bg, bytes) else None,
                   prev_lost=bool(d.get("pl")))

    def add(self, res: LeanResult, idx: list[int]) -> None:
        """Merge, in place, *res*: the reply of a lean call of the pushes at indexes *idx*
        of this reply's (one of the calls a buffer of foreign links took)."""
        for j, flag in enumerate(res.flags[:len(idx)]):
            self.flags[idx[j]] = flag
        self.refused += [idx[j] for j in res.refused if j < len(idx)]
        self.seen += [idx[j] for j in res.seen if j < len(idx)]
        self.pushed += res.pushed
        self.duplicates += res.duplicates
        self.cached += res.cached
        self.full = self.full or res.full
        self.marker, self.size, self.rq = res.marker, res.size, res.rq or self.rq

    def expand(self, kept: list[int], total: int, left_out: int) -> LeanResult:
        """This reply of a call sent without the pushes a cache left out, with indexes into
        the whole list again (*kept*: the index of each push sent): a push left out is a
        duplicate (flag 0, in ``seen``)."""
        if not left_out:
            return self
        flags = [0] * total
        for j, flag in enumerate(self.flags):
            flags[kept[j]] = flag
        kept_set = set(kept)
        self.seen = sorted({kept[j] for j in self.seen}
                           | {i for i in range(total) if i not in kept_set})
        self.refused = [kept[j] for j in self.refused]
        self.flags = flags
        self.duplicates += left_out
        self.cached = left_out
        return self


#: runs lua/push_lean.lua with (KEYS, ARGV[1]), retrying on connection errors with the same
#: arguments (a repeat gets the first reply): its reply
LeanRun = Callable[[list[str], bytes], Awaitable[bytes]]


class LeanDestination:
    """What a worker knows of one partition it pushes foreign links into: the Bloom keys
    known to be in that partition's filter (a :class:`DupeCache` of *size* keys) and the op id
    of its last lean call there, the evidence that the partition still holds what the cache
    learnt (as the frontier call's ``prev_op`` chain, lua/step_reply.lua).

    A lean push leaves the known duplicates out and names the filter's generation and the
    previous call's reply cache (KEYS ``prev_op``); lua/push_lean.lua refuses such a call,
    before any write, when the generation changed (purge) or that reply cache is gone (a
    failover to a replica that lacked the latest writes: replication is in order); the cache
    is then cleared and the call sent again whole, with a new op id.  A call whose
    evidence is gone without leaving anything out says so (``pl``): the cache is cleared.
    Lean calls to one partition are made one at a time (the chain would break otherwise:
    only a cleared cache, never a wrong one).  Separate from the partition's frontier client's
    cache, whose chain is its own calls'.
    """

    def __init__(self, keys: CrawlKeys, size: int) -> None:
        self.keys = keys
        self.dupes = DupeCache(size)
        self.prev_op = "-"  #: the op id of the last lean call that got a reply
        self.sent = 0  #: lean calls sent (each attempt of a refused one counted)

    def prepare(self, pushes: list[Push], params: FrontierParams,
                marker: str) -> SentLean:
        """One lean call of *pushes* (:func:`lean_args`' rows), the known duplicates left out,
        with a new op id and the previous call's as evidence; sent by :meth:`send`, and kept
        by the caller to be sent again as it was when its reply is lost."""
        sent, kept, left_out = self._split(pushes)
        return SentLean(uuid.uuid4().hex, lean_args(sent, params, marker, left_out,
                                                    self.dupes.gen),
                        list(pushes), self.prev_op, kept if left_out else None)

    async def send(self, run: LeanRun, call: SentLean, params: FrontierParams,
                   marker: str) -> LeanResult:
        """Send *call* (made by :meth:`prepare`; again as it was after a lost reply, or its
        reply taken again when it came); the reply with indexes into ``call.rows``.  A call
        refused for its evidence (lua/push_lean.lua: "stale filter generation") clears the
        cache and is made again whole, in place (a new op id), and sent.

        Raises:
            redis.ResponseError: the script's other errors (crawl state lost, bad argument).
        """
        if call.reply is None:
            try:
                await self._run(run, call)
            except redis.ResponseError as exc:
                if call.kept is None or STALE_GENERATION not in str(exc):
                    raise
                self.dupes.clear()
                call.op_id, call.prev_op, call.kept = uuid.uuid4().hex, self.prev_op, None
                call.arg = lean_args(call.rows, params, marker)
                await self._run(run, call)
        assert call.reply is not None
        res = LeanResult.from_reply(call.reply)
        kept = call.kept if call.kept is not None else list(range(len(call.rows)))
        left_out = len(call.rows) - len(kept)
        self.dupes.hits += left_out
        self.dupes.learn_keys([call.rows[i][0] for i in kept], res.flags, res.seen, res.gen,
                              res.prev_lost)
        return res.expand(kept, len(call.rows), left_out)

    async def _run(self, run: LeanRun, call: SentLean) -> None:
        keys = self.keys.call_keys(PUSH_LEAN_CALL, call.op_id, call.prev_op)
        self.sent += 1
        call.reply = await run(keys, call.arg)
        self.prev_op = call.op_id

    def _split(self, pushes: list[Push]) -> tuple[list[Push], list[int], int]:
        dupes = self.dupes
        if not len(dupes) or dupes.gen is None:
            return pushes, list(range(len(pushes))), 0
        kept = [i for i, p in enumerate(pushes)
                if not (p.key and p.key in dupes) or p.lastmod]
        if len(kept) == len(pushes):
            return pushes, kept, 0
        return [pushes[i] for i in kept], kept, len(pushes) - len(kept)
