"""Nothing lost in silence: an item a sink cannot write fails its request, a request the codec
cannot store is recorded among the failed requests (issue 19, items 1 and 2).

Real parts: a real redis-server, the test site server (it logs every request), real
``scrapy crawl`` workers of tests/project (fleettest/sink_spiders.py) and the real
``scrapy fleet`` commands.
"""

from __future__ import annotations

import collections
import json
import uuid
from typing import Any

import pytest
from support import TEST_PROJECT, read_items, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet.failures import admin as failures
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site


def _crawl(tmp_path, name, spider, redis_url, env, **settings) -> str:
    log = tmp_path / f"{name}.log"
    proc = start_worker(TEST_PROJECT, spider, {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1,
        "FLEET_JSONL_PATH": tmp_path / f"{name}.jsonl", **settings}, env, log)
    assert wait_all([proc], 120) == [0], tail(log)
    return log.read_text(encoding="utf-8")


def _fleet(env, redis_url, *args):
    result = run_scrapy(TEST_PROJECT, ["fleet", *args, "-s", f"FLEET_REDIS_URL={redis_url}"],
                        env)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def test_item_a_sink_cannot_write_fails_its_request_and_is_retried(
        redis_url, tmp_path, site_factory, worker_env):
    """The JSONL sink raises TypeError for an item with a field JSON cannot represent: the
    page's request is recorded as failed (item/TypeError, with its URL), counted in status
    and the cockpit's counters and alerts; its other item was written.  A DropItem is no
    failure.  Once the spider is fixed, ``retry`` fetches the pages again and writes all."""
    generate_site(tmp_path / "www", 6, 1, seed=3)
    site = site_factory(tmp_path / "www")
    good = [site.url + f"site/p/{i}.html" for i in (0, 1)]
    bad = [site.url + f"site/p/{i}.html?bad" for i in (2, 3)]
    drop = site.url + "site/p/4.html?drop"
    out = _fleet(worker_env, redis_url, "push", "item_trouble", *good, *bad, drop)
    assert "pushed 5," in out

    log = _crawl(tmp_path, "first", "item_trouble", redis_url, worker_env)
    assert log.count("Error processing") == 2, log[-3000:]
    items = read_items([tmp_path / "first.jsonl"])
    # every page's good item, none of the unwritable ones, none of the dropped page
    assert sorted((i["url"], i["kind"]) for i in items) == sorted(
        (u, "good") for u in good + bad)

    rows = json.loads(_fleet(worker_env, redis_url, "failed", "item_trouble", "--json"))
    assert sorted((r["url"], r["reason"], r["status"]) for r in rows) == [
        (u, "item/TypeError", 200) for u in bad]
    assert all("Unwritable is not JSON serializable" in r["message"] for r in rows)

    status = json.loads(_fleet(worker_env, redis_url, "status", "item_trouble", "--json"))
    assert status["failed_by"] == {"item/TypeError": 2}
    requests = status["counters"]["requests"]
    assert requests["failed"] == 2 and requests["acked"] == 5
    assert (status["counters"]["items_scraped"], status["counters"]["items_dropped"],
            status["counters"]["items_failed"]) == (4, 1, 2)
    alerts = {a["id"]: a for a in status["alerts"]}
    assert alerts["items_failed"]["what"].startswith(
        "2 request(s) failed because an item pipeline could not write")
    text = _fleet(worker_env, redis_url, "status", "item_trouble")
    assert "scraped 4  dropped 1  failed 2" in text and "failed   2 (item/TypeError 2)" in text

    out = _fleet(worker_env, redis_url, "retry", "item_trouble", "--reason", "item/TypeError")
    assert "retried 2 failed request(s)" in out
    _crawl(tmp_path, "second", "item_trouble", redis_url, worker_env, ITEM_TROUBLE_FIXED=True)
    again = read_items([tmp_path / "second.jsonl"])
    assert sorted((i["url"], i["kind"]) for i in again) == sorted(
        [(u, "good") for u in bad] + [(u, "extra") for u in bad])
    hits = collections.Counter(r["path"] + ("?" + r["query"] if r.get("query") else "")
                               for r in site.requests())
    assert [hits[f"/site/p/{i}.html"] for i in range(2)] == [1, 1]
    admin = FrontierAdmin(redis_url, "item_trouble")
    try:
        assert failures.failed_counts(admin.client, admin.keys) == {}
        assert admin.status()["counters"]["retried"] == 2
        status = json.loads(_fleet(worker_env, redis_url, "status", "item_trouble", "--json"))
        assert "items_failed" not in {a["id"] for a in status["alerts"]}  # retried: cleared
        assert status["counters"]["items_failed"] == 2  # what happened stays counted
    finally:
        admin.close()


def test_requests_the_codec_cannot_store_are_recorded_and_alerted(
        redis_url, tmp_path, site_factory, worker_env):
    """A start request and two links whose callback or meta the codec cannot store: each is
    recorded among the failed requests (codec/<error>, its URL, the page that found it),
    counted (``unstorable``) and alerted in status.  ``retry`` fetches the page that found a
    link again (once the spider is fixed its callback yields the link, stored now); the start
    request has no such page: it is left, and ``retry`` says so."""
    generate_site(tmp_path / "www", 6, 1, seed=4)
    site = site_factory(tmp_path / "www")
    base = site.url + "site/"
    parent = base + "p/0.html"
    _fleet(worker_env, redis_url, "push", "unstorable", parent)

    log = _crawl(tmp_path, "first", "unstorable", redis_url, worker_env, UNSTORABLE_BASE=base)
    assert log.count("request recorded as failed (scrapy fleet failed)") == 3, log[-3000:]
    assert {i["url"] for i in read_items([tmp_path / "first.jsonl"])} == {
        parent, base + "p/3.html"}

    rows = json.loads(_fleet(worker_env, redis_url, "failed", "unstorable", "--json"))
    by_url = {r["url"]: r for r in rows}
    assert set(by_url) == {base + "p/1.html", base + "p/2.html", base + "p/5.html"}
    assert all(r["reason"].startswith("codec/") for r in rows)
    assert (by_url[base + "p/1.html"]["parent"], by_url[base + "p/2.html"]["parent"],
            by_url[base + "p/5.html"]["parent"]) == (parent, parent, "")
    assert "lambda" in by_url[base + "p/1.html"]["message"]
    assert "meta['lock']" in by_url[base + "p/2.html"]["message"]

    status = json.loads(_fleet(worker_env, redis_url, "status", "unstorable", "--json"))
    assert status["counters"]["requests"]["unstorable"] == 3
    assert status["counters"]["requests"]["failed"] == 3
    assert sum(status["failed_by"].values()) == 3
    alerts = {a["id"]: a for a in status["alerts"]}
    assert alerts["requests_unstorable"]["what"].startswith("3 request(s) the spider yielded "
                                                            "could not be stored")
    text = _fleet(worker_env, redis_url, "status", "unstorable")
    assert "could not be stored" in text

    out = _fleet(worker_env, redis_url, "retry", "unstorable", "--all")
    assert "retried 1 failed request(s)" in out  # the page that found both links, once
    assert "1 more of the same page(s), fetched once" in out
    assert "1 left: requests the spider yielded without a parent" in out
    _crawl(tmp_path, "second", "unstorable", redis_url, worker_env, UNSTORABLE_BASE=base,
           UNSTORABLE_FIXED=True)
    assert {i["url"] for i in read_items([tmp_path / "second.jsonl"])} == {
        parent, base + "p/1.html", base + "p/2.html"}
    rows = json.loads(_fleet(worker_env, redis_url, "failed", "unstorable", "--json"))
    assert [r["url"] for r in rows] == [base + "p/5.html"]
    status = json.loads(_fleet(worker_env, redis_url, "status", "unstorable", "--json"))
    alerts = {a["id"]: a for a in status["alerts"]}
    assert alerts["requests_unstorable"]["what"].startswith("1 request(s)")  # the one left


@pytest.mark.mongo
def test_item_mongodb_cannot_store_fails_its_request(redis_url, mongo_uri, tmp_path,
                                                     site_factory, worker_env):
    """The same with MongoPipeline on a real MongoDB server: an item BSON cannot encode is
    rejected (DocumentRejected), its request recorded as failed (item/mongo/invalid_document);
    the pages' other items are in the database."""
    from pymongo import MongoClient

    generate_site(tmp_path / "www", 4, 1, seed=5)
    site = site_factory(tmp_path / "www")
    good = site.url + "site/p/0.html"
    bad = site.url + "site/p/1.html?bad"
    _fleet(worker_env, redis_url, "push", "item_trouble", good, bad)
    database = "fleet_sinks_" + uuid.uuid4().hex[:12]
    client: Any = MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    try:
        _crawl(tmp_path, "first", "item_trouble", redis_url, worker_env,
               FLEET_MONGO_URI=mongo_uri, FLEET_MONGO_DATABASE=database)
        docs = list(client[database]["item_trouble"].find())
    finally:
        client.drop_database(database)
        client.close()
    assert sorted((d["url"], d["kind"]) for d in docs) == [(good, "good"), (bad, "good")]
    rows = json.loads(_fleet(worker_env, redis_url, "failed", "item_trouble", "--json"))
    assert [(r["url"], r["reason"]) for r in rows] == [(bad, "item/mongo/invalid_document")]
