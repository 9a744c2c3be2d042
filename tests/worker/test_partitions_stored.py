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

import redis
from support import hosts_in_partition, push_row

from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, LeasedEntry
from scrapy_fleet.keys import STAGE_HOST, CrawlKeys, partition_of

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
    host = hosts_in_partition(PAGE_P, PARTS)[0]
    c = redis.Redis.from_url(redis_url)

    async def main():
        a, b = fetcher("a", redis_url), fetcher("b", redis_url)
        try:
            await a.call(CallBatch(pushes=[push_row(host, b"page")]))
            (first,) = (await a.call(CallBatch(take=1))).leased
            again = await lease_again(b)  # (a stalls: its lease expires)
            assert again.entry_id == first.entry_id and again.token != first.token
            r = await b.call(CallBatch(acks=[(again.entry_id, again.token)],
                                       pushes=[stored_row(b"by b", 1)]))
            assert r.acked == 1 and r.lost == []
            assert await parse_all(redis_url) == [b"by b"]
            r = await a.call(CallBatch(acks=[(first.entry_id, first.token)],
                                       pushes=[stored_row(b"by a", 1)]))
            assert r.acked == 0 and r.lost == [first.entry_id]
            assert await parse_all(redis_url) == []  # nothing to parse twice
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())
    assert stage_state(c) == (0, 1)


def test_the_first_stored_response_of_a_page_is_kept_and_its_second_fetch_acknowledged(
        redis_url):
    """Worker a stalls past its lease and wakes while b holds the page again: a's stored
    response gets in, its acknowledgement is refused; b's stored response of the same page is
    then dropped, and b's acknowledgement goes through: one stored response, a's."""
    host = hosts_in_partition(PAGE_P, PARTS)[0]
    c = redis.Redis.from_url(redis_url)

    async def main():
        a, b = fetcher("a", redis_url), fetcher("b", redis_url)
        try:
            await a.call(CallBatch(pushes=[push_row(host, b"page")]))
            (first,) = (await a.call(CallBatch(take=1))).leased
            again = await lease_again(b)
            r = await a.call(CallBatch(acks=[(first.entry_id, first.token)],
                                       pushes=[stored_row(b"by a", 1)]))
            assert r.acked == 0 and r.lost == [first.entry_id]
            r = await b.call(CallBatch(acks=[(again.entry_id, again.token)],
                                       pushes=[stored_row(b"by b", 1)]))
            assert r.acked == 1 and r.lost == [] and r.refused == []
        finally:
            await a.close()
            await b.close()
    asyncio.run(main())
    assert stage_state(c) == (1, 1)
    assert asyncio.run(parse_all(redis_url)) == [b"by a"]
    assert stage_state(c) == (0, 1)


def test_a_fetch_worker_dead_between_its_stored_response_and_its_ack_loses_nothing(
        redis_server, redis_url):
    """Worker a's stored response reaches its partition but the page's partition does not
    answer (an ACL without its keys), and a dies there.  Its lease expires, b fetches the
    page again: b's acknowledgement goes through, a's stored response is the one parsed,
    once."""
    from scrapy_fleet import acl

    host = hosts_in_partition(PAGE_P, PARTS)[0]
    admin = redis_server.client()
    rule = acl.acl_rule("worker", crawl_id="ps")
    admin.execute_command("ACL", "SETUSER", "half", "reset", "on", ">pw", *rule.split(),
                          f"~{KEYS.partition(STAGE_P, PARTS).base}:*")
    half = f"redis://half:pw@127.0.0.1:{redis_server.port}/0"
    c = redis.Redis.from_url(redis_url)

    async def main():
        a, dying, b = fetcher("a", redis_url), fetcher("a", half), fetcher("b", redis_url)
        try:
            await a.call(CallBatch(pushes=[push_row(host, b"page")]))
            (first,) = (await a.call(CallBatch(take=1))).leased
            r = await dying.call(CallBatch(acks=[(first.entry_id, first.token)],
                                           pushes=[stored_row(b"by a", 1)]))
            assert r.acked == 0 and dying.held == 1  # pushed; the ack waits ... and a dies
            assert stage_state(c) == (1, 0)
            again = await lease_again(b)
            r = await b.call(CallBatch(acks=[(again.entry_id, again.token)],
                                       pushes=[stored_row(b"by b", 1)]))
            assert r.acked == 1 and r.refused == []
        finally:
            for fr in (a, dying, b):
                await fr.close()
    try:
        asyncio.run(main())
    finally:
        admin.execute_command("ACL", "DELUSER", "half")
    assert stage_state(c) == (1, 1)
    assert asyncio.run(parse_all(redis_url)) == [b"by a"]
