"""One Redis outage is one outage for a partitioned worker, however many partitions it calls
(outage.py, redis_client.call_retrying_async), against a real redis-server stopped with
SIGKILL and started again on the same port (append-only file: its data survives).

A partitioned worker's one client calls its partitions concurrently, so its pool holds a
connection per partition called at once.  After a restart, each of them that no call used
during the outage is a socket the restarted server never read: its next call failed with
"Connection closed by server" and logged an outage of its own, after the real one had ended
(one restart of about 2 s was logged as three outages).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from support import RedisServer

from scrapy_fleet import codec, outage
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys

pytestmark = pytest.mark.slow

PARTS = 4
KEYS = CrawlKeys("fleet", "outage")
KEYS_LOST = CrawlKeys("fleet", "lostout")


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "scrapy_fleet.outage"
            and r.levelno >= logging.WARNING]


def test_a_restart_between_calls_is_no_outage_and_an_outage_is_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path / "redis", persistent=True)
    server.start()
    tracker = outage.tracker(server.url)

    async def main() -> tuple[int, int, int]:
        fr = PartitionedFrontier(server.url, KEYS, "w", FrontierParams(), PARTS, timeout=2)
        try:
            await fr.connect()
            # twice the partitions at once: the pool keeps 2 P connections
            await asyncio.gather(fr.probe(), fr.probe())
            # 1. Redis restarted while no call was under way: every pooled socket is stale
            server.kill()
            server.start()
            rows = await asyncio.gather(fr.probe(), fr.probe())
            assert [len(r) for r in rows] == [PARTS, PARTS]
            between = tracker.outages
            # 2. an outage during calls: one probe sent while Redis is gone (the partitions'
            # calls fail and retry), Redis back before its retries run out (0.1 + 0.2 + 0.4 s)
            await asyncio.gather(fr.probe(), fr.probe())
            server.kill()
            during = asyncio.ensure_future(fr.probe())
            await asyncio.sleep(0.15)
            server.start()
            assert len(await during) == PARTS
            # then the whole pool again: the sockets the failed calls did not use are stale
            for _ in range(3):
                await asyncio.gather(*(fr.probe() for _ in range(3)))
            return between, tracker.outages, tracker.failed_calls
        finally:
            await fr.close()

    try:
        with caplog.at_level(logging.DEBUG, logger="scrapy_fleet.outage"):
            between, outages, failing = asyncio.run(main())
    finally:
        server.stop()
    assert between == 0  # (before: 1, "reachable again after 0.0 s")
    assert outages == 1  # (before: 2 or 3)
    assert failing == 0 and not tracker.down
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert "unreachable (" in lines[0] and "reachable again after" in lines[1]


class _Spider(Spider):
    name = "lostout"


def _pump(server: RedisServer, crawl: str, **settings: Any) -> tuple[Any, Any, Any,
                                                                     FrontierParams]:
    """(crawler, pump, book, frontier params) of a scheduler on *server* with no crawl
    running, for calls driven by the test."""
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": server.url, "FLEET_CRAWL_ID": crawl, "FLEET_PARTITIONS": PARTS,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter",
        **settings})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(_slot=None)  # no crawl running: nothing to wake
    sched.book.spider = _Spider()
    return crawler, sched.pump, sched.book, sched.config.frontier_params()


async def _push_and_lease(fr: PartitionedFrontier, pump: Any, book: Any, urls: list[str],
                          rounds: int) -> tuple[list[Any], list[Any]]:
    """Push *urls*, lease them all through the pump (the home first, then the partitions
    with work: at most *rounds* calls) and take them: (requests, their leases)."""
    await fr.call(CallBatch(pushes=[(b"", 0, codec.encode(Request(u)), 0, u.split("/")[2])
                                    for u in urls]))
    for _ in range(rounds):
        if len(book.prefetch) == len(urls):
            break
        await pump.call()
    requests = [book.take() for _ in urls]
    assert all(r is not None for r in requests)
    return requests, [book.inflight[id(r)][1] for r in requests]



def _lost_lines(main: Callable[[], Coroutine[Any, Any, None]], server: RedisServer,
                caplog: pytest.LogCaptureFixture) -> list[str]:
    """Run *main*, then stop *server*: the frontier's warnings that say "lost"."""
    try:
        with caplog.at_level(logging.WARNING, logger="scrapy_fleet.frontier"):
            asyncio.run(main())
    finally:
        server.stop()
    return [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]


def test_a_lease_lost_to_an_outage_is_said_lost_to_it(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A call that fails without a reply (Redis killed) may have run: its acknowledgements,
    sent again after the outage, are then reported lost by the frontier.  The warning says
    the outage, not a stall of the worker (one 2 s restart was logged as "1 lease lost
    (stalled longer than FLEET_LEASE_TIMEOUT=10 s?)").  The first call's having run is made
    by acknowledging its pages from another client while it was down."""
    server = RedisServer(tmp_path / "redis", persistent=True)
    server.start()
    crawler, pump, book, params = _pump(server, "lostout", FLEET_REDIS_RETRIES=1,
                                        FLEET_REDIS_TIMEOUT=2, CONCURRENT_REQUESTS=2)
    urls = [f"http://h{n}.test/page" for n in range(2)]

    async def main() -> None:
        fr = PartitionedFrontier(server.url, KEYS_LOST, "w", params, PARTS, retries=1)
        other = PartitionedFrontier(server.url, KEYS_LOST, "w", params, PARTS)
        pump.frontier = fr
        try:
            await fr.connect()
            requests, leases = await _push_and_lease(fr, pump, book, urls, 2 * PARTS)
            for r in requests:
                book.finished(r)  # done: acknowledged at the next call
            server.kill()
            with pytest.raises(RedisUnavailableError):
                await pump.call()
            server.start()
            # the failed call had run before the connection broke: its pages are acknowledged
            await other.call(CallBatch(acks=[lease.ack() for lease in leases]))
            result = await pump.call()
            assert sorted(result.lost) == sorted(lease.entry_id for lease in leases)
        finally:
            await fr.close()
            await other.close()

    lost = _lost_lines(main, server, caplog)
    assert len(lost) == 1, lost
    assert lost[0].startswith("2 lease(s) reported lost after a Redis outage (2 so far)")
    assert "not a stall of this worker" in lost[0] and "stalled" not in lost[0]
    assert crawler.stats.get_value("fleet/frontier/lease_lost") == 2
    assert crawler.stats.get_value("fleet/frontier/lease_lost/outage") == 2


def test_a_first_batch_of_many_lost_leases_is_logged(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Leases lost without an outage (here: acknowledged by another client first) are
    warned of, the first ones and then each 100th: a first batch of 9 was logged by no line
    (the check read 9 <= 5 or 9 % 100 < 9)."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    crawler, pump, book, params = _pump(server, "lostmany", CONCURRENT_REQUESTS=16)
    urls = [f"http://h{n % 2}.test/page{n}" for n in range(9)]
    keys = CrawlKeys("fleet", "lostmany")

    async def main() -> None:
        fr = PartitionedFrontier(server.url, keys, "w", params, PARTS)
        other = PartitionedFrontier(server.url, keys, "w", params, PARTS)
        pump.frontier = fr
        try:
            await fr.connect()
            requests, leases = await _push_and_lease(fr, pump, book, urls, 4 * PARTS)
            await other.call(CallBatch(acks=[lease.ack() for lease in leases]))
            for r in requests:
                book.finished(r)
            result = await pump.call()  # (flush_age 0: no partition's part is held)
            assert sorted(result.lost) == sorted(lease.entry_id for lease in leases)
        finally:
            await fr.close()
            await other.close()

    lost = _lost_lines(main, server, caplog)
    assert crawler.stats.get_value("fleet/frontier/lease_lost") == 9
    assert len(lost) == 1, lost
    assert lost[0].startswith("9 lease(s) lost (9 so far)"), lost
