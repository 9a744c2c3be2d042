"""One frontier call, described without IO (:class:`FrontierCall`), and its two transports.

A call of lua/frontier.lua is more than one EVALSHA: the links the worker's
:class:`~scrapy_fleet.frontier.dupecache.DupeCache` knows are left out; a call refused for a
stale filter generation is sent again in full with a new op id; a call that pushed requests
without a parent may WAIT for replicas; a replayed reply (same op id) lacks the payloads of
its leases, read with one HMGET.  That sequence is written once, here, as a generator
(:meth:`FrontierCall.plan`) that yields *steps* and takes their replies:

* :class:`RunScript` (keys, args of lua/frontier.lua): reply the script's bytes, or the
  ``redis.ResponseError`` it raised thrown into the plan;
* :class:`WaitReplicas`: reply the number of replicas that acknowledged;
* :class:`ReadPayloads`: reply the HMGET of those entry ids' payloads.

The plan returns the :class:`~scrapy_fleet.frontier.protocol.CallResult`.  A transport only
runs steps: :func:`drive` (blocking: ``FrontierAdmin``) and :func:`drive_async` (asyncio:
``AsyncFrontier``); retrying a step after a connection error (same op id) is the
transport's.  One :class:`FrontierCall` holds the state one client carries from call to call
(the previous op id, the crawl marker, the duplicate cache, calls not replicated in time)
for one set of crawl keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

import redis

from scrapy_fleet.frontier.dupecache import (
    STALE_GENERATION,
    DupeCache,
    StaleDupeCache,
    expand_result,
)
from scrapy_fleet.frontier.protocol import (
    CallBatch,
    CallResult,
    FrontierParams,
    call_argv,
    fill_payloads,
    needs_payloads,
    state_lost,
    typed,
)
from scrapy_fleet.keys.crawl import CrawlKeys


@dataclass(frozen=True)
class RunScript:
    """Run lua/frontier.lua with these KEYS and ARGV; reply: its reply (bytes)."""

    keys: list[str]
    args: list[bytes]


@dataclass(frozen=True)
class WaitReplicas:
    """WAIT for *replicas* replicas on the node of *key* (the crawl's); reply: how many
    acknowledged (int)."""

    key: str
    replicas: int


@dataclass(frozen=True)
class ReadPayloads:
    """HMGET *key* (the crawl's payload hash) *entry_ids*; reply: the list of payloads."""

    key: str
    entry_ids: list[str]


Step = RunScript | WaitReplicas | ReadPayloads
#: a call's plan: yields steps, is sent each step's reply, returns the call's result
Plan = Generator[Step, Any, CallResult]

_Split = tuple[CallBatch, list[int], int]


class FrontierCall:
    """What one client sends to lua/frontier.lua and how it reads the replies, for the crawl
    keys *keys*; IO-free (a transport runs the steps of :meth:`plan`).

    *worker*: the worker id (``""`` for a command); *url*: the Redis URL, named in errors
    only; *wait_replicas*: FLEET_REDIS_WAIT_REPLICAS; *wait_every_call*: WAIT after every
    call (the push of a command) rather than only after a call that pushed requests without
    a parent (start requests: a worker); *keep_marker*: require, from the second call on, the
    crawl marker the first reply named (a worker: a crawl purged or lost under it is refused,
    :class:`~scrapy_fleet.errors.CrawlStateLostError`); a command requires none.
    """

    def __init__(self, keys: CrawlKeys, params: FrontierParams, *, worker: str = "",
                 url: str = "", dupes: DupeCache | None = None, wait_replicas: int = 0,
                 wait_every_call: bool = False, keep_marker: bool = True) -> None:
        self.keys = keys
        self.params = params
        self.worker = worker
        self.url = url
        #: Bloom keys known to be in the filter (links with them are not sent)
        self.dupes = dupes if dupes is not None else DupeCache(0)
        self.wait_replicas = wait_replicas
        self.wait_every_call = wait_every_call
        self.keep_marker = keep_marker
        #: op id of the previous call whose reply was cached (the next cached call drops that
        #: cache; a call without events leaves it, lua/step_reply.lua)
        self.prev_op = "-"
        #: the crawl marker seen by the first call (keep_marker); every later call requires it
        self.marker = ""
        self.unreplicated = 0  #: calls fewer replicas than wait_replicas acknowledged
        #: the op id, batch and what was sent of the last plan's script step (None before
        #: it): that batch sent again with that op id (after a failure) is sent as it was
        self.last_call: tuple[str, CallBatch, _Split] | None = None

    @property
    def last_op(self) -> str | None:
        """The op id of the last plan's script step (None: that plan sent none): after a
        call failed, :meth:`plan` with it sends the call again as it was."""
        return self.last_call[0] if self.last_call is not None else None

    def plan(self, batch: CallBatch, monitor: bytes = b"", op_id: str | None = None,
             resend: bool = True) -> Plan:
        """The steps of one call of *batch* (*monitor*: ARGV[2], heartbeat and counter
        deltas).  *op_id* (default: a fresh one) names the call: the same id again replays the
        first reply, so such a call carries what the first one did and is sent whole, or, when
        it is :attr:`last_op` and *batch* the same (the last call, failed without a
        reply), as that one was sent (the links left out then are left out again: its cached
        reply counts them).

        Links :attr:`dupes` knows are left out (counted as duplicates by the script).  A call
        refused for a stale filter generation (purge, or a failover that lost writes) clears
        :attr:`dupes` and is sent again in full with a new op id; with *resend* False the plan
        raises :class:`StaleDupeCache` instead (nothing changed).

        Raises:
            CrawlStateLostError: the crawl marker :attr:`marker` names is gone; nothing
                changed.
            StaleDupeCache: *resend* is False and the call was refused as above.
            redis.ResponseError: any other error of the script, as thrown into the plan.
        """
        typed(batch)  # (a caller outside the worker may give tuples)
        whole: _Split = (batch, list(range(len(batch.pushes))), 0)
        last, self.last_call = self.last_call, None
        if op_id is not None:
            first = last[2] if last is not None and last[:2] == (op_id, batch) else whole
        else:
            first = self.dupes.split(batch)
        try:
            return (yield from self._once(batch, first, monitor, op_id))
        except redis.ResponseError as exc:
            if STALE_GENERATION not in str(exc):
                raise
            self.dupes.clear()
            if not resend:
                raise StaleDupeCache(str(exc)) from exc
            return (yield from self._once(batch, whole, monitor, None))

    def _once(self, batch: CallBatch, split: _Split, monitor: bytes,
              op_id: str | None) -> Plan:
        sent, kept, left_out = split
        op = op_id or uuid.uuid4().hex
        # (the Bloom slices only for a call that pushes: only a push reads them)
        keys = self.keys.frontier_keys(op, self.prev_op, self.worker, slices=bool(sent.pushes))
        arg, constants = call_argv(sent, self.worker, self.params, self.marker, left_out,
                                   self.dupes.gen, first=self.keep_marker and not self.marker,
                                   group_member=self.keys.crawl_id if self.keys.group else "")
        self.last_call = (op, batch, split)
        try:
            reply = yield RunScript(keys, [arg, monitor, constants])
        except redis.ResponseError as exc:
            lost = state_lost(exc, self.url)
            if lost is not None:
                raise lost from None
            raise
        result = CallResult.from_reply(reply)
        if not result.uncached:
            # (a call without events cached no reply: the previous one's stays the evidence
            # that the writes of this client's last cached call survived, lua/step_reply.lua)
            self.prev_op = op
        if self.wait_replicas and (self.wait_every_call or any(
                not p.group for p in batch.pushes)):
            acked = yield WaitReplicas(self.keys.stats, self.wait_replicas)
            if int(acked) < self.wait_replicas:
                self.unreplicated += 1
        if self.keep_marker and not self.marker:
            self.marker = result.marker
        self.dupes.learn(sent, result)
        result = expand_result(result, kept, len(batch.pushes), left_out)
        missing = needs_payloads(result)
        if missing:
            result = fill_payloads(result, (yield ReadPayloads(self.keys.data, missing)))
        return result


def drive(plan: Plan, run: Callable[[Step], Any]) -> CallResult:
    """Run *plan* to its result, each step by ``run(step)`` (blocking); an exception of a
    step is thrown into the plan, which handles it or lets it out."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(reply) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = run(step)
        except Exception as exc:  # thrown into the plan, which decides
            error = exc


async def drive_async(plan: Plan, run: Callable[[Step], Awaitable[Any]]) -> CallResult:
    """:func:`drive` for an asyncio transport (``await run(step)``)."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(reply) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply, error = None, None
        try:
            reply = await run(step)
        except Exception as exc:  # thrown into the plan, which decides
            error = exc
