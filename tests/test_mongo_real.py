"""MongoPipeline against a real MongoDB server: runs only when ``MONGO_URI`` is set.

Example: ``MONGO_URI=mongodb://127.0.0.1:27017 pytest tests/test_mongo_real.py``.  Each test
works in a fresh database ``fleet_test_<random>`` and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from scrapy.exceptions import DropItem
from scrapy.utils.test import get_crawler

from scrapy_fleet.pipelines import MongoPipeline
from scrapy_fleet.pipelines.mongo import default_document_id

MONGO_URI = os.environ.get("MONGO_URI")

pytestmark = [
    pytest.mark.mongo,
    pytest.mark.skipif(not MONGO_URI, reason="set MONGO_URI to run against a real MongoDB"),
]


@pytest.fixture
def database() -> Iterator[tuple[MongoClient[dict[str, Any]], str]]:
    assert MONGO_URI
    client: MongoClient[dict[str, Any]] = MongoClient(MONGO_URI, serverSelectionTimeoutMS=5000)
    name = f"fleet_test_{uuid.uuid4().hex[:12]}"
    yield client, name
    client.drop_database(name)
    client.close()


def build(db_name: str, **settings: Any) -> tuple[MongoPipeline, Any]:
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": MONGO_URI,
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


def test_two_workers_writing_the_same_pages_leave_one_document_each(database: Any) -> None:
    client, name = database
    pages = [{"url": f"http://site/{i}", "n": i} for i in range(300)]
    worker_a, crawler_a = build(name, FLEET_MONGO_BATCH_SIZE=50)
    worker_b, crawler_b = build(name, FLEET_MONGO_BATCH_SIZE=7)

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
    client, name = database
    client[name].create_collection("books", validator={"$jsonSchema": {
        "bsonType": "object", "properties": {"price": {"bsonType": "int", "minimum": 0}}}})
    pipe, crawler = build(name, FLEET_MONGO_BATCH_SIZE=3, FLEET_MONGO_TTL=3600,
                          FLEET_MONGO_UNIQUE_FIELDS=["sku"])
    first, bad, third = asyncio.run(feed(pipe, [
        {"url": "a", "sku": 1, "price": 1},
        {"url": "b", "sku": 2, "price": -1},
        {"url": "c", "sku": 3, "price": 3},
    ]))
    assert isinstance(bad, DropItem) and "code 121" in str(bad)
    assert (first["url"], third["url"]) == ("a", "c")
    coll = client[name]["books"]
    assert sorted(d["url"] for d in coll.find()) == ["a", "c"]
    assert crawler.stats.get_value("fleet/mongo/write_errors/121") == 1
    info = coll.index_information()
    assert info["fleet_updated"]["expireAfterSeconds"] == 3600
    assert info["fleet_unique"]["unique"] is True

    pipe2, crawler2 = build(name, FLEET_MONGO_TTL=3600, FLEET_MONGO_UNIQUE_FIELDS=["sku"],
                            FLEET_MONGO_RETRY_BACKOFF=0.001, FLEET_MONGO_RETRY_MAX_BACKOFF=0.01)
    (dup,) = asyncio.run(feed(pipe2, [{"url": "d", "sku": 1, "price": 4}]))
    assert isinstance(dup, DropItem) and "11000" in str(dup)
    assert crawler2.stats.get_value("fleet/mongo/write_errors/11000") == 1
