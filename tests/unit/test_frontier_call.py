"""The frontier call's description (frontier/call.py) without Redis: it is IO-free, so a test
feeds each step the reply lua/frontier.lua would give and reads the steps it asks for.

tests/lua and tests/worker hold the same sequence against a real redis-server
(test_frontier_scale.py: duplicates left out, the stale generation; test_deployments.py: the
replica wait; test_marker.py: the crawl marker)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import redis

from scrapy_fleet.errors import CrawlStateLostError
from scrapy_fleet.frontier.call import (
    FrontierCall,
    ReadPayloads,
    RunScript,
    Step,
    WaitReplicas,
    drive,
    drive_async,
)
from scrapy_fleet.frontier.dupecache import STALE_GENERATION, DupeCache, StaleDupeCache
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

KEYS = CrawlKeys("fleet", "unit")


def reply(**fields: Any) -> bytes:
    """A reply of lua/frontier.lua (msgpack map, strings as raw, as cmsgpack packs them)."""
    return msgpack.packb(fields, use_bin_type=False)


#: what lua/frontier.lua reads for a field ARGV[1] leaves out (protocol.call_argv leaves out
#: those equal to it)
READ_AS = {"ld": 0, "bg": b"", "mk": b"", "a": [], "r": [], "d": [], "x": [], "s": [], "p": [],
           "u": []}


def sent(step: RunScript) -> dict[str, Any]:
    """The call's argument as lua/frontier.lua reads it: ARGV[1] of a RunScript step, decoded,
    over ARGV[3] (the constants) and the defaults of the fields it leaves out."""
    def decoded(raw: bytes) -> dict[str, Any]:
        return {k.decode(): v for k, v in msgpack.unpackb(raw, raw=True).items()}

    return {**READ_AS, **decoded(step.args[2]), **decoded(step.args[0])}


def push(url: str, group: int = 0) -> tuple[Any, ...]:
    return url.encode().ljust(12, b".")[:12], 0, b"payload " + url.encode(), group, "h"


class Script:
    """A transport that records the steps and answers them from *answers* (a reply, or an
    exception to raise), in order."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.steps: list[Step] = []

    def __call__(self, step: Step) -> Any:
        self.steps.append(step)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def calls(**options: Any) -> FrontierCall:
    return FrontierCall(KEYS, FrontierParams(), worker="w1", url="redis://127.0.0.1:1",
                        **options)


def test_one_call_is_one_script_step_and_its_reply_is_read():
    fc = calls()
    run = Script(reply(new=2, dup=0, pf=[1, 1], queued=2, size=2, bg="g1", mk="m1"))
    result = drive(fc.plan(CallBatch(pushes=[push("a"), push("b")])), run)
    assert [type(s) for s in run.steps] == [RunScript]
    step = run.steps[0]
    assert isinstance(step, RunScript)
    assert step.keys == KEYS.frontier_keys(fc.prev_op, "-", "w1")
    args = sent(step)
    assert (args["w"], args["t"], len(args["p"]), args["mk"], args["ld"]) == \
        (b"w1", 0, 2, b"", 0)
    assert (result.pushed, result.push_flags, result.queued, result.size) == (2, [1, 1], 2, 2)
    assert fc.marker == "m1"  # learnt from the first reply, required from then on


def test_each_call_names_the_previous_op_and_the_marker_it_learnt():
    fc = calls()
    run = Script(reply(mk="m1"), reply(mk="m1"))
    drive(fc.plan(CallBatch(take=1)), run)
    first_op = fc.prev_op
    drive(fc.plan(CallBatch(take=1)), run)
    second = run.steps[1]
    assert isinstance(second, RunScript)
    # (no pushes: no Bloom slices among its KEYS)
    assert second.keys == KEYS.frontier_keys(fc.prev_op, first_op, "w1", slices=False)
    assert fc.prev_op != first_op
    assert sent(second)["mk"] == b"m1"


def test_a_call_without_events_leaves_the_previous_op_named():
    # lua/step_reply.lua cached no reply (nc): the next call names the same previous op,
    # whose cache is the evidence that this client's last cached call's writes survived
    fc = calls()
    run = Script(reply(mk="m1"), reply(mk="m1", nc=1), reply(mk="m1"))
    drive(fc.plan(CallBatch(take=1)), run)
    cached_op = fc.prev_op
    result = drive(fc.plan(CallBatch(beat=True)), run)
    assert result.uncached and fc.prev_op == cached_op
    drive(fc.plan(CallBatch(beat=True)), run)
    third = run.steps[2]
    assert isinstance(third, RunScript)
    assert third.keys == KEYS.frontier_keys(fc.prev_op, cached_op, "w1", slices=False)
    assert fc.prev_op != cached_op


def test_a_command_requires_no_marker():
    fc = calls(keep_marker=False)
    run = Script(reply(mk="m1"), reply(mk="m1"))
    drive(fc.plan(CallBatch(take=1)), run)
    drive(fc.plan(CallBatch(take=1)), run)
    assert fc.marker == "" and sent(run.steps[1])["mk"] == b""  # type: ignore[arg-type]


def test_known_duplicates_are_left_out_and_the_reply_is_expanded():
    dupes = DupeCache(100)
    fc = calls(dupes=dupes)
    first = Script(reply(new=2, pf=[1, 1], bg="g1"))
    drive(fc.plan(CallBatch(pushes=[push("a"), push("b")])), first)
    assert len(dupes) == 2 and dupes.gen == "g1"
    run = Script(reply(new=1, dup=0, pf=[1], bg="g1"))
    result = drive(fc.plan(CallBatch(pushes=[push("a"), push("c"), push("b")])), run)
    args = sent(run.steps[0])  # type: ignore[arg-type]
    assert [p[0] for p in args["p"]] == [push("c")[0]]
    assert (args["ld"], args["bg"]) == (2, b"g1")
    assert result.push_flags == [0, 1, 0] and result.seen == [0, 2]
    assert (result.pushed, result.duplicates, result.cached) == (1, 2, 2)


def test_a_stale_generation_clears_the_cache_and_sends_the_whole_call_again():
    dupes = DupeCache(100)
    fc = calls(dupes=dupes)
    drive(fc.plan(CallBatch(pushes=[push("a")])), Script(reply(new=1, pf=[1], bg="g1")))
    run = Script(redis.ResponseError(f"fleet: {STALE_GENERATION} g1"),
                 reply(new=0, dup=2, pf=[0, 1], pd=[0], bg="g2"))
    result = drive(fc.plan(CallBatch(pushes=[push("a"), push("d")])), run)
    assert [type(s) for s in run.steps] == [RunScript, RunScript]
    refused, again = run.steps
    assert isinstance(refused, RunScript) and isinstance(again, RunScript)
    assert len(sent(refused)["p"]) == 1 and sent(refused)["ld"] == 1
    assert len(sent(again)["p"]) == 2 and (sent(again)["ld"], sent(again)["bg"]) == (0, b"")
    assert KEYS.op(fc.prev_op) in again.keys and KEYS.op(fc.prev_op) not in refused.keys
    assert result.push_flags == [0, 1] and result.cached == 0
    assert dupes.gen == "g2" and push("d")[0] in dupes and push("a")[0] in dupes


def test_a_stale_generation_without_resend_raises_and_changes_nothing():
    dupes = DupeCache(100)
    fc = calls(dupes=dupes)
    drive(fc.plan(CallBatch(pushes=[push("a")])), Script(reply(new=1, pf=[1], bg="g1")))
    prev = fc.prev_op
    run = Script(redis.ResponseError(f"fleet: {STALE_GENERATION} g1"))
    with pytest.raises(StaleDupeCache):
        drive(fc.plan(CallBatch(pushes=[push("a")]), resend=False), run)
    assert len(run.steps) == 1 and len(dupes) == 0 and dupes.gen is None
    assert fc.prev_op == prev  # the refused call wrote nothing: no reply cache to drop


def test_an_op_id_given_sends_the_call_whole_under_that_id():
    dupes = DupeCache(100)
    fc = calls(dupes=dupes)
    drive(fc.plan(CallBatch(pushes=[push("a")])), Script(reply(new=1, pf=[1], bg="g1")))
    prev = fc.prev_op
    run = Script(reply(new=0, dup=1, pf=[0], pd=[0], bg="g1"))
    drive(fc.plan(CallBatch(pushes=[push("a")]), op_id="replay-1"), run)
    step = run.steps[0]
    assert isinstance(step, RunScript)
    assert step.keys == KEYS.frontier_keys("replay-1", prev, "w1")
    assert len(sent(step)["p"]) == 1 and sent(step)["ld"] == 0
    assert fc.prev_op == "replay-1"


def test_other_script_errors_pass_through_and_a_lost_marker_is_named():
    fc = calls()
    with pytest.raises(redis.ResponseError, match="something else"):
        drive(fc.plan(CallBatch(take=1)), Script(redis.ResponseError("something else")))
    lost = Script(redis.ResponseError("fleet: crawl state lost: the marker is gone"))
    with pytest.raises(CrawlStateLostError, match="the marker is gone") as info:
        drive(fc.plan(CallBatch(take=1)), lost)
    assert "127.0.0.1:1" in str(info.value)
    assert fc.prev_op == "-"  # neither call ran


def test_a_worker_waits_for_replicas_after_start_requests_only():
    fc = calls(wait_replicas=2)
    links = Script(reply(new=1, pf=[1]))
    drive(fc.plan(CallBatch(pushes=[push("a", group=1)])), links)
    assert [type(s) for s in links.steps] == [RunScript]
    starts = Script(reply(new=1, pf=[1]), 1)
    drive(fc.plan(CallBatch(pushes=[push("b", group=0)])), starts)
    assert starts.steps[1] == WaitReplicas(KEYS.stats, 2)
    assert fc.unreplicated == 1  # one replica of two acknowledged
    enough = Script(reply(new=1, pf=[1]), 2)
    drive(fc.plan(CallBatch(pushes=[push("c")])), enough)
    assert len(enough.steps) == 2 and fc.unreplicated == 1


def test_a_command_waits_after_every_call():
    fc = calls(wait_replicas=1, wait_every_call=True, keep_marker=False)
    run = Script(reply(), 0)
    drive(fc.plan(CallBatch(take=1)), run)
    assert run.steps[1] == WaitReplicas(KEYS.stats, 1) and fc.unreplicated == 1


def test_payloads_a_replayed_reply_left_out_are_read_in_one_step():
    fc = calls()
    leased = [["e1", 7, b"", 0], ["e2", 8, b"kept", 1], ["e3", 9, b"", 2]]
    run = Script(reply(leased=leased), [b"one", None])
    result = drive(fc.plan(CallBatch(take=3)), run)
    assert run.steps[1] == ReadPayloads(KEYS.data, ["e1", "e3"])
    assert [(e.entry_id, e.token, e.payload, e.expiries) for e in result.leased] == [
        ("e1", 7, b"one", 0), ("e2", 8, b"kept", 1), ("e3", 9, b"", 2)]


def test_the_async_transport_runs_the_same_plan():
    fc = calls(wait_replicas=1)
    run = Script(redis.ResponseError(f"fleet: {STALE_GENERATION} x"),
                 reply(new=1, pf=[1], leased=[["e1", 1, b"", 0]]), 1, [b"p1"])

    async def arun(step: Step) -> Any:
        return run(step)

    result = asyncio.run(drive_async(fc.plan(CallBatch(pushes=[push("a")], take=1)), arun))
    assert [type(s) for s in run.steps] == [RunScript, RunScript, WaitReplicas, ReadPayloads]
    assert isinstance(result, CallResult) and result.leased[0].payload == b"p1"
    assert fc.unreplicated == 0
