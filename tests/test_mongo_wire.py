"""MongoPipeline's real pymongo client against a MongoDB wire-protocol test server (mockupdb).

The server advertises maxWireVersion 17 (MongoDB 6.0): pymongo 4.20 refuses servers older than
wire version 8.  Every ``update``/``createIndexes`` command pymongo sends is recorded, so these
tests assert the exact commands: ``update`` with ``ordered: false``, ``upsert: true``, the batch
sizes, and the resend after a dropped connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mockupdb import MockupDB
from scrapy.exceptions import DropItem
from scrapy.utils.test import get_crawler

from scrapy_fleet.pipelines import MongoPipeline
from scrapy_fleet.pipelines.mongo import default_document_id

Action = Callable[[Any], bool] | str | None


class WireServer:
    """mockupdb server that records commands and answers ``update`` like mongod would.

    ``actions`` is consumed one per ``update`` command: ``"hangup"`` closes the connection
    without a reply, a callable answers the request itself, ``None`` (or an empty list)
    replies success with every update an upsert.
    """

    def __init__(self) -> None:
        self.server = MockupDB(auto_ismaster={"maxWireVersion": 17, "minWireVersion": 0})
        self.server.run()
        self.updates: list[dict[str, Any]] = []
        self.index_commands: list[dict[str, Any]] = []
        self.actions: list[Action] = []
        self._lock = threading.Lock()
        self.server.autoresponds(self._handle)

    @property
    def uri(self) -> str:
        return f"{self.server.uri}/?serverSelectionTimeoutMS=5000"

    def _handle(self, request: Any) -> bool:
        name = getattr(request, "command_name", None)
        if name == "update":
            with self._lock:
                self.updates.append(dict(request.doc))
                action = self.actions.pop(0) if self.actions else None
            if action == "hangup":
                return bool(request.hangup())
            if callable(action):
                return bool(action(request))
            return bool(request.ok(**upsert_reply(request)))
        if name == "createIndexes":
            with self._lock:
                self.index_commands.append(dict(request.doc))
            return bool(request.ok(numIndexesBefore=1, numIndexesAfter=2))
        if name == "endSessions":
            return bool(request.ok())
        return False

    def reset(self) -> None:
        with self._lock:
            self.updates, self.index_commands, self.actions = [], [], []

    def stop(self) -> None:
        self.server.stop()


def upsert_reply(request: Any, skip: tuple[int, ...] = ()) -> dict[str, Any]:
    updates = request.doc["updates"]
    upserted = [{"index": i, "_id": u["q"]["_id"]} for i, u in enumerate(updates)
                if i not in skip]
    return {"n": len(upserted), "nModified": 0, "upserted": upserted}


@pytest.fixture(scope="module")
def wire_server() -> Iterator[WireServer]:
    server = WireServer()
    yield server
    server.stop()


@pytest.fixture
def wire(wire_server: WireServer) -> WireServer:
    wire_server.reset()
    return wire_server


def build(wire: WireServer, **settings: Any) -> tuple[MongoPipeline, Any]:
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": wire.uri,
        "FLEET_MONGO_RETRY_BACKOFF": 0.001,
        "FLEET_MONGO_RETRY_MAX_BACKOFF": 0.005,
        **settings,
    })
    crawler.spider = crawler._create_spider("books")
    return MongoPipeline.from_crawler(crawler), crawler


def run(coro: Any, timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def feed(pipe: MongoPipeline, items: list[dict[str, Any]]) -> list[Any]:
    """Process *items* concurrently, then close (the last partial batch is flushed on close)."""
    await pipe.open_spider()
    tasks = [asyncio.create_task(pipe.process_item(item)) for item in items]
    await asyncio.sleep(0)  # every item is queued
    await pipe.close_spider()
    assert all(task.done() for task in tasks)
    return await asyncio.gather(*tasks, return_exceptions=True)


def items(n: int) -> list[dict[str, Any]]:
    return [{"url": f"http://site/{i}", "title": f"page {i}"} for i in range(n)]


def test_update_commands_are_unordered_upserts_in_batches(wire: WireServer) -> None:
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=3, FLEET_MONGO_FLUSH_INTERVAL=600)
    results = run(feed(pipe, items(7)))
    assert [r["url"] for r in results] == [f"http://site/{i}" for i in range(7)]

    assert sorted(len(cmd["updates"]) for cmd in wire.updates) == [1, 3, 3]
    sent_ids = []
    for cmd in wire.updates:
        assert cmd["update"] == "books"
        assert cmd["$db"] == "scrapy"
        assert cmd["ordered"] is False
        for update in cmd["updates"]:
            assert update["upsert"] is True
            assert update["multi"] is False
            assert set(update["u"]) == {"$set", "$setOnInsert"}
            fields = update["u"]["$set"]
            assert set(fields) == {"url", "title", "updated_at"}
            assert update["q"] == {"_id": default_document_id([fields["url"]])}
            assert set(update["u"]["$setOnInsert"]) == {"first_seen_at"}
            sent_ids.append(update["q"]["_id"])
    assert sorted(sent_ids) == sorted(default_document_id([i["url"]]) for i in items(7))
    stats = crawler.stats.get_stats()
    assert stats["fleet/mongo/batches"] == 3
    assert stats["fleet/mongo/upserted"] == 7
    assert stats["fleet/mongo/written"] == 7


def test_full_batches_of_the_configured_size(wire: WireServer) -> None:
    pipe, _ = build(wire, FLEET_MONGO_BATCH_SIZE=100, FLEET_MONGO_FLUSH_INTERVAL=600)
    run(feed(pipe, items(250)))
    assert sorted(len(cmd["updates"]) for cmd in wire.updates) == [50, 100, 100]


def test_indexes_created_at_open(wire: WireServer) -> None:
    pipe, _ = build(wire, FLEET_MONGO_TTL=3600, FLEET_MONGO_UNIQUE_FIELDS=["sku"])
    run(feed(pipe, []))
    assert wire.updates == []
    assert [(c["createIndexes"], c["indexes"]) for c in wire.index_commands] == [
        ("books", [{"key": {"updated_at": 1}, "name": "fleet_updated",
                    "expireAfterSeconds": 3600}]),
        ("books", [{"key": {"sku": 1}, "name": "fleet_unique", "unique": True}]),
    ]


def test_resends_the_batch_after_a_dropped_connection(wire: WireServer) -> None:
    wire.actions = ["hangup", "hangup"]
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=2)
    results = run(feed(pipe, items(2)))
    assert [r["url"] for r in results] == ["http://site/0", "http://site/1"]
    assert len(wire.updates) == 3
    first = wire.updates[0]["updates"]
    assert len(first) == 2
    assert all(cmd["updates"] == first for cmd in wire.updates)  # same upserts, same times
    stats = crawler.stats.get_stats()
    assert (stats["fleet/mongo/retries"], stats["fleet/mongo/batches"]) == (2, 3)
    assert stats["fleet/mongo/upserted"] == 2


def test_validation_error_drops_one_document_rest_acknowledged(wire: WireServer) -> None:
    def reject_second(request: Any) -> bool:
        reply = upsert_reply(request, skip=(1,))
        reply["writeErrors"] = [{"index": 1, "code": 121, "errmsg": "Document failed validation"}]
        return bool(request.ok(**reply))

    wire.actions = [reject_second]
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=3)
    first, second, third = run(feed(pipe, items(3)))
    assert (first["url"], third["url"]) == ("http://site/0", "http://site/2")
    assert isinstance(second, DropItem) and "code 121" in str(second)
    assert default_document_id(["http://site/1"]) in str(second)
    assert len(wire.updates) == 1
    stats = crawler.stats.get_stats()
    assert stats["fleet/mongo/write_errors/121"] == 1
    assert stats["fleet/mongo/upserted"] == 2
    assert "fleet/mongo/retries" not in stats


def test_duplicate_key_race_resends_only_that_update(wire: WireServer) -> None:
    def dup_first(request: Any) -> bool:
        reply = upsert_reply(request, skip=(0,))
        reply["writeErrors"] = [{"index": 0, "code": 11000, "errmsg": "E11000 duplicate key"}]
        return bool(request.ok(**reply))

    wire.actions = [dup_first]
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=3)
    results = run(feed(pipe, items(3)))
    assert [r["url"] for r in results] == [f"http://site/{i}" for i in range(3)]
    assert [len(c["updates"]) for c in wire.updates] == [3, 1]
    assert wire.updates[1]["updates"] == [wire.updates[0]["updates"][0]]
    assert crawler.stats.get_value("fleet/mongo/upserted") == 3


def test_write_concern_error_resends_whole_batch(wire: WireServer) -> None:
    def wc_error(request: Any) -> bool:
        reply = upsert_reply(request)
        reply["writeConcernError"] = {"code": 64, "errmsg": "waiting for replication timed out"}
        return bool(request.ok(**reply))

    wire.actions = [wc_error]
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=2)
    run(feed(pipe, items(2)))
    assert len(wire.updates) == 2
    assert wire.updates[1]["updates"] == wire.updates[0]["updates"]
    assert crawler.stats.get_value("fleet/mongo/retries") == 1
