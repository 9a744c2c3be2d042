"""A worker's frontier client waiting for Redis at start (AsyncFrontier.connect): a port
nothing listens on, then a real redis-server started there.  One line at the first failure,
at most one per 30 s after it with the count of tries, and one once Redis answers (it was
one line per try)."""

from __future__ import annotations

import asyncio
import logging
import threading

from support import RedisServer, free_port

from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

LOGGER = "scrapy_fleet.frontier.client"


def _connect_then_start(tmp_path, tries: int, log_every: float | None) -> tuple[int, list]:
    """Connect to a free port; start redis-server there once *tries* pings failed.  Returns
    the failed tries and the client's log records."""
    server = RedisServer(tmp_path / "redis", port=free_port())
    started = threading.Event()

    async def main() -> int:
        fr = AsyncFrontier(server.url, CrawlKeys("fleet", "c"), "w", FrontierParams(),
                           timeout=1.0, retries=0)
        if log_every is not None:
            fr.connect_log_every = log_every

        async def starter() -> None:
            while fr.connect_tries < tries:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(server.start)
            started.set()

        task = asyncio.create_task(starter())
        try:
            await fr.connect(patience=120)
            await task
            return fr.connect_tries
        finally:
            await fr.close()

    try:
        failed = asyncio.run(main())
    finally:
        server.stop()
    assert started.is_set()
    return failed


def test_waiting_for_redis_logs_the_first_failure_and_the_end(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    failed = _connect_then_start(tmp_path, 5, None)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert failed >= 5
    assert len(lines) == 2
    assert lines[0][0] == "WARNING" and lines[0][1].startswith("Redis not reachable yet (")
    assert lines[0][1].endswith("): trying again for up to 120 s")
    assert lines[1][0] == "INFO"
    assert lines[1][1].startswith(f"Redis reached after {failed} failed tries (")


def test_the_still_not_reachable_lines_count_the_tries(tmp_path, caplog):
    """connect_log_every 0: a line at every try after the first, each with its count."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    failed = _connect_then_start(tmp_path, 4, 0.0)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == failed + 1
    assert [m.split(" (")[0] for m in lines[1:-1]] == [
        f"Redis still not reachable after {n} tries" for n in range(2, failed + 1)]
    assert lines[-1].startswith(f"Redis reached after {failed} failed tries (")
