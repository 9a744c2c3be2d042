"""Pushed requests are start requests: the worker that leases one passes it through the spider
middlewares' ``process_start`` before fetching it, as Scrapy does with the spider's own start
requests (issue 19, item 7).  The hook's effect (the request as it made it, the requests it
added, a request it dropped) reaches the frontier once, with the lease's acknowledgement; a
worker that dies first leaves the pushed request, as pushed, to the next one
(FleetSpiderMiddleware's module docstring).

Real crawls: ``scrapy fleet push`` then ``scrapy crawl`` workers of tests/project's
``tagged_starts`` spider, whose ``TagStartMiddleware`` tags, drops and adds start requests.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
from scrapy import Request
from support import (
    TEST_PROJECT,
    kill_worker,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
    wait_until,
    worker_stats,
)

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.commands.push import default_fingerprinter, push_lines
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch

pytestmark = pytest.mark.slow

SPIDER = "tagged_starts"


def make_site(root: Path, paths: list[str]) -> None:
    for path in paths:
        page = root / path.lstrip("/")
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"<html><body>{path}</body></html>", encoding="utf-8")


def push_file(lines: list[str], tmp_path: Path, redis_url: str, env: dict[str, str]) -> str:
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    result = run_scrapy(TEST_PROJECT, ["fleet", "push", SPIDER, "-f", str(urls), "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def summed(logs: list[Path], key: str) -> float:
    return sum(worker_stats(log).get(key, 0) for log in logs)


def test_pushed_requests_meet_the_start_hook_once_each(redis_url, site_factory, worker_env,
                                                       tmp_path):
    plain = [f"/p/{i}.html" for i in range(8)]
    make_site(tmp_path / "www", [*plain, "/j/0.html", "/j/1.html", "/j/2.html",
                                 "/gen/extra.html"])
    site = site_factory(tmp_path / "www")
    base = site.url.rstrip("/")
    lines = [base + path for path in plain] + [
        json.dumps({"url": base + "/j/0.html", "meta": {"start_tags": ["pushed"]}}),
        json.dumps({"url": base + "/j/1.html", "callback": "parse",
                    "meta": {"extra": base + "/gen/extra.html"}}),
        json.dumps({"url": base + "/j/2.html", "meta": {"drop": True}}),
    ]
    assert "pushed 11," in push_file(lines, tmp_path, redis_url, worker_env)

    outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    procs = [start_worker(TEST_PROJECT, SPIDER, {"FLEET_REDIS_URL": redis_url,
                                                 "FLEET_IDLE_TIMEOUT": 1,
                                                 "FLEET_JSONL_PATH": outs[n]},
                          worker_env, logs[n]) for n in range(2)]
    codes = wait_all(procs, 120)
    assert codes == [0, 0], "\n".join(tail(log) for log in logs)

    items = read_items(outs)
    urls = collections.Counter(item["url"] for item in items)
    assert urls == collections.Counter(
        [base + path for path in [*plain, "/j/0.html", "/j/1.html", "/gen/extra.html"]])
    by_url = {item["url"]: item for item in items}
    # every pushed request reached its callback tagged once, as a start request
    for path in [*plain, "/j/1.html"]:
        assert by_url[base + path]["start_tags"] == ["tagged"], by_url[base + path]
    assert by_url[base + "/j/0.html"]["start_tags"] == ["pushed", "tagged"]
    assert all(by_url[base + path]["is_start_request"] is True
               for path in [*plain, "/j/0.html", "/j/1.html"])
    # the request the middleware added was crawled, once
    extra = by_url[base + "/gen/extra.html"]
    assert (extra["generated_by"], extra["start_tags"]) == (base + "/j/1.html", None)
    # the dropped one was never fetched; every other page once
    fetched = collections.Counter(r["path"] for r in site.requests())
    assert fetched == collections.Counter([*plain, "/j/0.html", "/j/1.html", "/gen/extra.html"])

    # the hook ran once per pushed request, fleet-wide
    assert summed(logs, "tagstart/seen") == 11
    assert summed(logs, "fleet/start/pushed") == 11
    assert summed(logs, "fleet/start/pushed/dropped") == 1
    assert summed(logs, "fleet/start/pushed/added") == 1
    status = FrontierAdmin(redis_url, SPIDER).status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    # the dropped one acknowledged as done; the added one pushed and acknowledged
    assert status["counters"]["acked"] == status["counters"]["pushed"] == 12


def test_a_pushed_request_whose_worker_died_meets_the_hook_again_with_one_effect(
        redis_url, site_factory, worker_env, tmp_path):
    """A worker runs the hook, starts the download and is SIGKILLed: the next worker leases
    the entry as it was pushed, runs the hook on it (not on the first worker's output: one
    tag), and the request the hook adds is pushed once, with that worker's acknowledgement."""
    make_site(tmp_path / "www", ["/slow/a.html", "/gen/x.html"])
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/slow/", "seconds": 4.0}]})
    base = site.url.rstrip("/")
    push_file([json.dumps({"url": base + "/slow/a.html", "meta": {"extra": base + "/gen/x.html"}})],
              tmp_path, redis_url, worker_env)
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_LEASE_TIMEOUT": 2, "FLEET_IDLE_TIMEOUT": 2}
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_worker(TEST_PROJECT, SPIDER, {**settings,
                                                "FLEET_JSONL_PATH": tmp_path / "first.jsonl"},
                         worker_env, first_log)
    try:
        # the first worker ran the hook and is downloading the page (held 4 s by the site)
        wait_until(lambda: [r for r in site.requests() if r["path"] == "/slow/a.html"], 60,
                   "the first worker's download")
    finally:
        kill_worker(first)
    second = start_worker(TEST_PROJECT, SPIDER, {**settings,
                                                 "FLEET_JSONL_PATH": tmp_path / "second.jsonl"},
                          worker_env, second_log)
    assert wait_all([second], 120) == [0], tail(second_log)

    assert read_items([tmp_path / "first.jsonl"]) == []
    items = {item["url"]: item for item in read_items([tmp_path / "second.jsonl"])}
    assert len(read_items([tmp_path / "second.jsonl"])) == 2
    assert items[base + "/slow/a.html"]["start_tags"] == ["tagged"]
    assert items[base + "/gen/x.html"]["generated_by"] == base + "/slow/a.html"
    fetched = collections.Counter(r["path"] for r in site.requests())
    assert fetched == {"/slow/a.html": 2, "/gen/x.html": 1}
    stats = worker_stats(second_log)
    assert (stats.get("fleet/frontier/redelivered"), stats.get("tagstart/seen"),
            stats.get("fleet/start/pushed"), stats.get("fleet/start/pushed/added")) == (
        1, 1, 1, 1)
    status = FrontierAdmin(redis_url, SPIDER).status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    assert status["counters"]["acked"] == status["counters"]["pushed"] == 2


def test_a_retried_failed_pushed_request_is_still_a_start_request(redis_url):
    """``scrapy fleet retry`` pushes a failed pushed request as it was pushed: still marked, so
    the hook makes it again (its stored form is not the hook's); a request a worker stored
    (the hook's output, or a link) comes back unmarked."""
    admin = FrontierAdmin(redis_url, "reretry")
    assert push_lines(admin, [(1, "http://a.test/pushed")], default_fingerprinter()).pushed == 1
    stored = codec.encode(Request("http://b.test/stored", meta={"start_tags": ["tagged"]}))
    admin.push([(b"", 0, stored, 0, "b.test")])

    def lease_both() -> tuple[list, dict[str, bool]]:
        leased = admin.call(CallBatch(take=2), worker="w").leased
        requests = [codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES) for e in leased]
        return list(zip(leased, requests, strict=True)), {
            r.url: codec.PUSHED_META_KEY in r.meta for r in requests}

    pairs, marked = lease_both()
    assert marked == {"http://a.test/pushed": True, "http://b.test/stored": False}
    admin.call(CallBatch(acks=[(e.entry_id, e.token, FailureRecord(
        url=r.url, method="GET", reason="http/500", status=500, attempts=3, worker="w",
        host=r.url.split("/")[2]).encode()) for e, r in pairs]), worker="w")
    assert failures.retry(admin.client, admin.keys, redis_url).retried == 2
    assert lease_both()[1] == marked
