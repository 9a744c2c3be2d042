"""A real multi-worker crawl writing through MongoPipeline, one worker SIGKILLed.

Two stores.  The first test writes to a real MongoDB server (SecantusDB's ``secantusd-py``,
or the ``mongod`` at ``MONGO_URI``: the ``mongo_uri`` fixture) and SIGKILLs a worker in the
middle of the crawl.  The second needs to see and fault the wire: its store is
:class:`mongowire.MongoWireServer`, a stateful MongoDB wire server running in threads of this
test process (real pymongo in every worker, real ``update`` commands, upserts applied to one
in-memory store).

The kill is placed at the worst moment for an item store: worker 0 talks to its own listener
of the server, and the server SIGKILLs worker 0 right after it has APPLIED one of its
``update`` commands, before replying.  Those documents are in the store, but their requests
were never acknowledged to the frontier, so their leases expire and other workers fetch and
write those pages again: the test proves that the repeats land on the same documents.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mongowire import MongoWireServer
from support import read_items, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.pipelines.mongo_config import default_document_id
from testsite import generate_site

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
KILL_AFTER_DOCS = 8  # worker 0 dies with its update that brings it to this many documents
ITEM_FIELDS = {"url", "title", "headings", "word_count", "fetched_at"}

pytestmark = pytest.mark.slow


@pytest.mark.mongo
def test_three_workers_one_sigkilled_write_one_document_per_page_to_a_real_server(
        redis_url, mongo_uri, site_factory, worker_env, tmp_path):
    """3 workers write every page of the site to a real MongoDB server; worker 0 is
    SIGKILLed once it has written some pages (its leases expire, other workers fetch those
    pages again and write them to the same documents): exactly one document per page."""
    from pymongo import MongoClient

    paths = generate_site(tmp_path / "www", 80, 6, seed=5)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.1}]})
    site.expected_paths = paths
    site.start_path = "/site/"
    pushed = run_scrapy(EXAMPLE, ["fleet", "push", "docs", site.start_url, "-s",
                                  f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0 and "pushed 1," in pushed.stdout, pushed.stderr
    database = f"fleet_crawl_{tmp_path.name[-20:]}".replace("-", "_")
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    procs: list[Any] = []
    client: Any = MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    try:
        for n in range(3):
            procs.append(start_worker(EXAMPLE, "docs", {
                "FLEET_REDIS_URL": redis_url, "FLEET_MONGO_URI": mongo_uri,
                "FLEET_MONGO_DATABASE": database, "FLEET_MONGO_FLUSH_INTERVAL": 0.2,
                "FLEET_IDLE_TIMEOUT": 1, "FLEET_LEASE_TIMEOUT": 3, "FLEET_JSONL_PATH": outs[n],
                "CONCURRENT_REQUESTS": 4}, worker_env, logs[n]))
        deadline = time.monotonic() + 60
        while len(read_items(outs[:1], growing=True)) < KILL_AFTER_DOCS:
            assert time.monotonic() < deadline, tail(logs[0])
            assert procs[0].poll() is None, tail(logs[0])
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGKILL)
        assert procs[0].wait(10) == -signal.SIGKILL
        assert wait_all(procs[1:], 120) == [0, 0], "\n".join(tail(log) for log in logs[1:])
        docs = list(client[database]["docs"].find())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        client.drop_database(database)
        client.close()

    by_url = {doc["url"]: doc for doc in docs}
    assert len(docs) == len(by_url) == len(site.expected_urls)
    assert set(by_url) == site.expected_urls
    for url, doc in by_url.items():
        assert doc["_id"] == default_document_id([url])
        assert set(doc) == ITEM_FIELDS | {"_id", "first_seen_at", "updated_at"}
        assert doc["first_seen_at"] <= doc["updated_at"]
    assert {i["url"] for i in read_items(outs)} == site.expected_urls
    admin = FrontierAdmin(redis_url, "docs")
    try:
        status = admin.status()
    finally:
        admin.close()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    assert status["counters"].get("reclaimed", 0) >= 1  # worker 0's leases came back


def test_sigkilled_worker_leaves_one_document_per_page(redis_url, site_factory, worker_env,
                                                       tmp_path):
    paths = generate_site(tmp_path / "www", 120, 6, seed=3)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.15}]})
    site.expected_paths = paths
    site.start_path = "/site/"
    pushed = run_scrapy(EXAMPLE, ["fleet", "push", "docs", site.start_url, "-s",
                                  f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr + pushed.stdout
    assert "pushed 1," in pushed.stdout

    server = MongoWireServer(listeners=2).start()  # listener 1: worker 0 only
    procs: list[Any] = []
    lost_replies: list[Any] = []  # _ids written by worker 0 whose reply it never got
    killed = threading.Event()
    written_by_0 = 0

    def kill_worker_0(listener: int, ids: list[Any]) -> bool:
        nonlocal written_by_0
        if listener != 1:
            return False
        if not killed.is_set():
            written_by_0 += len(ids)
            if written_by_0 < KILL_AFTER_DOCS:
                return False
            os.kill(procs[0].pid, signal.SIGKILL)  # applied, not yet answered
            killed.set()
        lost_replies.extend(ids)
        return True  # hang up: the reply is lost with the worker

    server.on_update = kill_worker_0
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    try:
        for n in range(3):
            settings = {
                "FLEET_REDIS_URL": redis_url,
                "FLEET_MONGO_URI": server.uri(1 if n == 0 else 0),
                "FLEET_MONGO_FLUSH_INTERVAL": 0.2,
                "FLEET_IDLE_TIMEOUT": 1,  # (fleet-wide; an unwritten item keeps its lease)
                "FLEET_LEASE_TIMEOUT": 3,
                "FLEET_JSONL_PATH": outs[n],
                "CONCURRENT_REQUESTS": 4,
            }
            procs.append(start_worker(EXAMPLE, "docs", settings, worker_env, logs[n]))
        started = time.monotonic()
        assert killed.wait(45), "worker 0 never wrote enough documents:\n" + tail(logs[0])
        assert procs[0].wait(10) == -signal.SIGKILL
        codes = wait_all(procs[1:], 60 - (time.monotonic() - started))
        assert codes == [0, 0], "\n".join(tail(log) for log in logs[1:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()

    docs = server.documents("scrapy", "docs")
    by_url = {doc["url"]: doc for doc in docs}
    # exactly one document per page, with the stable id of its URL
    assert len(docs) == len(by_url) == len(site.expected_urls)
    assert set(by_url) == site.expected_urls
    for url, doc in by_url.items():
        assert doc["_id"] == default_document_id([url])
        assert set(doc) == ITEM_FIELDS | {"_id", "first_seen_at", "updated_at"}
        assert doc["title"] and doc["word_count"] > 0
        assert doc["first_seen_at"] <= doc["updated_at"]

    # the crash really produced repeats, and they were harmless
    writes = {doc_id: n for (db, coll, doc_id), n in server.writes.items()
              if (db, coll) == ("scrapy", "docs")}
    assert set(writes) == {doc["_id"] for doc in docs}
    assert len(lost_replies) >= 1
    by_id = {doc["_id"]: doc for doc in docs}
    for doc_id in lost_replies:
        # written by worker 0 (first_seen_at kept by $min), then again by the worker
        # that re-fetched the page after the lease expired (>= FLEET_LEASE_TIMEOUT later)
        assert writes[doc_id] >= 2, doc_id
        assert by_id[doc_id]["first_seen_at"] < by_id[doc_id]["updated_at"]
    assert sum(writes.values()) > len(docs)
    # every command was an unordered batch of upserts
    assert all(cmd["ordered"] is False and all(u["upsert"] is True for u in cmd["updates"])
               for _, cmd in server.updates)

    # JSON lines are written after MongoDB acknowledged the item: every page is there, and
    # none of the pages whose reply was lost is in the killed worker's file
    urls = [item["url"] for item in read_items(outs)]
    assert set(urls) == site.expected_urls
    killed_urls = {item["url"] for item in read_items(outs[:1])}
    assert not killed_urls & {by_id[i]["url"] for i in lost_replies}
    repeats = collections.Counter(urls)
    assert all(repeats[by_id[i]["url"]] == 1 for i in lost_replies)

    status = FrontierAdmin(redis_url, "docs").status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    assert status["counters"].get("reclaimed", 0) >= len(lost_replies)
