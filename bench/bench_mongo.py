"""Items/s of MongoPipeline's batched upserts vs one ``update_one`` per item, same run.

Both sides talk to the same MongoDB wire-protocol test server (mockupdb, in-process, answers
every ``update`` as upserts) through a real pymongo client, on one asyncio loop:

* ``batched``: ``MongoPipeline`` with ``FLEET_MONGO_BATCH_SIZE`` (default 100), every item's
  ``process_item`` awaited, as Scrapy does;
* ``pipeline, batch 1``: the same pipeline with ``FLEET_MONGO_BATCH_SIZE=1``;
* ``update_one``: a plain pipeline doing ``update_one(..., upsert=True)`` per item in a thread
  pool of the same size (``FLEET_MONGO_CONCURRENCY``, default 2).

The figures measure client + protocol overhead and round trips, not a real server's disk.
The server runs in a child process (``--in-process``: in this one, sharing the GIL).
Usage: ``python bench/bench_mongo.py [--items 5000] [--batch-size 100] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from typing import Any

from mockupdb import MockupDB
from pymongo import MongoClient
from scrapy.utils.test import get_crawler

from scrapy_fleet.pipelines.mongo import MongoPipeline
from scrapy_fleet.pipelines.mongo_config import default_document_id


def start_server() -> MockupDB:
    """A mockupdb server answering ``update`` (all upserts), ``createIndexes`` and ``ping``."""
    server = MockupDB(auto_ismaster={"maxWireVersion": 17, "minWireVersion": 0})
    server.run()

    def handle(request: Any) -> bool:
        name = getattr(request, "command_name", None)
        if name == "update":
            updates = request.doc["updates"]
            return bool(request.ok(n=len(updates), nModified=0, upserted=[
                {"index": i, "_id": u["q"]["_id"]} for i, u in enumerate(updates)]))
        if name in ("createIndexes", "endSessions", "ping"):
            return bool(request.ok())
        return False

    server.autoresponds(handle)
    return server


def _serve(conn: Connection) -> None:
    server = start_server()
    conn.send(server.uri)
    conn.recv()  # until the parent says stop (or dies)
    server.stop()


class ServerProcess:
    """The wire server in a child process, so that it does not share the client's GIL."""

    def __init__(self) -> None:
        self._conn, child = multiprocessing.Pipe()
        self._proc = multiprocessing.Process(target=_serve, args=(child,), daemon=True)
        self._proc.start()
        self.uri: str = self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._proc.join(10)


def make_items(n: int, run: int) -> list[dict[str, Any]]:
    return [{"url": f"http://site/{run}/{i}", "title": f"Page {i}", "body": "x" * 200}
            for i in range(n)]


async def run_pipeline(uri: str, items: list[dict[str, Any]], batch_size: int,
                       concurrency: int) -> float:
    crawler = get_crawler(settings_dict={
        "FLEET_MONGO_URI": uri, "FLEET_MONGO_BATCH_SIZE": batch_size,
        "FLEET_MONGO_CONCURRENCY": concurrency, "FLEET_MONGO_FLUSH_INTERVAL": 0.05,
    })
    crawler.spider = crawler._create_spider("bench")
    pipe = MongoPipeline.from_crawler(crawler)
    await pipe.open_spider()
    start = time.perf_counter()
    await asyncio.gather(*(pipe.process_item(item) for item in items))
    elapsed = time.perf_counter() - start
    await pipe.close_spider()
    assert crawler.stats.get_value("fleet/mongo/written") == len(items)
    return len(items) / elapsed


async def run_update_one(uri: str, items: list[dict[str, Any]], concurrency: int) -> float:
    client: MongoClient[dict[str, Any]] = MongoClient(uri)
    coll = client["scrapy"]["bench"]
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(concurrency)
    semaphore = asyncio.Semaphore(concurrency)
    await loop.run_in_executor(executor, client.admin.command, "ping")

    async def process_item(item: dict[str, Any]) -> None:
        now = datetime.now(timezone.utc)
        update = {"$set": {**item, "updated_at": now}, "$setOnInsert": {"first_seen_at": now}}
        async with semaphore:
            await loop.run_in_executor(executor, lambda: coll.update_one(
                {"_id": default_document_id([item["url"]])}, update, upsert=True))

    start = time.perf_counter()
    await asyncio.gather(*(process_item(item) for item in items))
    elapsed = time.perf_counter() - start
    client.close()
    executor.shutdown()
    return len(items) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-process", action="store_true",
                        help="run the wire server in this process (shares the GIL)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    server: MockupDB | ServerProcess = start_server() if args.in_process else ServerProcess()
    uri = server.uri
    rates: dict[str, list[float]] = {"batched": [], "pipeline, batch 1": [], "update_one": []}
    try:
        for rnd in range(args.rounds):
            rates["batched"].append(asyncio.run(run_pipeline(
                uri, make_items(args.items, 3 * rnd), args.batch_size, args.concurrency)))
            rates["pipeline, batch 1"].append(asyncio.run(run_pipeline(
                uri, make_items(args.items, 3 * rnd + 1), 1, args.concurrency)))
            rates["update_one"].append(asyncio.run(run_update_one(
                uri, make_items(args.items, 3 * rnd + 2), args.concurrency)))
    finally:
        server.stop()
    print(f"{args.items} items x {args.rounds} rounds, batch size {args.batch_size}, "
          f"{args.concurrency} writer threads, mockupdb wire server "
          f"{'in process' if args.in_process else 'in a child process'} (median items/s)")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"  {name:<18} {medians[name]:>10.0f} items/s   "
              f"(rounds: {', '.join(f'{v:.0f}' for v in values)})")
    print(f"  ratio batched / update_one: {medians['batched'] / medians['update_one']:.1f}x")


if __name__ == "__main__":
    main()
