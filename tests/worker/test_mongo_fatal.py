"""A MongoDB that refuses the credentials only once it can be reached (unreachable at open):
the first write stops the pipeline for good, with one attempt, not retried like an outage.

Real parts: the MongoDB wire server of tests/mongowire.py (mockupdb) with access control,
started on its port only after the pipeline opened against the closed port.
"""

from __future__ import annotations

import asyncio
import logging

from mongowire import MongoWireServer
from scrapy.exceptions import DropItem
from scrapy.utils.test import get_crawler
from support import free_port

from scrapy_fleet.pipelines import MongoPipeline


def test_wrong_password_after_an_unreachable_start_is_fatal_at_once(caplog):
    port = free_port()
    server = MongoWireServer(port=port, users={"writer": "right-pw"})
    uri = (f"mongodb://writer:wrong-pw@127.0.0.1:{port}/?directConnection=true"
           "&authMechanism=PLAIN&serverSelectionTimeoutMS=1000")
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": uri, "FLEET_MONGO_RETRY_BACKOFF": 0.01,
        "FLEET_MONGO_RETRY_MAX_BACKOFF": 0.05, "FLEET_MONGO_BATCH_SIZE": 4})
    crawler.spider = crawler._create_spider("books")
    pipe = MongoPipeline.from_crawler(crawler)

    async def main() -> list[object]:
        await pipe.open_spider()  # unreachable: a warning, the crawl would start
        server.start()
        tasks = [asyncio.create_task(pipe.process_item({"url": f"http://s/{i}"}))
                 for i in range(4)]
        _, pending = await asyncio.wait(tasks, timeout=15)
        assert not pending  # not waiting (and retrying) as for an outage
        return [t.exception() for t in tasks]

    try:
        with caplog.at_level(logging.INFO):
            results = asyncio.run(main())
    finally:
        server.stop()
    assert all(isinstance(r, DropItem) and "mongo_auth_failed" in str(r) for r in results)
    assert server.auth_failures == [(0, "writer")]  # one attempt
    stats = crawler.stats.get_stats()
    assert stats["fleet/mongo/fatal/18"] == 1 and stats["fleet/mongo/dropped/fatal"] == 4
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "MongoDB refused the credentials" in errors[0]
    assert "wrong-pw" not in caplog.text
    assert getattr(crawler, "_fleet_exit_failure", None) == "mongo_auth_failed"
