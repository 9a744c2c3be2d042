"""Stored responses (FLEET_ROLE, docs/stages.md) of a partitioned crawl (FLEET_PARTITIONS > 1,
docs/partitions.md) whose fetch worker stalls past its lease or dies between pushing its
stored response and acknowledging its page: each page's response is queued once for the
parse workers, and none is lost.

A page of partition p and the stored responses' partition s: the stored response goes to s
by a lean push *before* the page's acknowledgement (push before ack), so two fetches of one
page (the first worker's lease lost meanwhile) would queue two stored responses and the page
would be parsed twice.  PartitionedFrontier objects stand for the workers, against a real
Redis server, with a lease timeout of 1 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import redis
from support import hosts_in_partition, partition_user, push_row

from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams, LeasedEntry
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.keys.partition import partition_of

KEYS = CrawlKeys("fleet", "ps")
PARTS = 4
STAGE_P = partition_of(STAGE_HOST, PARTS)
#: a partition of pages, not the stored responses'
PAGE_P = next(p for p in range(PARTS) if p != STAGE_P)
#: a fetch worker's (FLEET_ROLE = "fetch": it never leases a stored response)
PARAMS = FrontierParams(lease_timeout=1.0, lease_except_host=STAGE_HOST)


def stored_row(body: bytes, group: int) -> tuple[bytes, int, bytes, int, str]:
    """The push of a stored response as LeaseBook.attach_stored buffers it (no Bloom key,
    host ``~parse``), acknowledgement group *group*."""
    return (b"", 0, body, group, STAGE_HOST)


def fetcher(name: str, url: str) -> PartitionedFrontier:
    fr = PartitionedFrontier(url, KEYS, name, PARAMS, PARTS)
    fr.home = PAGE_P
    return fr


async def lease_again(fr: PartitionedFrontier) -> LeasedEntry:
    """The page, leased by *fr* once the lease of the stalled worker expired."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = (await fr.call(CallBatch(take=1))).leased
        if got:
            return got[0]
        await asyncio.sleep(0.1)
    raise AssertionError("the page was not leased again")


def after_a_stall(redis_url: str, steps: Callable[..., Awaitable[None]]) -> None:
    """A page leased by fetch worker a, then, once a's lease expired (a stalls), by b; then
    ``steps(a, b, a's lease, b's lease)``."""
    host = hosts_in_partition(PAGE_P, PARTS)[0]

    async def main() -> None:
        a, b = fetcher("a", redis_url), fetcher("b", redis_url)
        try:
            await a.call(CallBatch(pushes=[push_row(host, b"page")]))
            (first,) = (await a.call(CallBatch(take=1))).leased
            await steps(a, b, first, await lease_again(b))
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())


async def store(fr: PartitionedFrontier, page: LeasedEntry, body: bytes) -> CallResult:
    """*fr*'s call that stores *page*'s response and acknowledges it."""
    return await fr.call(CallBatch(acks=[(page.entry_id, page.token)],
                                   pushes=[stored_row(body, 1)]))


async def parse_all(url: str) -> list[bytes]:
    """What a parse worker gets from the stored responses' partition (each acknowledged)."""
    fr = PartitionedFrontier(url, KEYS, "parse", FrontierParams(lease_only_host=STAGE_HOST),
                             PARTS)
    try:
        got = (await fr.call(CallBatch(take=10))).leased
        if got:
            r = await fr.call(CallBatch(acks=[(e.entry_id, e.token) for e in got]))
            assert r.acked == len(got)
        return [e.payload for e in got]
    finally:
        await fr.close()


def stage_state(c: redis.Redis) -> tuple[int, int]:
    """(stored responses waiting in their partition, the page's partition's acks)."""
    s, p = KEYS.partition(STAGE_P, PARTS), KEYS.partition(PAGE_P, PARTS)
    return int(c.hget(s.hostq, STAGE_HOST) or 0), int(c.hget(p.stats, "acked") or 0)


def test_a_stalled_fetch_workers_late_stored_response_is_not_parsed_again(redis_url):
    """Worker a stalls past its lease with the page fetched; worker b leases it again, stores
    it and acknowledges it, and a parse worker parses it; then a wakes: its stored response
    reaches the partition, its acknowledgement is refused.  The page is parsed once."""
    async def steps(a, b, first, again):
        assert again.entry_id == first.entry_id and again.token != first.token
        r = await store(b, again, b"by b")
        assert r.acked == 1 and r.lost == []
        assert await parse_all(redis_url) == [b"by b"]
        r = await store(a, first, b"by a")
        assert r.acked == 0 and r.lost == [first.entry_id]
        assert await parse_all(redis_url) == []  # nothing to parse twice
    after_a_stall(redis_url, steps)
    assert stage_state(redis.Redis.from_url(redis_url)) == (0, 1)


def test_the_first_stored_response_of_a_page_is_kept_and_its_second_fetch_acknowledged(
        redis_url):
    """Worker a stalls past its lease and wakes while b holds the page again: a's stored
    response gets in, its acknowledgement is refused; b's stored response of the same page is
    then dropped, and b's acknowledgement goes through: one stored response, a's."""
    async def steps(a, b, first, again):
        r = await store(a, first, b"by a")
        assert r.acked == 0 and r.lost == [first.entry_id]
        r = await store(b, again, b"by b")
        assert r.acked == 1 and r.lost == [] and r.refused == []
    after_a_stall(redis_url, steps)
    c = redis.Redis.from_url(redis_url)
    assert stage_state(c) == (1, 1)
    assert asyncio.run(parse_all(redis_url)) == [b"by a"]
    assert stage_state(c) == (0, 1)


def test_a_fetch_worker_dead_between_its_stored_response_and_its_ack_loses_nothing(
        redis_server, redis_url):
    """Worker a's stored response reaches its partition but the page's partition does not
    answer (an ACL without its keys), and a dies there.  Its lease expires, b fetches the
    page again: b's acknowledgement goes through, a's stored response is the one parsed,
    once."""
    host = hosts_in_partition(PAGE_P, PARTS)[0]
    c = redis.Redis.from_url(redis_url)

    async def main(half: str):
        a, dying, b = fetcher("a", redis_url), fetcher("a", half), fetcher("b", redis_url)
        try:
            await a.call(CallBatch(pushes=[push_row(host, b"page")]))
            (first,) = (await a.call(CallBatch(take=1))).leased
            r = await store(dying, first, b"by a")
            assert r.acked == 0 and dying.held == 1  # pushed; the ack waits ... and a dies
            assert stage_state(c) == (1, 0)
            again = await lease_again(b)
            r = await store(b, again, b"by b")
            assert r.acked == 1 and r.refused == []
        finally:
            for fr in (a, dying, b):
                await fr.close()
    with partition_user(redis_server, "ps", KEYS.partition(STAGE_P, PARTS).base) as (half, _):
        asyncio.run(main(half))
    assert stage_state(c) == (1, 1)
    assert asyncio.run(parse_all(redis_url)) == [b"by a"]
