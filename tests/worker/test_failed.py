"""Requests that fail for good: recorded with their acknowledgement, listed, retried once.

Real parts: a real redis-server, the test site server answering 500 to one URL (it logs every
request, so its hits are counted), a closed port (connection refused), real ``scrapy crawl``
workers and the real ``scrapy fleet`` / ``scrapy-fleet`` commands.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest
from support import TEST_PROJECT, free_port, read_items, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet import codec
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch
from testsite import generate_site

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]


def _entry(url: str, priority: int = 0) -> tuple[bytes, int, bytes, int, str]:
    payload = codec.encode_dict({"url": url, "priority": priority})
    return (b"", priority, payload, 0, "h.test")


def test_retry_of_dead_letters(redis_url):
    admin = FrontierAdmin(redis_url, "deadretry")
    admin.push([_entry("http://h.test/corrupt")])
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(dead=[(lease.entry_id, lease.token, "bad entry")]), worker="w")
    assert admin.status()["dead"] == 1
    out = subprocess.run([*CLI, "--redis", redis_url, "retry", "deadretry", "--all", "--dead"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "retried 1 dead letter(s)" in out.stdout
    status = admin.status()
    assert (status["dead"], status["queued"]) == (0, 1)
    usage = subprocess.run([*CLI, "--redis", redis_url, "retry", "deadretry"],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "--reason R or --all" in usage.stderr


@pytest.mark.slow
def test_failed_requests_of_a_real_crawl_are_listed_and_retried(redis_url, tmp_path,
                                                                 site_factory, worker_env):
    """A real crawl: one URL answers 500 (retried RETRY_TIMES times by Scrapy), one is on a
    closed port, one makes the callback raise, one is "banned" (an IgnoreRequest with a
    fleet_reason, raised by a downloader middleware's process_response).  ``failed`` lists
    each with its reason and attempts; ``retry`` fetches the 500 URL again (the server counts
    its hits), once."""
    generate_site(tmp_path / "www", 6, 1, seed=2)
    site = site_factory(tmp_path / "www", behaviour={
        "failures": [{"prefix": "/site/p/3.html", "status": 500}]})
    bad = site.url + "site/p/3.html"
    boom = site.url + "site/p/4.html?boom"
    banned = site.url + "site/p/5.html?banned"
    refused = f"http://127.0.0.1:{free_port()}/nothing"
    good = [site.url + f"site/p/{i}.html" for i in (0, 1, 2)]
    args = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fails", *good, bad, boom, refused,
                                       banned, *args], worker_env)
    assert pushed.returncode == 0 and "pushed 7," in pushed.stdout, pushed.stderr

    def crawl(name: str) -> str:
        log = tmp_path / f"{name}.log"
        proc = start_worker(TEST_PROJECT, "fails", {
            "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "RETRY_TIMES": 2,
            "FLEET_JSONL_PATH": tmp_path / f"{name}.jsonl", "DOWNLOAD_TIMEOUT": 5},
            worker_env, log)
        assert wait_all([proc], 120) == [0], tail(log)
        return log.read_text(encoding="utf-8")

    crawl("first")
    hits = collections.Counter(r["path"] for r in site.requests())
    assert hits["/site/p/3.html"] == 3  # the first try and RETRY_TIMES=2 retries

    listed = run_scrapy(TEST_PROJECT, ["fleet", "failed", "fails", "--json", *args], worker_env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["url"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {bad, boom, refused, banned}
    assert (rows[bad]["reason"], rows[bad]["status"], rows[bad]["attempts"]) == (
        "http/500", 500, 3)
    assert (rows[refused]["reason"], rows[refused]["status"], rows[refused]["attempts"]) == (
        "download/DownloadConnectionRefusedError", 0, 3)
    assert (rows[boom]["reason"], rows[boom]["status"], rows[boom]["attempts"]) == (
        "spider/ValueError", 200, 1)
    assert (rows[banned]["reason"], rows[banned]["status"]) == ("proxy/banned", 200)
    assert all(row["method"] == "GET" and row["worker"] and row["at"] > 0
               for row in rows.values())
    only = run_scrapy(TEST_PROJECT, ["fleet", "failed", "fails", "--reason", "http/500", *args],
                      worker_env)
    assert bad in only.stdout and refused not in only.stdout
    assert "1 of 1 failed request(s) with reason 'http/500' shown" in only.stdout

    status = run_scrapy(TEST_PROJECT, ["fleet", "status", "fails", *args], worker_env)
    assert ("failed   4 (download/DownloadConnectionRefusedError 1, http/500 1, "
            "proxy/banned 1, spider/ValueError 1)" in status.stdout), status.stdout
    as_json = json.loads(run_scrapy(TEST_PROJECT, ["fleet", "status", "fails", "--json", *args],
                                    worker_env).stdout)
    assert as_json["failed_by"] == {"download/DownloadConnectionRefusedError": 1, "http/500": 1,
                                 "proxy/banned": 1, "spider/ValueError": 1}
    assert as_json["counters"]["requests"]["failed"] == 4 and as_json["frontier"]["due"] == 0

    site.configure({})  # the server is fixed: the URL answers 200 now
    retried = run_scrapy(TEST_PROJECT, ["fleet", "retry", "fails", "--reason", "http/500",
                                        *args], worker_env)
    assert retried.returncode == 0 and "retried 1 failed request(s)" in retried.stdout, \
        retried.stderr
    twice = subprocess.run([*CLI, "--redis", redis_url, "retry", "fails", "--reason",
                            "http/500"], capture_output=True, text=True, timeout=60)
    assert twice.returncode == 0 and "retried 0 failed request(s)" in twice.stdout

    crawl("second")
    hits = collections.Counter(r["path"] for r in site.requests())
    assert hits["/site/p/3.html"] == 4  # fetched again, once
    assert bad in {i["url"] for i in read_items([tmp_path / "second.jsonl"])}
    admin = FrontierAdmin(redis_url, "fails")
    assert failures.failed_counts(admin.client, admin.keys) == {
        "download/DownloadConnectionRefusedError": 1, "proxy/banned": 1, "spider/ValueError": 1}
    counters = admin.status()["counters"]
    assert (counters["failed"], counters["retried"]) == (4, 1)
    admin.close()
