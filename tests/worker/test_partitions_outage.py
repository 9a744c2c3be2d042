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
from pathlib import Path

import pytest
from support import RedisServer

from scrapy_fleet import outage
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.keys import CrawlKeys

pytestmark = pytest.mark.slow

PARTS = 4
KEYS = CrawlKeys("fleet", "outage")


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
