"""Semantics of MongoPipeline against the in-process fake of tests/fakemongo.py, and the
tests that need no fault and no spy on the calls against a real server too (``store``: the
fake, and SecantusDB's ``secantusd-py`` or the ``mongod`` at ``MONGO_URI``, tests/mongoserver.py).

The pipeline is built by real Scrapy (``get_crawler`` + ``from_crawler``) and driven on an
asyncio event loop, as Scrapy's asyncio reactor would: ``process_item`` is awaited per item.
The fake stays for what a real server cannot do on cue: fail the next call, be down, report a
write-concern error, refuse an index, and record every ``bulk_write`` batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import scrapy
from fakemongo import FakeMongoClient, page_id
from pymongo import MongoClient
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConfigurationError,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
)
from scrapy.exceptions import CloseSpider, DropItem, NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_fleet import engine_hooks
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.pipelines import DocumentRejected, MongoPipeline
from scrapy_fleet.pipelines.mongo_config import MongoConfig, default_document_id
from scrapy_fleet.pipelines.mongo_writes import fatal_error
from scrapy_fleet.redact import redact as redact_uri

FAST = {"FLEET_MONGO_RETRY_BACKOFF": 0.001, "FLEET_MONGO_RETRY_MAX_BACKOFF": 0.005}


class Product(scrapy.Item):
    url = scrapy.Field()
    name = scrapy.Field()
    price = scrapy.Field()


@dataclasses.dataclass
class Review:
    url: str
    stars: int


def build(**settings: Any) -> tuple[MongoPipeline, FakeMongoClient, Any]:
    client = FakeMongoClient()
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": "mongodb://db.example:27017",
        "FLEET_MONGO_CLIENT_FACTORY": lambda uri: client,
        "FLEET_MONGO_FLUSH_INTERVAL": 0.005,
        **settings,
    })
    crawler.spider = crawler._create_spider("books")
    return MongoPipeline.from_crawler(crawler), client, crawler


class Store:
    """Where a test's pipeline writes: ``build(**settings)`` -> (pipeline, crawler), and
    ``db(name)`` the database to read (the real server's is a fresh one per test)."""

    def __init__(self, kind: str, uri: str = "") -> None:
        self.kind = kind
        self.fake = FakeMongoClient()
        self.prefix = f"fleet_test_{uuid.uuid4().hex[:10]}_" if uri else ""
        self.uri = uri
        self.client: Any = MongoClient(uri, serverSelectionTimeoutMS=5000) if uri else None

    def build(self, **settings: Any) -> tuple[MongoPipeline, Any]:
        if self.client is None:
            pipe, _, crawler = build(FLEET_MONGO_CLIENT_FACTORY=lambda uri: self.fake,
                                     **settings)
            return pipe, crawler
        database = settings.pop("FLEET_MONGO_DATABASE", "scrapy")
        crawler = get_crawler(settings_dict={
            "FLEET_MONGO_URI": self.uri, "FLEET_MONGO_FLUSH_INTERVAL": 0.005,
            "FLEET_MONGO_DATABASE": self.prefix + database, **settings})
        crawler.spider = crawler._create_spider("books")
        return MongoPipeline.from_crawler(crawler), crawler

    def db(self, name: str = "scrapy") -> Any:
        return (self.client or self.fake)[self.prefix + name]

    def close(self) -> None:
        if self.client is not None:
            for name in self.client.list_database_names():
                if name.startswith(self.prefix):
                    self.client.drop_database(name)
            self.client.close()


@pytest.fixture(params=["fake", "real"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "fake":
        yield Store("fake")
        return
    result = Store("real", request.getfixturevalue("mongo_uri"))
    yield result
    result.close()


def run(coro: Any, timeout: float = 10.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def mongo_stats(crawler: Any) -> dict[str, Any]:
    return {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("fleet/mongo/")}


async def settle(*tasks: asyncio.Task[Any]) -> list[Any]:
    return await asyncio.gather(*tasks, return_exceptions=True)


async def until(predicate: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


# -- configuration ----------------------------------------------------------------------------


def test_not_configured_without_uri() -> None:
    crawler = get_crawler(settings_dict={})
    with pytest.raises(NotConfigured):
        MongoPipeline.from_crawler(crawler)
    with pytest.raises(NotConfigured):
        MongoConfig.from_settings({"FLEET_MONGO_URI": ""})


def test_defaults() -> None:
    cfg = MongoConfig.from_settings({"FLEET_MONGO_URI": "mongodb://h"})
    assert (cfg.database, cfg.collection, cfg.id_fields, cfg.id_function) == (
        "scrapy", None, ("url",), None)
    assert (cfg.batch_size, cfg.flush_interval, cfg.max_pending, cfg.concurrency) == (
        100, 1.0, 10_000, 2)
    assert (cfg.retry_backoff, cfg.retry_max_backoff, cfg.ttl, cfg.unique_fields) == (
        0.5, 30.0, None, ())
    assert (cfg.updated_field, cfg.first_seen_field) == ("updated_at", "first_seen_at")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 5  # type: ignore[misc]


def test_settings_parsed_from_strings() -> None:
    cfg = MongoConfig.from_settings({
        "FLEET_MONGO_URI": "mongodb+srv://cluster.example/",
        "FLEET_MONGO_ID_FIELDS": "site, sku",
        "FLEET_MONGO_BATCH_SIZE": "250",
        "FLEET_MONGO_FLUSH_INTERVAL": "0.25",
        "FLEET_MONGO_TTL": "3600",
        "FLEET_MONGO_UNIQUE_FIELDS": "sku",
        "FLEET_MONGO_ID_FUNCTION": "fakemongo.page_id",
    })
    assert cfg.id_fields == ("site", "sku")
    assert (cfg.batch_size, cfg.flush_interval, cfg.ttl) == (250, 0.25, 3600)
    assert cfg.unique_fields == ("sku",)
    assert cfg.id_function is page_id


#: (setting, a wrong value of it)
BAD_SETTINGS = [
    ("FLEET_MONGO_URI", "http://db:27017"),
    ("FLEET_MONGO_DATABASE", "bad.name"),
    ("FLEET_MONGO_COLLECTION", "%(nope)s"),
    ("FLEET_MONGO_COLLECTION", "system.%(spider)s"),
    ("FLEET_MONGO_ID_FIELDS", []),
    ("FLEET_MONGO_ID_FIELDS", ["$url"]),
    ("FLEET_MONGO_ID_FUNCTION", "tests.no_such_module.fn"),
    ("FLEET_MONGO_ID_FUNCTION", 42),
    ("FLEET_MONGO_BATCH_SIZE", 0),
    ("FLEET_MONGO_BATCH_SIZE", 2.5),
    ("FLEET_MONGO_BATCH_SIZE", 100_001),
    ("FLEET_MONGO_FLUSH_INTERVAL", -1),
    ("FLEET_MONGO_MAX_PENDING", 0),
    ("FLEET_MONGO_CONCURRENCY", "two"),
    ("FLEET_MONGO_RETRY_BACKOFF", 0),
    ("FLEET_MONGO_RETRY_MAX_BACKOFF", 0.1),
    ("FLEET_MONGO_TTL", 0),
    ("FLEET_MONGO_UPDATED_FIELD", "_id"),
    ("FLEET_MONGO_FIRST_SEEN_FIELD", "updated_at"),
    ("FLEET_MONGO_CLIENT_FACTORY", "not a path"),
]


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_bad_setting_names_setting_and_value(name: str, value: Any) -> None:
    with pytest.raises(FleetConfigError) as info:
        MongoConfig.from_settings({"FLEET_MONGO_URI": "mongodb://h", name: value})
    assert name in str(info.value)


@pytest.mark.parametrize(("name", "value"),
                         [(n, v) for n, v in BAD_SETTINGS if n != "FLEET_MONGO_URI"])
def test_bad_setting_is_refused_without_a_uri_too(name: str, value: Any) -> None:
    """A wrong FLEET_MONGO_* value is one clear error whether or not the pipeline is on
    (FLEET_MONGO_BATCH_SIZE = 0 with no URI passed, to fail the day a URI was set)."""
    with pytest.raises(FleetConfigError) as info:
        MongoConfig.from_settings({name: value})
    assert name in str(info.value)
    with pytest.raises(FleetConfigError):
        MongoPipeline.from_crawler(get_crawler(settings_dict={name: value}))
    assert repr(value) in str(info.value)


# -- upsert semantics -------------------------------------------------------------------------


def test_upserts_one_document_per_page_and_keeps_first_seen() -> None:
    pipe, client, crawler = build()

    async def main() -> None:
        await pipe.open_spider()
        first = {"url": "http://a/1", "name": "one", "price": 1}
        assert await pipe.process_item(first) is first
        await pipe.process_item({"url": "http://a/2", "name": "two", "price": 2})
        await asyncio.sleep(0.01)  # a later re-fetch of page 1 (another worker, say)
        await pipe.process_item({"url": "http://a/1", "name": "one v2", "price": 3})
        await pipe.close_spider()

    run(main())
    coll = client["scrapy"]["books"]
    assert sorted(d["url"] for d in coll.find()) == ["http://a/1", "http://a/2"]
    doc = coll.find_one({"_id": default_document_id(["http://a/1"])})
    assert doc is not None
    assert (doc["name"], doc["price"]) == ("one v2", 3)
    assert doc["updated_at"] > doc["first_seen_at"]  # first_seen_at kept from the insert
    doc2 = coll.find_one({"url": "http://a/2"})
    assert doc2 is not None and doc2["updated_at"] == doc2["first_seen_at"]
    # three sequential items, each flushed by age
    assert mongo_stats(crawler) == {"fleet/mongo/batches": 3, "fleet/mongo/upserted": 2,
                                    "fleet/mongo/modified": 1, "fleet/mongo/written": 3}
    assert client.closed
    ordered, ops = coll.calls[0]
    assert ordered is False
    filt, update, upsert = ops[0]
    assert filt == {"_id": default_document_id(["http://a/1"])}
    assert upsert is True
    assert set(update) == {"$set", "$min", "$max"}
    assert set(update["$set"]) == {"url", "name", "price"}
    assert list(update["$min"]) == ["first_seen_at"] and list(update["$max"]) == ["updated_at"]
    assert update["$max"]["updated_at"] == update["$min"]["first_seen_at"]


def test_item_timestamp_fields_and_id_do_not_clash(store: Store) -> None:
    """Item fields named _id / first_seen_at would make MongoDB refuse the update: ours win."""
    pipe, _ = store.build()
    stale = datetime(2000, 1, 1)

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item({"url": "u", "_id": "x", "first_seen_at": stale,
                                 "updated_at": stale})
        await pipe.close_spider()

    run(main())
    (doc,) = store.db()["books"].find()
    assert doc["_id"] == default_document_id(["u"])
    assert doc["first_seen_at"] > stale + timedelta(days=365)
    assert doc["updated_at"] == doc["first_seen_at"]


def test_id_from_several_fields_and_any_item_type(store: Store) -> None:
    pipe, _ = store.build(FLEET_MONGO_ID_FIELDS=["url", "stars"])

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item(Review(url="u", stars=4))
        await pipe.process_item(Review(url="u", stars=5))
        await pipe.process_item(Review(url="u", stars=4))
        await pipe.close_spider()

    run(main())
    ids = sorted(d["_id"] for d in store.db()["books"].find())
    assert ids == sorted([default_document_id(["u", 4]), default_document_id(["u", 5])])


def test_default_document_id_is_stable() -> None:
    # sha1 of the compact JSON text '["http://a/1"]': the same on every worker and release
    assert default_document_id(["http://a/1"]) == "f42088aa9808c8beac4ded2f5627fa068f556196"
    assert len(default_document_id(["x"])) == 40
    assert default_document_id(["x", 1]) != default_document_id(["x", "1"])
    assert default_document_id([{"b": 1, "a": 2}]) == default_document_id([{"a": 2, "b": 1}])


def test_custom_id_function_by_import_path(store: Store) -> None:
    pipe, _ = store.build(FLEET_MONGO_ID_FUNCTION="fakemongo.page_id")

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item(Product(url="http://a/9", name="n"))
        await pipe.close_spider()

    run(main())
    assert [d["_id"] for d in store.db()["books"].find()] == ["page:http://a/9"]


def test_item_without_id_is_dropped_and_counted() -> None:
    pipe, client, crawler = build()

    async def main() -> None:
        await pipe.open_spider()
        with pytest.raises(DropItem, match="no stable id"):
            await pipe.process_item({"name": "no url"})
        with pytest.raises(DropItem):
            await pipe.process_item({"url": "", "name": "empty url"})
        await pipe.close_spider()

    run(main())
    assert client["scrapy"]["books"].calls == []
    assert mongo_stats(crawler) == {"fleet/mongo/dropped/missing_id": 2}


def test_database_and_collection_per_item_class() -> None:
    pipe, client, _ = build(FLEET_MONGO_DATABASE="shop",
                            FLEET_MONGO_COLLECTION="%(spider)s_%(item_class)s")

    async def main() -> None:
        await pipe.open_spider()
        await asyncio.gather(pipe.process_item(Product(url="p1")),
                             pipe.process_item(Review(url="r1", stars=1)),
                             pipe.process_item({"url": "d1"}))
        await pipe.close_spider()

    run(main())
    db = client["shop"]
    assert sorted(db.collections) == ["books_Product", "books_Review", "books_dict"]
    assert [d["url"] for d in db["books_Review"].find()] == ["r1"]
    assert "scrapy" not in client.databases


# -- batching and completion ------------------------------------------------------------------


def test_batches_by_size_and_flushes_the_rest_on_close() -> None:
    pipe, client, crawler = build(FLEET_MONGO_BATCH_SIZE=3, FLEET_MONGO_FLUSH_INTERVAL=600)
    coll = client["scrapy"]["books"]

    async def main() -> None:
        await pipe.open_spider()
        tasks = [asyncio.create_task(pipe.process_item({"url": f"u{i}"})) for i in range(7)]
        await until(lambda: sum(t.done() for t in tasks) == 6)
        await asyncio.sleep(0.05)
        assert not tasks[6].done()  # waits for its batch: no size, no age yet
        assert [len(ops) for _, ops in coll.calls] == [3, 3]
        await pipe.close_spider()
        assert tasks[6].done()
        assert [t.result()["url"] for t in tasks] == [f"u{i}" for i in range(7)]

    run(main())
    assert [len(ops) for _, ops in coll.calls] == [3, 3, 1]
    assert all(ordered is False for ordered, _ in coll.calls)
    assert coll.count_documents({}) == 7
    assert mongo_stats(crawler)["fleet/mongo/batches"] == 3


def test_flushes_by_age() -> None:
    pipe, client, _ = build(FLEET_MONGO_BATCH_SIZE=100, FLEET_MONGO_FLUSH_INTERVAL=0.02)

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item({"url": "a"})  # returns without close: the age flush wrote it
        assert client["scrapy"]["books"].count_documents({}) == 1
        await pipe.close_spider()

    run(main())
    assert [len(ops) for _, ops in client["scrapy"]["books"].calls] == [1]


def test_max_pending_bounds_items_in_memory() -> None:
    pipe, client, _ = build(FLEET_MONGO_MAX_PENDING=2, FLEET_MONGO_FLUSH_INTERVAL=600)

    async def main() -> None:
        await pipe.open_spider()
        tasks = [asyncio.create_task(pipe.process_item({"url": f"u{i}"})) for i in range(5)]
        await asyncio.sleep(0.02)
        assert sum(len(b) for b in pipe._buffers.values()) == 2
        await pipe.close_spider()
        return [t.result()["url"] for t in tasks]

    assert run(main()) == [f"u{i}" for i in range(5)]
    assert client["scrapy"]["books"].count_documents({}) == 5


def test_process_item_after_close_raises() -> None:
    pipe, _, _ = build()

    async def main() -> None:
        await pipe.open_spider()
        await pipe.close_spider()
        with pytest.raises(RuntimeError):
            await pipe.process_item({"url": "late"})

    run(main())


# -- failures ---------------------------------------------------------------------------------


def test_validation_failure_drops_only_that_document(caplog: pytest.LogCaptureFixture) -> None:
    pipe, client, crawler = build(FLEET_MONGO_BATCH_SIZE=3)
    coll = client["scrapy"]["books"]
    coll.validator = lambda doc: doc.get("price", 0) >= 0

    async def main() -> list[Any]:
        await pipe.open_spider()
        tasks = [asyncio.create_task(pipe.process_item({"url": f"u{i}", "price": p}))
                 for i, p in enumerate([1, -5, 3])]
        out = await settle(*tasks)
        await pipe.close_spider()
        return out

    with caplog.at_level(logging.ERROR, logger="scrapy_fleet.pipelines.mongo"):
        ok0, bad, ok2 = run(main())
    assert ok0["url"] == "u0" and ok2["url"] == "u2"
    assert isinstance(bad, DocumentRejected) and "code 121" in str(bad)
    assert bad.fleet_reason == "item/mongo/121"  # its request fails (docs/failures.md)
    assert sorted(d["url"] for d in coll.find()) == ["u0", "u2"]
    assert len(coll.calls) == 1  # not retried
    bad_id = default_document_id(["u1"])
    assert any(bad_id in r.getMessage() and "121" in r.getMessage() for r in caplog.records)
    stats = mongo_stats(crawler)
    assert stats["fleet/mongo/write_errors/121"] == 1
    assert stats["fleet/mongo/written"] == 2
    assert "fleet/mongo/retries" not in stats


def test_unencodable_item_is_rejected_rest_written() -> None:
    pipe, client, crawler = build(FLEET_MONGO_BATCH_SIZE=3)

    async def main() -> list[Any]:
        await pipe.open_spider()
        out = await settle(*(asyncio.create_task(pipe.process_item(it)) for it in (
            {"url": "a"}, {"url": "b", "tags": {object()}}, {"url": "c"})))
        await pipe.close_spider()
        return out

    a, b, c = run(main())
    assert isinstance(b, DocumentRejected) and "invalid_document" in str(b)
    assert b.fleet_reason == "item/mongo/invalid_document"
    assert (a["url"], c["url"]) == ("a", "c")
    coll = client["scrapy"]["books"]
    assert sorted(d["url"] for d in coll.find()) == ["a", "c"]
    assert [len(ops) for _, ops in coll.calls] == [3, 2]
    assert mongo_stats(crawler)["fleet/mongo/write_errors/invalid_document"] == 1
    assert "fleet/mongo/retries" not in mongo_stats(crawler)


def test_transient_errors_are_retried_until_written() -> None:
    pipe, client, crawler = build(**FAST)
    coll = client["scrapy"]["books"]
    coll.fail_next = [AutoReconnect("reset"), NetworkTimeout("slow"),
                      NotPrimaryError("stepped down")]

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item({"url": "a"})
        await pipe.close_spider()

    run(main())
    assert coll.count_documents({}) == 1
    assert len(coll.calls) == 4
    assert all(ops == coll.calls[0][1] for _, ops in coll.calls)  # the same upserts resent
    stats = mongo_stats(crawler)
    assert (stats["fleet/mongo/retries"], stats["fleet/mongo/batches"]) == (3, 4)
    assert stats["fleet/mongo/written"] == 1


def test_item_stays_in_progress_while_mongodb_is_down() -> None:
    """The acknowledgement contract: no completion (so no ack) until the write is acknowledged."""
    pipe, client, crawler = build(FLEET_MONGO_FLUSH_INTERVAL=0, **FAST)
    coll = client["scrapy"]["books"]

    async def main() -> None:
        await pipe.open_spider()
        coll.down = True
        task = asyncio.create_task(pipe.process_item({"url": "a"}))
        await until(lambda: crawler.stats.get_value("fleet/mongo/retries", 0) >= 5)
        assert not task.done()
        assert coll.count_documents({}) == 0
        coll.down = False
        assert (await task)["url"] == "a"
        await pipe.close_spider()

    run(main())
    assert coll.count_documents({}) == 1


def test_close_waits_for_mongodb_to_come_back() -> None:
    pipe, client, _ = build(FLEET_MONGO_FLUSH_INTERVAL=600, **FAST)
    coll = client["scrapy"]["books"]

    async def main() -> None:
        await pipe.open_spider()
        coll.down = True
        task = asyncio.create_task(pipe.process_item({"url": "a"}))
        closing = asyncio.create_task(pipe.close_spider())
        await until(lambda: len(coll.calls) >= 3)
        assert not closing.done() and not task.done()
        coll.down = False
        await closing
        assert task.done()

    run(main())
    assert coll.count_documents({}) == 1


def test_write_concern_error_is_retried() -> None:
    pipe, client, crawler = build(FLEET_MONGO_BATCH_SIZE=2, **FAST)
    coll = client["scrapy"]["books"]
    coll.write_concern_errors = 1

    async def main() -> None:
        await pipe.open_spider()
        await asyncio.gather(pipe.process_item({"url": "a"}), pipe.process_item({"url": "b"}))
        await pipe.close_spider()

    run(main())
    assert len(coll.calls) == 2
    stats = mongo_stats(crawler)
    assert stats["fleet/mongo/retries"] == 1
    assert stats["fleet/mongo/written"] == 2
    # the first reply (2 upserted) did not count; the resent, identical upserts matched the
    # stored documents and changed nothing
    assert "fleet/mongo/upserted" not in stats and "fleet/mongo/modified" not in stats
    assert coll.count_documents({}) == 2


def test_unique_secondary_key_duplicate_is_rejected_after_retries() -> None:
    pipe, client, crawler = build(FLEET_MONGO_UNIQUE_FIELDS=["sku"], **FAST)
    coll = client["scrapy"]["books"]

    async def main() -> Any:
        await pipe.open_spider()
        await pipe.process_item({"url": "a", "sku": 1})
        with pytest.raises(DocumentRejected, match="11000"):
            await pipe.process_item({"url": "b", "sku": 1})
        await pipe.close_spider()

    run(main())
    assert [d["url"] for d in coll.find()] == ["a"]
    stats = mongo_stats(crawler)
    assert stats["fleet/mongo/write_errors/11000"] == 1
    assert stats["fleet/mongo/retries"] == 3
    assert len(coll.calls) == 1 + 4


def test_non_mongodb_error_fails_the_items() -> None:
    pipe, client, crawler = build()
    client["scrapy"]["books"].fail_next = [ValueError("bug")]

    async def main() -> None:
        await pipe.open_spider()
        with pytest.raises(ValueError, match="bug"):
            await pipe.process_item({"url": "a"})
        await pipe.close_spider()

    run(main())
    assert "fleet/mongo/retries" not in mongo_stats(crawler)


# -- failures waiting cannot heal -------------------------------------------------------------

SECRET_URI = "mongodb://bob:s3cr%23t-pw@db.example:27017/?authSource=admin"
SECRETS = ("s3cr", "#t-pw", "%23t-pw")


def server_error(code: int, code_name: str, errmsg: str) -> OperationFailure:
    """An OperationFailure as pymongo raises it for a command error reply."""
    return OperationFailure(errmsg, code, {"ok": 0.0, "errmsg": errmsg, "code": code,
                                           "codeName": code_name})


AUTH_FAILED = server_error(18, "AuthenticationFailed", "Authentication failed.")
UNAUTHORIZED = server_error(13, "Unauthorized",
                            "not authorized on scrapy to execute command { update: ... }")


@pytest.mark.parametrize(("exc", "expected"), [
    (AUTH_FAILED, ("mongo_auth_failed", "18")),
    (UNAUTHORIZED, ("mongo_unauthorized", "13")),
    (server_error(8000, "AtlasError", "bad auth : Authentication failed."),
     ("mongo_auth_failed", "8000")),
    (server_error(8000, "AtlasError", "user is not allowed to do action [update] on [s.b]"),
     ("mongo_unauthorized", "8000")),
    (ConfigurationError("Server reports wire version 6, but PyMongo requires at least 8"),
     ("mongo_config_error", "ConfigurationError")),
    # everything else is retried, as before
    (server_error(8000, "AtlasError", "you are over your space quota"), None),
    (server_error(11600, "InterruptedAtShutdown", "interrupted at shutdown"), None),
    (AutoReconnect("connection reset"), None),
    (ServerSelectionTimeoutError("db.example:27017: timed out"), None),
    (BulkWriteError({"writeErrors": [{"index": 0, "code": 13, "errmsg": "x"}]}), None),
])
def test_which_errors_are_fatal(exc: Exception, expected: tuple[str, str] | None) -> None:
    fatal = fatal_error(exc)
    assert (fatal and (fatal.reason, fatal.key)) == expected


@pytest.mark.parametrize(("uri", "redacted"), [
    ("mongodb://bob:s3cret@h1:27017,h2:27017/db?replicaSet=rs0",
     "mongodb://bob:***@h1:27017,h2:27017/db?replicaSet=rs0"),
    ("mongodb+srv://bob:p%40ss@cluster0.example.net/?retryWrites=true",
     "mongodb+srv://bob:***@cluster0.example.net/?retryWrites=true"),
    # not escaped (pymongo refuses it: InvalidURI), still hidden
    ("mongodb://bob:p@ss/w?rd@h1/", "mongodb://bob:***@h1/"),
    ("mongodb://h1/?directConnection=true", "mongodb://h1/?directConnection=true"),
    ("mongodb://bob@h1/?authMechanism=MONGODB-X509", "mongodb://bob@h1/?authMechanism=MONGODB-X509"),
    ("mongodb://h1/?tls=true&tlsCertificateKeyFilePassword=hunter2&authMechanism=MONGODB-AWS"
     "&authMechanismProperties=AWS_SESSION_TOKEN:tok",
     "mongodb://h1/?tls=true&tlsCertificateKeyFilePassword=***&authMechanism=MONGODB-AWS"
     "&authMechanismProperties=***"),
])
def test_redact_uri(uri: str, redacted: str) -> None:
    assert redact_uri(uri) == redacted


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_wrong_credentials_close_the_spider_at_open(caplog: pytest.LogCaptureFixture) -> None:
    pipe, client, crawler = build(FLEET_MONGO_URI=SECRET_URI)
    client.admin.fail_next = [AUTH_FAILED]

    async def main() -> None:
        with pytest.raises(CloseSpider) as info:
            await pipe.open_spider()
        assert info.value.reason == "mongo_auth_failed"
        await pipe.close_spider()  # Scrapy closes the components that opened

    with caplog.at_level(logging.DEBUG):
        run(main())
    assert client.admin.commands == ["ping"]
    coll = client["scrapy"]["books"]
    assert coll.calls == [] and list(coll.index_information()) == ["_id_"]
    assert client.closed
    assert mongo_stats(crawler) == {"fleet/mongo/fatal/18": 1}
    (record,) = errors(caplog)
    assert record.name == "scrapy_fleet.pipelines.mongo"
    message = record.getMessage()
    assert "mongodb://bob:***@db.example:27017/?authSource=admin" in message
    assert "OperationFailure 18 AuthenticationFailed: Authentication failed." in message
    assert "mongo_auth_failed" in message and "before any page is fetched" in message
    assert not any(secret in caplog.text for secret in SECRETS)


def test_invalid_uri_closes_the_spider_at_open(caplog: pytest.LogCaptureFixture) -> None:
    # the default client factory (a real MongoClient): the '@' of the password is not escaped
    crawler = get_crawler(settings_dict={"FLEET_MONGO_URI": "mongodb://bob:p@ss@db.example/"})
    crawler.spider = crawler._create_spider("books")
    pipe = MongoPipeline.from_crawler(crawler)

    async def main() -> None:
        with pytest.raises(CloseSpider) as info:
            await pipe.open_spider()
        assert info.value.reason == "mongo_config_error"
        await pipe.close_spider()

    with caplog.at_level(logging.DEBUG):
        run(main())
    assert mongo_stats(crawler) == {"fleet/mongo/fatal/InvalidURI": 1}
    (record,) = errors(caplog)
    assert "FLEET_MONGO_URI=mongodb://bob:***@db.example/ cannot be used (InvalidURI:" in \
        record.getMessage()
    assert "p@ss" not in caplog.text


def test_unreachable_at_open_is_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    pipe, client, crawler = build(FLEET_MONGO_URI=SECRET_URI)
    client.admin.fail_next = [ServerSelectionTimeoutError("db.example:27017: timed out")]
    coll = client["scrapy"]["books"]

    async def main() -> None:
        await pipe.open_spider()
        assert list(coll.index_information()) == ["_id_"]  # not tried while unreachable
        await pipe.process_item({"url": "a"})
        await pipe.close_spider()

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet.pipelines.mongo"):
        run(main())
    assert "fleet_updated" in coll.index_information()  # created before the first write
    assert coll.count_documents({}) == 1
    assert errors(caplog) == []
    (warning,) = caplog.records
    assert "mongodb://bob:***@db.example:27017/?authSource=admin cannot be reached yet" in \
        warning.getMessage()
    assert not any(k.startswith("fleet/mongo/fatal") for k in mongo_stats(crawler))


def test_no_right_to_create_indexes_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    pipe, client, crawler = build()
    coll = client["scrapy"]["books"]
    coll.index_fail_next = [server_error(13, "Unauthorized", "not authorized on scrapy to "
                                         "execute command { createIndexes: ... }")]

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item({"url": "a"})
        await pipe.process_item({"url": "b"})
        await pipe.close_spider()

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet.pipelines.mongo"):
        run(main())
    assert coll.count_documents({}) == 2
    assert list(coll.index_information()) == ["_id_"]  # not tried again before each write
    assert errors(caplog) == []
    assert "may not create indexes on scrapy.books" in caplog.records[0].getMessage()
    assert mongo_stats(crawler)["fleet/mongo/written"] == 2


class FakeScheduler:
    """What the pipeline asks of the fleet scheduler: acknowledge, until told to withhold."""

    def __init__(self) -> None:
        self.acked: list[scrapy.Request] = []
        self.withheld: list[str] = []

    def withhold_acknowledgements(self, reason: str) -> None:
        self.withheld.append(reason)

    def request_done(self, request: scrapy.Request) -> None:
        if not self.withheld:
            self.acked.append(request)


class FakeSlot:
    """The part of Scrapy's engine slot that the fleet scheduler hooks into."""

    def __init__(self) -> None:
        self.inprogress: set[scrapy.Request] = set()
        self.nextcall = None
        self.scheduler = FakeScheduler()

    def remove_request(self, request: scrapy.Request) -> None:
        self.inprogress.remove(request)


class FakeEngine:
    def __init__(self, spider: scrapy.Spider) -> None:
        self._slot = FakeSlot()
        self.spider = spider
        self.closed_with: list[str] = []

    async def close_spider_async(self, *, reason: str) -> None:
        self.closed_with.append(reason)


def test_fatal_write_error_drops_everything_acks_nothing_closes_the_spider(
        caplog: pytest.LogCaptureFixture) -> None:
    """Unauthorized (13) on a write: one error, no retry, every pending item dropped (the
    batch in back-off of another collection too), later items dropped at once, no request
    acknowledged from then on, the spider closed with mongo_unauthorized."""
    pipe, client, crawler = build(FLEET_MONGO_URI=SECRET_URI, FLEET_MONGO_FLUSH_INTERVAL=0,
                                  FLEET_MONGO_COLLECTION="%(item_class)s",
                                  FLEET_MONGO_RETRY_BACKOFF=60, FLEET_MONGO_RETRY_MAX_BACKOFF=60)
    engine = FakeEngine(crawler.spider)
    crawler.engine = engine
    slot = engine._slot
    scheduler = slot.scheduler
    engine_hooks.on_request_done(crawler, scheduler.request_done)  # as FleetScheduler.open
    engine_hooks.publish_ledger(crawler, scheduler)  # idem: the pipeline's way to withhold
    done, page_a, page_b = (scrapy.Request(f"http://site/{n}") for n in "0ab")
    slot.inprogress |= {done, page_a, page_b}
    products, dicts = client["scrapy"]["Product"], client["scrapy"]["dict"]

    async def main() -> list[Any]:
        await pipe.open_spider()
        slot.remove_request(done)  # its items were written: acknowledged
        products.down = True
        product = asyncio.create_task(pipe.process_item(Product(url="p")))
        await until(lambda: crawler.stats.get_value("fleet/mongo/retries") == 1)  # back-off
        dicts.fail_next = [UNAUTHORIZED]
        out = await settle(product, asyncio.create_task(pipe.process_item({"url": "a"})),
                           asyncio.create_task(pipe.process_item({"url": "b"})))
        with pytest.raises(DropItem):
            await pipe.process_item({"url": "c"})
        # the engine finishes the requests of the dropped items: no acknowledgement
        slot.remove_request(page_a)
        slot.remove_request(page_b)
        await pipe.close_spider()
        return out

    with caplog.at_level(logging.DEBUG):
        results = run(main())
    assert all(isinstance(r, DropItem) and r.log_level == "DEBUG" for r in results)
    assert "mongo_unauthorized" in str(results[1])
    assert scheduler.acked == [done]
    assert scheduler.withheld == ["mongo_unauthorized"]  # before page_a and page_b finished
    assert slot.inprogress == set()
    assert engine.closed_with == ["mongo_unauthorized"]
    assert len(dicts.calls) == 1 and len(products.calls) == 1  # neither retried
    assert dicts.count_documents({}) == 0
    stats = mongo_stats(crawler)
    assert stats == {"fleet/mongo/fatal/13": 1, "fleet/mongo/dropped/fatal": 4,
                     "fleet/mongo/batches": 2, "fleet/mongo/retries": 1}
    (record,) = errors(caplog)
    message = record.getMessage()
    assert message.startswith("The MongoDB user of FLEET_MONGO_URI=mongodb://bob:***@db.example"
                              ":27017/?authSource=admin is not authorized to write to "
                              "scrapy.dict (OperationFailure 13 Unauthorized: not authorized")
    assert "3 item(s) not written" in message
    assert message.endswith("Closing the spider (mongo_unauthorized).")
    assert not any(secret in caplog.text for secret in SECRETS)
    assert client.closed


def test_authentication_failing_mid_crawl_after_a_transient_error() -> None:
    """A password changed under a running crawl: the retried batch stops at the auth error."""
    pipe, client, crawler = build(**FAST)
    coll = client["scrapy"]["books"]
    coll.fail_next = [AutoReconnect("reset"), AUTH_FAILED]

    async def main() -> None:
        await pipe.open_spider()
        with pytest.raises(DropItem, match="mongo_auth_failed"):
            await pipe.process_item({"url": "a"})
        await pipe.close_spider()

    run(main())
    assert len(coll.calls) == 2
    assert mongo_stats(crawler) == {"fleet/mongo/fatal/18": 1, "fleet/mongo/dropped/fatal": 1,
                                    "fleet/mongo/batches": 2, "fleet/mongo/retries": 1}


# -- indexes ----------------------------------------------------------------------------------


def test_indexes_created_at_open_idempotently() -> None:
    pipe, client, _ = build(FLEET_MONGO_TTL=86400, FLEET_MONGO_UNIQUE_FIELDS=["sku", "site"])

    async def main() -> None:
        await pipe.open_spider()
        await pipe.close_spider()

    run(main())
    info = client["scrapy"]["books"].index_information()
    assert info["fleet_updated"] == {"key": [("updated_at", 1)], "expireAfterSeconds": 86400}
    assert info["fleet_unique"] == {"key": [("sku", 1), ("site", 1)], "unique": True}
    # a second worker (same settings) opening on the same collection: no error, same indexes
    pipe2, _, _ = build(FLEET_MONGO_TTL=86400, FLEET_MONGO_UNIQUE_FIELDS=["sku", "site"],
                        FLEET_MONGO_CLIENT_FACTORY=lambda uri: client)

    async def again() -> None:
        await pipe2.open_spider()
        await pipe2.process_item({"url": "a", "sku": 1, "site": "s"})
        await pipe2.close_spider()

    run(again())
    assert client["scrapy"]["books"].index_information() == info


def test_indexes_of_per_class_collections_created_before_first_write() -> None:
    pipe, client, _ = build(FLEET_MONGO_COLLECTION="%(item_class)s")

    async def main() -> None:
        await pipe.open_spider()
        assert client.databases == {}  # collections not known yet
        await pipe.process_item(Product(url="p"))
        await pipe.close_spider()

    run(main())
    assert "fleet_updated" in client["scrapy"]["Product"].index_information()


def test_nested_items_of_any_type_are_stored_as_documents(store: Store) -> None:
    pipe, _ = store.build()
    item = Product(url="p", name=("a", "b"),
                   price={"history": [Review(url="r", stars=2)], "seller": Product(name="s")})

    async def main() -> None:
        await pipe.open_spider()
        await pipe.process_item(item)
        await pipe.close_spider()

    run(main())
    (doc,) = store.db()["books"].find()
    assert doc["name"] == ["a", "b"]
    assert doc["price"] == {"history": [{"url": "r", "stars": 2}], "seller": {"name": "s"}}
