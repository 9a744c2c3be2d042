"""MongoPipeline's real pymongo client against a MongoDB wire-protocol test server (mockupdb).

The server advertises maxWireVersion 17 (MongoDB 6.0): pymongo 4.20 refuses servers older than
wire version 8.  Every ``update``/``createIndexes`` command pymongo sends is recorded, so these
tests assert the exact commands: ``update`` with ``ordered: false``, ``upsert: true``, the batch
sizes, and the resend after a dropped connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mockupdb import MockupDB
from mongowire import MongoWireServer
from scrapy.exceptions import CloseSpider, DropItem
from scrapy.utils.test import get_crawler
from support import frontier_payloads, read_items, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet.codec import decode_dict
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.pipelines import DocumentRejected, MongoPipeline
from scrapy_fleet.pipelines.mongo_config import default_document_id
from testsite import generate_site

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
        if name in ("endSessions", "ping"):
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
            assert set(update["u"]) == {"$set", "$min", "$max"}
            fields = update["u"]["$set"]
            assert set(fields) == {"url", "title"}
            assert update["q"] == {"_id": default_document_id([fields["url"]])}
            assert set(update["u"]["$min"]) == {"first_seen_at"}
            assert set(update["u"]["$max"]) == {"updated_at"}
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


def test_validation_error_fails_one_document_rest_acknowledged(wire: WireServer) -> None:
    def reject_second(request: Any) -> bool:
        reply = upsert_reply(request, skip=(1,))
        reply["writeErrors"] = [{"index": 1, "code": 121, "errmsg": "Document failed validation"}]
        return bool(request.ok(**reply))

    wire.actions = [reject_second]
    pipe, crawler = build(wire, FLEET_MONGO_BATCH_SIZE=3)
    first, second, third = run(feed(pipe, items(3)))
    assert (first["url"], third["url"]) == ("http://site/0", "http://site/2")
    assert isinstance(second, DocumentRejected) and "code 121" in str(second)
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


# -- access control: failures waiting cannot heal (tests/mongowire.py with users) -------------

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def secured_server() -> Iterator[MongoWireServer]:
    server = MongoWireServer(users={"writer": PASSWORD, "reader": PASSWORD},
                             read_only={"reader"}).start()
    yield server
    server.stop()


@pytest.fixture
def secured(secured_server: MongoWireServer) -> MongoWireServer:
    secured_server.reset()
    return secured_server


def build_for(server: MongoWireServer, user: str, password: str,
              **settings: Any) -> tuple[MongoPipeline, Any]:
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": server.uri(0, user, password) + "&serverSelectionTimeoutMS=5000",
        "FLEET_MONGO_RETRY_BACKOFF": 0.001,
        "FLEET_MONGO_RETRY_MAX_BACKOFF": 0.005,
        **settings,
    })
    crawler.spider = crawler._create_spider("books")
    return MongoPipeline.from_crawler(crawler), crawler


def mongo_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_authenticated_writer_writes(secured: MongoWireServer) -> None:
    pipe, crawler = build_for(secured, "writer", PASSWORD, FLEET_MONGO_BATCH_SIZE=3)
    run(feed(pipe, items(3)))
    assert len(secured.documents("scrapy", "books")) == 3
    assert secured.auth_failures == [] and secured.refused == []
    assert secured.commands["saslStart"] >= 1
    assert crawler.stats.get_value("fleet/mongo/written") == 3


def test_wrong_password_closes_the_spider_at_open(secured: MongoWireServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    pipe, crawler = build_for(secured, "writer", "wrong-pw")

    async def main() -> None:
        with pytest.raises(CloseSpider) as info:
            await pipe.open_spider()
        assert info.value.reason == "mongo_auth_failed"
        await pipe.close_spider()

    with caplog.at_level(logging.DEBUG):
        run(main())
    assert secured.auth_failures == [(0, "writer")]  # one attempt, no retry
    assert secured.commands["update"] == secured.commands["createIndexes"] == 0
    stats = crawler.stats.get_stats()
    assert {k: v for k, v in stats.items() if k.startswith("fleet/mongo/")} == {
        "fleet/mongo/fatal/18": 1}
    (record,) = mongo_errors(caplog)
    assert record.name == "scrapy_fleet.pipelines.mongo"
    message = record.getMessage()
    assert f"writer:***@127.0.0.1:{secured.port()}/" in message
    assert "AuthenticationFailed" in message and "(mongo_auth_failed)" in message
    assert "wrong-pw" not in caplog.text and PASSWORD not in caplog.text


def test_read_only_user_stops_at_the_first_write(secured: MongoWireServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    pipe, crawler = build_for(secured, "reader", PASSWORD, FLEET_MONGO_BATCH_SIZE=3,
                              FLEET_MONGO_FLUSH_INTERVAL=600)

    async def main() -> list[Any]:
        results = await feed(pipe, items(3))
        with pytest.raises(RuntimeError):  # closed
            await pipe.process_item({"url": "late"})
        return results

    with caplog.at_level(logging.DEBUG):
        results = run(main())
    assert all(isinstance(r, DropItem) and "mongo_unauthorized" in str(r) for r in results)
    # createIndexes at open (a warning: writing might be allowed), then ONE update: not retried
    assert [(user, next(iter(cmd))) for _, user, cmd in secured.refused] == [
        ("reader", "createIndexes"), ("reader", "update")]
    assert len(secured.refused[1][2]["updates"]) == 3
    assert secured.updates == [] and secured.documents("scrapy", "books") == []
    stats = {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("fleet/mongo/")}
    assert stats == {"fleet/mongo/fatal/13": 1, "fleet/mongo/dropped/fatal": 3,
                     "fleet/mongo/batches": 1}
    (record,) = mongo_errors(caplog)
    message = record.getMessage()
    assert "is not authorized to write to scrapy.books (OperationFailure 13 Unauthorized" in \
        message
    assert "3 item(s) not written" in message
    assert PASSWORD not in caplog.text


# -- a real crawl: the pages of refused items are not acknowledged -----------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"


def _stat(log: str, key: str) -> str | None:
    """The value of *key* in the stats Scrapy dumps at close (as printed)."""
    found = re.search(rf"'{re.escape(key)}': ([^,\n}}]+)", log)
    return found.group(1) if found else None


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "] ERROR: " in line]


@pytest.mark.slow
def test_crawl_with_bad_credentials_acknowledges_no_unwritten_page(
        redis_url: str, site_factory: Any, worker_env: dict[str, str], tmp_path: Path) -> None:
    """Three real ``scrapy crawl docs`` workers, one after the other, on a crawl of 31 pushed
    pages: a wrong password (closes at open, fetches nothing), a read-only user (fetches
    pages, its first write is refused: closes, acknowledges nothing, releases every lease),
    then a user with the right to write, which crawls every page.  FLEET_LEASE_TIMEOUT is
    long (60 s): a lease left to expire instead of being released would stall the last worker
    past its timeout and show as ``leased`` in the frontier."""
    paths = generate_site(tmp_path / "www", 30, 4, seed=5)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.05}]})
    site.expected_paths = paths
    urls = sorted(site.expected_urls)
    pushed = run_scrapy(EXAMPLE, ["fleet", "push", "docs", *urls, "-s",
                                  f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr + pushed.stdout
    assert f"pushed {len(urls)}," in pushed.stdout
    admin = FrontierAdmin(redis_url, "docs")

    def frontier_urls() -> list[str]:
        """URLs of the entries still in the frontier (an acknowledged entry is deleted)."""
        return sorted(decode_dict(p)["url"]
                      for p in frontier_payloads(admin.client, admin.keys))

    server = MongoWireServer(users={"writer": PASSWORD, "reader": PASSWORD},
                             read_only={"reader"}).start()
    common = {"FLEET_REDIS_URL": redis_url, "FLEET_MONGO_FLUSH_INTERVAL": 0.2,
              "FLEET_IDLE_TIMEOUT": 3, "FLEET_LEASE_TIMEOUT": 60, "CONCURRENT_REQUESTS": 4}

    def crawl(name: str, user: str, password: str, timeout: float, code: int = 0) -> str:
        log = tmp_path / f"{name}.log"
        proc = start_worker(EXAMPLE, "docs", {
            **common, "FLEET_MONGO_URI": server.uri(0, user, password),
            "FLEET_JSONL_PATH": tmp_path / f"{name}.jsonl"}, worker_env, log)
        assert wait_all([proc], timeout) == [code], tail(log)
        return log.read_text(encoding="utf-8")

    try:
        # 1. wrong password: closed at open, before any page is fetched
        log = crawl("wrong-password", "writer", "wrong-pw", 60, code=1)  # fatal: exit 1
        assert "Spider closed (mongo_auth_failed)" in log, log[-3000:]
        assert _stat(log, "fleet/mongo/fatal/18") == "1"
        assert _stat(log, "finish_reason") == "'mongo_auth_failed'"
        (error,) = _errors(log)
        assert "[scrapy_fleet.pipelines.mongo] ERROR: MongoDB refused the credentials of " \
               f"FLEET_MONGO_URI=mongodb://writer:***@127.0.0.1:{server.port()}/" in error
        assert "wrong-pw" not in log
        assert server.auth_failures == [(0, "writer")]
        assert site.requests() == []
        assert frontier_urls() == urls
        status = admin.status()
        assert (status["queued"], status["leased"], status["counters"].get("acked", 0)) == (
            len(urls), 0, 0)

        # 2. read-only user: pages fetched, first write refused, nothing acknowledged
        log = crawl("read-only", "reader", PASSWORD, 60, code=1)  # fatal: exit 1
        assert "Spider closed (mongo_unauthorized)" in log, log[-3000:]
        assert _stat(log, "fleet/mongo/fatal/13") == "1"
        (error,) = _errors(log)
        assert "[scrapy_fleet.pipelines.mongo] ERROR: The MongoDB user of FLEET_MONGO_URI=" \
               f"mongodb://reader:***@127.0.0.1:{server.port()}/" in error
        assert "is not authorized to write to scrapy.docs" in error
        assert PASSWORD not in log
        refused = [u["u"]["$set"]["url"] for _, user, cmd in server.refused
                   if user == "reader" and "update" in cmd for u in cmd["updates"]]
        assert refused, server.refused
        fetched = {site.url.rstrip("/") + r["path"] for r in site.requests()}
        assert set(refused) <= fetched  # really processed by the worker...
        assert frontier_urls() == urls  # ... and not acknowledged: every entry is still there
        status = admin.status()
        assert (status["queued"], status["leased"], status["dead"]) == (len(urls), 0, 0)
        assert status["counters"].get("acked", 0) == 0
        assert int(_stat(log, "fleet/frontier/released") or 0) >= len(set(refused))
        dropped = int(_stat(log, "fleet/mongo/dropped/fatal") or 0)
        assert dropped >= len(set(refused))
        assert int(_stat(log, "item_dropped_count") or 0) == dropped  # DropItem, at DEBUG
        assert read_items([tmp_path / "read-only.jsonl"]) == []  # nothing went past MongoDB
        assert server.documents("scrapy", "docs") == []

        # 3. a user that may write: every page, the refused ones included, is written once
        log = crawl("writer", "writer", PASSWORD, 90)
        assert "Spider closed (finished)" in log, log[-3000:]
        assert _errors(log) == []
    finally:
        server.stop()
    docs = server.documents("scrapy", "docs")
    assert sorted(doc["url"] for doc in docs) == urls
    assert set(refused) <= {doc["url"] for doc in docs}
    status = admin.status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    assert status["counters"].get("reclaimed", 0) == 0  # no lease ever expired: all released
    admin.close()
