"""The frontier's contract, at P = 1 and at P = 3 (issue 33): the same cases run against a
one-partition crawl (:class:`~scrapy_fleet.frontier.client.AsyncFrontier`) and a
three-partition crawl (:class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier`), the
two clients the scheduler picks between (frontier/scheduler.py), against a real redis-server.

Each case: lease, acknowledge (with the worker's counter deltas), lose a lease (fencing),
replay a call whose reply was lost, an outage of Redis (of one partition at P = 3), back
pressure (a bounded frontier), and the exact counters and status the monitoring snapshot
reports (docs/monitoring.md: ``counters.pages``, ``counters.requests.acked``,
``frontier.seen`` equal what was acknowledged and pushed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from support import ReplyEater, hosts_in_partition, monitor_payload, push_row

from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams, LeasedEntry
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import merge
from scrapy_fleet.monitoring.snapshot import read_snapshot

CRAWL = "contract"
KEYS = CrawlKeys("fleet", CRAWL)
PER_PARTITION = 3  #: hosts per partition of P = 3 (the same 9 hosts at P = 1)

pytestmark = pytest.mark.parametrize("parts", [1, 3])


def _hosts() -> list[str]:
    return [h for p in range(3) for h in hosts_in_partition(p, 3, PER_PARTITION)]


def _frontier(url: str, parts: int, params: FrontierParams | None = None,
              worker: str = "w") -> Any:
    """The worker-side client the scheduler builds for *parts* (retries 1, a short timeout:
    an outage shows at once)."""
    params = params or FrontierParams()
    if parts > 1:
        return PartitionedFrontier(url, KEYS, worker, params, parts, timeout=2, retries=1)
    return AsyncFrontier(url, KEYS, worker, params, timeout=2, retries=1)


def _status(url: str, parts: int) -> dict[str, Any]:
    """The crawl's schema-2 snapshot: the merge of the partitions' at P > 1."""
    client = redis.Redis.from_url(url)
    try:
        if parts > 1:
            return merge.read_merged(client, KEYS, parts)
        return read_snapshot(client, KEYS)
    finally:
        client.close()


async def _lease_all(fr: Any, n: int) -> list[LeasedEntry]:
    """Lease until *n* entries are held (the partitioned client's picker asks the home first
    and learns where the work is): at most 30 calls."""
    got: list[LeasedEntry] = []
    for _ in range(30):
        got += (await fr.call(CallBatch(take=n - len(got)))).leased
        if len(got) >= n:
            break
    assert len(got) == n
    return got


def _acks(entries: list[LeasedEntry]) -> list[tuple[str, int]]:
    return [(e.entry_id, e.token) for e in entries]


async def _acknowledge(fr: Any, batch: CallBatch, monitor: bytes = b"") -> CallResult:
    """One call of *batch*, then calls with nothing new until no part waits in the client
    (a partitioned client holds or keeps parts for later calls): the first reply."""
    first = await fr.call(batch, monitor)
    for _ in range(10):
        if not getattr(fr, "waiting_work", False):
            break
        await asyncio.sleep(0.2)
        await fr.call(CallBatch(beat=True))
    assert not getattr(fr, "waiting_work", False)
    return first


def test_lease_acknowledge_and_exact_counters(redis_url: str, parts: int) -> None:
    hosts = _hosts()

    async def main() -> None:
        fr = _frontier(redis_url, parts)
        try:
            await fr.connect()
            r = await fr.call(CallBatch(pushes=[push_row(h) for h in hosts]))
            assert r.push_flags == [1] * len(hosts) and r.refused == []
            # a second push of the same rows: duplicates, in their partition's filter
            again = await fr.call(CallBatch(pushes=[push_row(h) for h in hosts[:2]]))
            assert again.pushed == 2  # (other Bloom keys: new entries, as the pump sends)
            leased = await _lease_all(fr, len(hosts) + 2)
            assert sorted(e.payload for e in leased) == sorted(
                [h.encode() for h in hosts] + [h.encode() for h in hosts[:2]])
            monitor = monitor_payload(cs=1, counters={"pages": len(leased)})
            r = await _acknowledge(fr, CallBatch(acks=_acks(leased)), monitor)
            assert r.acked == len(leased)
        finally:
            await fr.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    assert status["counters"]["requests"]["acked"] == len(hosts) + 2
    assert status["counters"]["pages"] == len(hosts) + 2
    assert status["frontier"]["seen"] == len(hosts) + 2
    assert status["frontier"]["due"] == 0 and status["frontier"]["leased"] == 0
    if parts > 1:
        assert [row["acked"] for row in status["per_partition"]] == [
            PER_PARTITION + sum(1 for h in hosts[:2] if h in hosts_in_partition(
                p, 3, PER_PARTITION)) for p in range(3)]


def test_a_lost_lease_is_fenced(redis_url: str, parts: int) -> None:
    """An acknowledgement with a stale token is refused and named lost; the entry stays
    leased to its holder (the right token), counted once when that one acknowledges."""
    hosts = _hosts()[:1] + _hosts()[-1:]

    async def main() -> None:
        fr = _frontier(redis_url, parts)
        try:
            await fr.connect()
            await fr.call(CallBatch(pushes=[push_row(h) for h in hosts]))
            leased = await _lease_all(fr, 2)
            stale = [(e.entry_id, e.token + 1) for e in leased]
            r = await _acknowledge(fr, CallBatch(acks=stale))
            assert sorted(r.lost) == sorted(e.entry_id for e in leased)
            assert _status(redis_url, parts)["frontier"]["leased"] == 2
            await _acknowledge(fr, CallBatch(acks=_acks(leased)))
        finally:
            await fr.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    assert status["counters"]["requests"]["acked"] == 2
    assert status["frontier"]["leased"] == 0
    assert status["counters"]["requests"]["stale_acks"] == 2


def test_an_expired_lease_goes_to_another_worker_and_its_old_holder_is_fenced(
        redis_url: str, parts: int, lua_clock: Any) -> None:
    """Leases of 60 s run out (on the Lua steps' test clock): another worker leases the same
    entries again (reclaimed); the first holder's acknowledgements are named lost, the new
    holder's count once each."""
    hosts = _hosts()
    params = FrontierParams(lease_timeout=60)

    async def main() -> None:
        first = _frontier(redis_url, parts, params)
        second = _frontier(redis_url, parts, params, worker="w2")
        try:
            await first.connect()
            await second.connect()
            await first.call(CallBatch(pushes=[push_row(h) for h in hosts]))
            old = await _lease_all(first, len(hosts))
            lua_clock(61)
            new = await _lease_all(second, len(hosts))
            assert sorted(e.payload for e in new) == sorted(e.payload for e in old)
            r = await _acknowledge(first, CallBatch(acks=_acks(old)))
            assert sorted(r.lost) == sorted(e.entry_id for e in old) and r.acked == 0
            r = await _acknowledge(second, CallBatch(acks=_acks(new)))
            assert r.acked == len(hosts) and r.lost == []
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    requests = status["counters"]["requests"]
    assert (requests["acked"], requests["reclaimed"]) == (len(hosts), len(hosts))
    assert requests["stale_acks"] == len(hosts) and status["frontier"]["leased"] == 0


def _eater(redis_url: str, parts: int) -> ReplyEater:
    """A proxy in front of Redis; at P = 3 it acts on the last partition's calls alone."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    only = KEYS.partition(2, 3).base.encode() if parts > 1 else None
    return ReplyEater(port, only=only)


@pytest.mark.parametrize("mode", ["eat", "down"])
def test_a_call_without_reply_is_sent_again_and_counts_once(redis_url: str, parts: int,
                                                             mode: str) -> None:
    """The call acknowledging every lease (with counter deltas) gets no reply: it ran and its
    reply was lost ("eat"), or Redis (the last partition at P = 3) was unreachable ("down").
    Sent again once Redis answers (P = 1: the pump's resend, same op id; P = 3: the client
    keeps the part as sent), every page is acknowledged once, its deltas counted once."""
    hosts = _hosts()

    async def main() -> None:
        proxy = _eater(redis_url, parts)
        await proxy.start()
        fr = _frontier(proxy.url, parts)
        try:
            await fr.connect()
            await fr.call(CallBatch(pushes=[push_row(h) for h in hosts]))
            leased = await _lease_all(fr, len(hosts))
            batch = CallBatch(acks=_acks(leased))
            monitor = monitor_payload(cs=1, counters={"pages": len(hosts)})
            proxy.mode = mode
            if parts == 1:
                with pytest.raises(RedisUnavailableError):
                    await fr.call(batch, monitor)
                op = fr.last_op
                proxy.mode = "pass"
                r = await fr.call(batch, monitor, op_id=op)  # the pump's resend
                assert (r.acked, r.lost) == (len(hosts), [])
            else:
                r = await fr.call(batch, monitor)  # the other partitions answer
                assert fr.waiting_work  # the last partition's part is kept
                proxy.mode = "pass"
                await _acknowledge(fr, CallBatch(beat=True), monitor)
            assert proxy.eaten == (1 if mode == "eat" else 0)
        finally:
            await fr.close()
            await proxy.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    assert status["counters"]["requests"]["acked"] == len(hosts)
    assert status["frontier"]["leased"] == 0 and status["frontier"]["due"] == 0
    assert status["counters"]["pages"] == len(hosts)


def test_a_bounded_frontier_refuses_what_is_over_its_bound(redis_url: str,
                                                           parts: int) -> None:
    """FLEET_QUEUE_MAX = 6 (2 per partition at P = 3): of 9 requests without a parent, 3
    per partition at P = 3, 6 get in and 3 are refused (named by index, not lost: the pump
    keeps them); once leased and acknowledged, room again."""
    hosts = _hosts()
    params = FrontierParams(queue_max=6)

    async def main() -> None:
        fr = _frontier(redis_url, parts, params)
        try:
            await fr.connect()
            rows = [push_row(h) for h in hosts]
            r = await fr.call(CallBatch(pushes=rows))
            assert len(r.refused) == 3 and sum(r.push_flags) == 6
            assert all(r.push_flags[i] == 0 for i in r.refused)
            leased = await _lease_all(fr, 6)
            await _acknowledge(fr, CallBatch(acks=_acks(leased)))
            again = await fr.call(CallBatch(pushes=[rows[i] for i in r.refused]))
            assert again.refused == [] and sum(again.push_flags) == 3
        finally:
            await fr.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    assert status["frontier"]["due"] == 3
    assert status["counters"]["requests"]["acked"] == 6


def test_status_counts_every_state(redis_url: str, parts: int) -> None:
    """queued, leased, acknowledged: the snapshot's counts are the sums of the frontier's
    states, whatever P."""
    hosts = _hosts()

    async def main() -> None:
        fr = _frontier(redis_url, parts)
        try:
            await fr.connect()
            await fr.call(CallBatch(pushes=[push_row(h) for h in hosts]))
            leased = await _lease_all(fr, 4)
            await _acknowledge(fr, CallBatch(acks=_acks(leased[:1])))
        finally:
            await fr.close()

    asyncio.run(main())
    status = _status(redis_url, parts)
    f = status["frontier"]
    assert (f["due"], f["leased"], status["counters"]["requests"]["acked"]) == (5, 3, 1)
    assert f["seen"] == len(hosts)
    assert status.get("partitions", 1) == parts
