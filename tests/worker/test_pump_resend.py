"""A frontier call that failed without a reply (Redis unreachable through its retries) is sent
again as it was, with its op id, before the pump builds a new batch (frontier/pump.py,
frontier/sent.py), against a real redis-server behind a TCP proxy of the test's.

The proxy forwards the call to Redis and, once told, drops Redis's reply with the connection
(the call ran, the worker never learns it), then closes every connection at once: the call's
retries run out (RedisUnavailableError).  Before, the pump's next call was a new batch with a
new op id: the failed call's acknowledgements came back "lost after a Redis outage" and the
leases it granted sat in Redis, unseen, until FLEET_LEASE_TIMEOUT (an e2e run of
test_redis_gone_for_30_s_is_logged_once_and_the_crawl_loses_nothing waited out its 120 s
lease timeout for one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from scrapy import Spider
from support import ReplyEater, idle_scheduler, link_entry

from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

CRAWL = "resend"
URLS = [f"http://h{n}.test/page" for n in range(8)]
PAGES = 3  # responses counted by the worker before the failed call (its counter deltas)


class _Spider(Spider):
    name = CRAWL


def _setup(redis_url: str) -> tuple[Any, FrontierAdmin]:
    return idle_scheduler(redis_url, _Spider(), URLS, {"FLEET_REDIS_RETRIES": 1})


def _redis_leases(admin: FrontierAdmin) -> set[str]:
    return {m.decode() for m in admin.client.zrange(admin.keys.leases, 0, -1)}


def _stat(admin: FrontierAdmin, name: str) -> int:
    return int(admin.client.hget(admin.keys.stats, name) or 0)


async def _fail_once(sched: Any, admin: FrontierAdmin, proxy: ReplyEater,
                     mode: str) -> tuple[AsyncFrontier, list[str], str]:
    """Lease the first pages, finish them, then make the call acknowledging them (and leasing
    more) fail through the proxy in *mode*; returns the frontier, the acknowledged entry ids
    and the failed call's op id."""
    pump, book = sched.pump, sched.book
    frontier = AsyncFrontier(proxy.url, CrawlKeys("fleet", CRAWL), "w",
                             sched.config.frontier_params(), timeout=2, retries=1)
    pump.frontier = frontier
    await pump.call()
    requests = [book.take() for _ in range(len(book.prefetch))]
    assert len(requests) == 2 and all(r is not None for r in requests)
    acked = [book.inflight[id(r)][1].entry_id for r in requests]
    for r in requests:
        book.finished(r)  # done: acknowledged at the next call, which leases 2 more
    sched.crawler.stats.set_value("downloader/response_status_count/200", PAGES)
    proxy.mode = mode
    with pytest.raises(RedisUnavailableError):
        await pump.call()
    assert frontier.last_op is not None
    proxy.mode = "pass"
    return frontier, acked, frontier.last_op


@contextlib.asynccontextmanager
async def _failed_call(sched: Any, admin: FrontierAdmin, redis_url: str, mode: str
                       ) -> AsyncIterator[tuple[ReplyEater, AsyncFrontier, list[str], str]]:
    """:func:`_fail_once` through a :class:`ReplyEater` in front of *redis_url* in *mode*:
    (the proxy, the frontier, the acknowledged entry ids, the failed call's op id); the
    proxy and the frontier are closed after."""
    proxy = ReplyEater(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    await proxy.start()
    frontier = None
    try:
        frontier, acked, op = await _fail_once(sched, admin, proxy, mode)
        yield proxy, frontier, acked, op
    finally:
        await proxy.close()
        if frontier is not None:
            await frontier.close()


def test_a_call_that_ran_without_a_reply_is_sent_again_and_its_leases_reach_the_worker(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    sched, admin = _setup(redis_url)
    pump, book = sched.pump, sched.book

    async def main() -> None:
        async with _failed_call(sched, admin, redis_url, "eat") as (
                proxy, frontier, acked, op):
            # the call ran: its pages acknowledged, two more leased to a worker that never
            # saw them, its counter deltas applied
            assert proxy.eaten == 1
            assert _stat(admin, "acked") == 2 and _stat(admin, "pages") == PAGES
            granted = _redis_leases(admin)
            assert len(granted) == 2 and not granted & set(acked)
            result = await pump.call()  # sent again: its cached reply
            assert result is not None and (result.acked, result.lost) == (2, [])
            assert {lease.entry_id for _, lease in book.prefetch} == granted
            assert frontier.last_op == op
            book.finished(book.take())
            assert await pump.call() is not None  # and the next call is a new one
            assert frontier.last_op != op

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet"):
        asyncio.run(main())
    assert _stat(admin, "acked") == 3 and _stat(admin, "leased") == 5  # (each once)
    assert _stat(admin, "pages") == PAGES  # the deltas counted once, confirmed
    stats = sched.crawler.stats
    assert stats.get_value("fleet/frontier/acked") == 3
    assert stats.get_value("fleet/frontier/leased") == 5
    assert stats.get_value("fleet/frontier/lease_lost") is None  # (before: 2, "outage")
    assert not [r for r in caplog.records if "lost" in r.getMessage()]
    admin.close()


def test_a_call_that_did_not_run_runs_when_sent_again(redis_url: str) -> None:
    sched, admin = _setup(redis_url)
    pump, book = sched.pump, sched.book

    async def main() -> None:
        async with _failed_call(sched, admin, redis_url, "down") as (
                _proxy, frontier, acked, op):
            # it did not run: its pages still leased, nothing more leased
            assert _stat(admin, "acked") == 0 and _redis_leases(admin) == set(acked)
            result = await pump.call()
            assert result is not None and frontier.last_op == op
            assert (result.acked, result.lost, len(result.leased)) == (2, [], 2)
            assert {lease.entry_id for _, lease in book.prefetch} == _redis_leases(admin)

    asyncio.run(main())
    assert _stat(admin, "acked") == 2 and _stat(admin, "pages") == PAGES
    admin.close()


def test_the_final_call_sends_the_failed_call_first_then_releases_its_leases(
        redis_url: str) -> None:
    sched, admin = _setup(redis_url)
    pump, book = sched.pump, sched.book

    async def main() -> None:
        async with _failed_call(sched, admin, redis_url, "eat") as (
                _proxy, frontier, _, op):
            assert len(_redis_leases(admin)) == 2
            book.closing = True
            await pump.call(final=True)
            assert frontier.last_op != op  # (the final call came after it)

    asyncio.run(main())
    # nothing left leased: the failed call's two leases reached the worker and went back
    assert _redis_leases(admin) == set()
    assert _stat(admin, "acked") == 2 and _stat(admin, "released") == 2
    assert admin.status()["queued"] == len(URLS) - 2
    admin.close()


def test_a_call_sent_again_after_its_reply_cache_expired_runs_again(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reply cache lasts FleetParams.op_ttl (300 s): a call sent again after it runs
    again; its acknowledgements come back lost (after the outage: said so), and the leases
    the first run granted wait for FLEET_LEASE_TIMEOUT, as before."""
    sched, admin = _setup(redis_url)
    pump = sched.pump

    async def main() -> None:
        async with _failed_call(sched, admin, redis_url, "eat") as (
                _proxy, _frontier, acked, op):
            assert admin.client.delete(admin.keys.op(op)) == 1  # (as if expired)
            result = await pump.call()
            assert result is not None and sorted(result.lost) == sorted(acked)

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet"):
        asyncio.run(main())
    assert _stat(admin, "acked") == 2 and _stat(admin, "pages") == PAGES
    assert sched.crawler.stats.get_value("fleet/frontier/lease_lost/outage") == 2
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1 and "after a Redis outage" in lost[0]
    admin.close()


def test_a_call_sent_again_leaves_out_the_known_duplicates_it_left_out(
        redis_url: str) -> None:
    """The worker's cache of known duplicates left links out of the failed call; its cached
    reply counts them left out: the call is sent again as it was (not whole), and the reply
    reads right (a flag per push, the left-out ones duplicates)."""
    admin = FrontierAdmin(redis_url, CRAWL)
    links = [link_entry(f"http://h.test/{n}") for n in range(4)]

    async def main() -> list[Any]:
        proxy = ReplyEater(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
        await proxy.start()
        frontier = AsyncFrontier(proxy.url, CrawlKeys("fleet", CRAWL), "w", FrontierParams(),
                                 timeout=2, retries=1, dupe_cache=100)
        try:
            first = await frontier.call(CallBatch(pushes=links[:2]))
            batch = CallBatch(pushes=links)  # 0 and 1 known: left out
            proxy.mode = "eat"
            with pytest.raises(RedisUnavailableError):
                await frontier.call(batch)
            op = frontier.last_op
            assert proxy.eaten == 1 and op is not None
            proxy.mode = "pass"
            again = await frontier.call(batch, op_id=op)
            return [first.push_flags, again.push_flags, again.pushed, again.duplicates,
                    again.cached, frontier.dupes.hits]
        finally:
            await proxy.close()
            await frontier.close()

    first, flags, pushed, duplicates, cached, hits = asyncio.run(main())
    assert first == [1, 1]
    assert (flags, pushed, duplicates, cached) == ([0, 0, 1, 1], 2, 2, 2)
    assert hits == 2  # (left out when the call was built; sent again as it was)
    assert _stat(admin, "pushed") == 4 and admin.status()["queued"] == 4  # each once
    admin.close()


def test_a_call_without_events_sent_again_runs_again(redis_url: str) -> None:
    """A call without events caches no reply (lua/step_reply.lua ``nc``): sent again with its
    op id, it runs again, which is safe, and the client keeps naming its last cached call."""
    admin = FrontierAdmin(redis_url, CRAWL)

    async def main() -> tuple[bool, str, str, bool]:
        proxy = ReplyEater(int(redis_url.rsplit(":", 1)[1].split("/")[0]))
        await proxy.start()
        frontier = AsyncFrontier(proxy.url, CrawlKeys("fleet", CRAWL), "w", FrontierParams(),
                                 timeout=2, retries=1)
        try:
            await frontier.call(CallBatch(pushes=[link_entry("http://h.test/a")]))
            prev = frontier.calls.prev_op
            batch = CallBatch(beat=True)
            proxy.mode = "eat"
            with pytest.raises(RedisUnavailableError):
                await frontier.call(batch)
            op = frontier.last_op
            assert proxy.eaten == 1 and op is not None
            proxy.mode = "pass"
            again = await frontier.call(batch, op_id=op)
            return (again.uncached, prev, frontier.calls.prev_op,
                    bool(admin.client.exists(admin.keys.op(op))))
        finally:
            await proxy.close()
            await frontier.close()

    uncached, prev, prev_after, cached = asyncio.run(main())
    assert uncached and prev_after == prev and not cached
    assert bool(admin.client.exists(admin.keys.op(prev)))  # the chain's last cached call
    admin.close()
