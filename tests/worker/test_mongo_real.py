"""MongoPipeline against a real MongoDB server: SecantusDB's ``secantusd-py`` started by the
``mongo_uri`` fixture (tests/mongoserver.py), or the ``mongod`` at ``MONGO_URI`` when it is
set (``MONGO_URI=mongodb://127.0.0.1:27017 pytest tests/worker/test_mongo_real.py``).  Each
test works in a fresh database ``fleet_test_<random>`` and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from pymongo import MongoClient
from scrapy.utils.test import get_crawler

from scrapy_fleet.pipelines import DocumentRejected, MongoPipeline
from scrapy_fleet.pipelines.mongo_config import default_document_id

pytestmark = [pytest.mark.mongo]


@pytest.fixture
def database(mongo_uri: str) -> Iterator[tuple[MongoClient[dict[str, Any]], str, str]]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    name = f"fleet_test_{uuid.uuid4().hex[:12]}"
    yield client, name, mongo_uri
    client.drop_database(name)
    client.close()


def build(db: tuple[Any, str, str], **settings: Any) -> tuple[MongoPipeline, Any]:
    _, db_name, uri = db
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": uri,
        "FLEET_MONGO_DATABASE": db_name,
        "FLEET_MONGO_FLUSH_INTERVAL": 0.01,
        **settings,
    })
    crawler.spider = crawler._create_spider("books")
    return MongoPipeline.from_crawler(crawler), crawler


async def feed(pipe: MongoPipeline, items: list[dict[str, Any]]) -> list[Any]:
    await pipe.open_spider()
    tasks = [asyncio.create_task(pipe.process_item(item)) for item in items]
    await asyncio.sleep(0)
    await pipe.close_spider()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_a_write_arriving_last_with_the_earlier_time_keeps_first_seen_before_updated(
        database: Any) -> None:
    """Two workers write one page at once: the write MongoDB applies last may carry the
    earlier time.  first_seen_at stays the earliest write time, updated_at the latest (with
    $setOnInsert / $set the document said updated_at < first_seen_at, found by CI)."""
    from pymongo import UpdateOne

    client, name, _ = database
    pipe, _ = build(database)

    async def ops() -> list[Any]:
        await pipe.open_spider()
        early = pipe.build_op({"url": "http://site/1", "n": 1})
        await asyncio.sleep(0.01)
        late = pipe.build_op({"url": "http://site/1", "n": 2})
        await pipe.close_spider()
        return [early, late]

    early, late = asyncio.run(ops())
    coll = client[name]["books"]
    for op in (late, early):  # the later write first, the earlier one applied last
        coll.bulk_write([UpdateOne({"_id": op.doc_id}, op.update, upsert=True)])
    doc = coll.find_one({"_id": default_document_id(["http://site/1"])})
    assert doc is not None and doc["n"] == 1  # the fields: last applied write wins

    def stored(when: Any) -> Any:  # BSON datetimes: UTC, naive, milliseconds
        return when.replace(tzinfo=None, microsecond=when.microsecond // 1000 * 1000)

    assert doc["first_seen_at"] == stored(early.update["$min"]["first_seen_at"])
    assert doc["updated_at"] == stored(late.update["$max"]["updated_at"])
    assert doc["first_seen_at"] < doc["updated_at"]


def test_two_workers_writing_the_same_pages_leave_one_document_each(database: Any) -> None:
    client, name, _ = database
    pages = [{"url": f"http://site/{i}", "n": i} for i in range(300)]
    worker_a, crawler_a = build(database, FLEET_MONGO_BATCH_SIZE=50)
    worker_b, crawler_b = build(database, FLEET_MONGO_BATCH_SIZE=7)

    async def main() -> list[list[Any]]:
        return list(await asyncio.gather(feed(worker_a, pages), feed(worker_b, pages[::-1])))

    results = asyncio.run(main())
    assert all(isinstance(r, dict) for batch in results for r in batch)
    coll = client[name]["books"]
    assert coll.count_documents({}) == 300
    doc = coll.find_one({"_id": default_document_id(["http://site/7"])})
    assert doc is not None and doc["n"] == 7 and doc["first_seen_at"] <= doc["updated_at"]
    upserted = (crawler_a.stats.get_value("fleet/mongo/upserted", 0)
                + crawler_b.stats.get_value("fleet/mongo/upserted", 0))
    assert upserted == 300


def test_validation_failure_and_indexes(database: Any) -> None:
    client, name, _ = database
    client[name].create_collection("books", validator={"$jsonSchema": {
        "bsonType": "object", "properties": {"price": {"bsonType": "int", "minimum": 0}}}})
    pipe, crawler = build(database, FLEET_MONGO_BATCH_SIZE=3, FLEET_MONGO_TTL=3600,
                          FLEET_MONGO_UNIQUE_FIELDS=["sku"])
    first, bad, third = asyncio.run(feed(pipe, [
        {"url": "a", "sku": 1, "price": 1},
        {"url": "b", "sku": 2, "price": -1},
        {"url": "c", "sku": 3, "price": 3},
    ]))
    assert isinstance(bad, DocumentRejected) and "code 121" in str(bad)
    assert bad.fleet_reason == "item/mongo/121"  # its request fails (docs/failures.md)
    assert (first["url"], third["url"]) == ("a", "c")
    coll = client[name]["books"]
    assert sorted(d["url"] for d in coll.find()) == ["a", "c"]
    assert crawler.stats.get_value("fleet/mongo/write_errors/121") == 1
    info = coll.index_information()
    assert info["fleet_updated"]["expireAfterSeconds"] == 3600
    assert info["fleet_unique"]["unique"] is True

    pipe2, crawler2 = build(database, FLEET_MONGO_TTL=3600, FLEET_MONGO_UNIQUE_FIELDS=["sku"],
                            FLEET_MONGO_RETRY_BACKOFF=0.001, FLEET_MONGO_RETRY_MAX_BACKOFF=0.01)
    (dup,) = asyncio.run(feed(pipe2, [{"url": "d", "sku": 1, "price": 4}]))
    assert isinstance(dup, DocumentRejected) and dup.fleet_reason == "item/mongo/11000"
    assert crawler2.stats.get_value("fleet/mongo/write_errors/11000") == 1


def test_document_bson_cannot_encode_is_rejected_rest_written(database: Any) -> None:
    client, name, _ = database
    pipe, crawler = build(database, FLEET_MONGO_BATCH_SIZE=3)
    a, b, c = asyncio.run(feed(pipe, [{"url": "a"}, {"url": "b", "blob": object()},
                                      {"url": "c"}]))
    assert isinstance(b, DocumentRejected) and b.fleet_reason == "item/mongo/invalid_document"
    assert (a["url"], c["url"]) == ("a", "c")
    assert sorted(d["url"] for d in client[name]["books"].find()) == ["a", "c"]
    assert crawler.stats.get_value("fleet/mongo/write_errors/invalid_document") == 1
    with pytest.raises(bson.errors.InvalidDocument):  # what pymongo itself says of it
        bson.encode({"blob": object()})
