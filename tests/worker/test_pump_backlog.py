"""The pump sends a backlog of finished pages call after call, not one call per poll
(a call carries PUSH_CHUNK links at most), against a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.frontier.pump import PUSH_CHUNK
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import host_key

PAGES = 30
LINKS = 20  # 5 finished pages per call: 6 calls for the backlog


class _Spider(Spider):
    name = "backlog"


def test_a_backlog_of_finished_pages_goes_in_back_to_back_calls(redis_url):
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": "backlog",
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter",
        # nothing else wakes the pump for 5 s: no poll, no heartbeat, no host's turn (each
        # host waits 60 s after its one lease)
        "FLEET_POLL_INTERVAL": 5, "FLEET_HEARTBEAT_INTERVAL": 5, "FLEET_HOST_DELAY": 60})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    pump, book = sched.pump, sched.book
    book.spider = _Spider()
    params = sched.config.frontier_params()
    admin = FrontierAdmin(redis_url, "backlog", params=params)
    pages = [Request(f"http://h{i}.test/page") for i in range(PAGES)]
    admin.push([(sched.df.bloom_key(r), 0, codec.encode(r), 0, host_key(r.url)) for r in pages])
    assert LINKS * 5 == PUSH_CHUNK

    # (finished pages still buffered, a poke pending) each time the pump goes to wait
    waits: list[tuple[int, bool]] = []

    async def run() -> tuple[int, Any]:
        frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", "backlog"), "w1", params)
        try:
            leased = (await frontier.call(CallBatch(take=PAGES))).leased
            assert len(leased) == PAGES  # one per host
            for entry in leased:
                lease = Lease(entry.entry_id, entry.token)
                host = codec.decode_dict(entry.payload)["url"].split("/")[2]
                for j in range(LINKS):
                    link = Request(f"http://{host}/link/{j}")
                    lease.children.append((link.url, sched.df.bloom_key(link), 0,
                                           codec.encode(link), host_key(link.url), 0, 0))
                book.done.append(lease)
            calls0 = frontier.roundtrips
            settled = asyncio.Event()  # the backlog is sent, or the pump waits with some left
            wait_time = pump.wait_time

            def noted_wait_time() -> float:
                waits.append((len(book.done), pump.poked))
                if not (book.done and pump.poked):
                    settled.set()
                return wait_time()

            pump.wait_time = noted_wait_time  # type: ignore[method-assign]
            pump.start(frontier)  # its loop, poked once, as the last page's acknowledgement
            await settled.wait()
            calls = frontier.roundtrips - calls0
            await pump.close("finished")  # nothing left to send: no call
            assert frontier.roundtrips - calls0 == calls
            return calls, admin.status()
        finally:
            await frontier.close()

    calls, status = asyncio.run(run())
    admin.close()
    assert not book.done
    # each call after the first was made at once, poked by the one before: the pump never
    # waited for its poll timer with finished pages buffered (before: one call per
    # FLEET_POLL_INTERVAL, 6 calls in 25 s)
    assert [poked for pending, poked in waits if pending] == [True] * calls
    assert calls == PAGES * LINKS // PUSH_CHUNK
    assert crawler.stats.get_value("fleet/frontier/acked") == PAGES
    assert crawler.stats.get_value("fleet/frontier/pushed") == PAGES * LINKS
    assert status["queued"] == PAGES * LINKS
