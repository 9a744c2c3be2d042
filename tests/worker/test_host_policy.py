"""The fleet-wide per-host policy is visible: one INFO line at worker start, and
``scrapy fleet status --hosts`` (text and --json) shows it (issue 9, item 7)."""

from __future__ import annotations

import json

import pytest
from support import TEST_PROJECT, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet.politeness.hosts import describe_policy

pytestmark = pytest.mark.slow


def test_worker_logs_and_status_shows_the_fleet_wide_host_policy(redis_url, site_server,
                                                                  worker_env, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{site_server.url}site/p/{i}.html\n" for i in range(2)))
    redis_arg = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(urls), *redis_arg],
                        worker_env)
    assert pushed.returncode == 0, pushed.stderr
    # what `scrapy startproject` writes
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "DOWNLOAD_DELAY": 1,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                "FLEET_HOST_OVERRIDES": '{"other.test": {"delay": 2.5, "concurrency": 3}}'}
    log = tmp_path / "w.log"
    assert wait_all([start_worker(TEST_PROJECT, "fetch", settings, worker_env, log)], 60) == [0]
    lines = [line for line in log.read_text().splitlines()
             if "Fleet-wide politeness per host" in line]
    assert len(lines) == 1, tail(log)
    assert " INFO: " in lines[0]
    assert "one request every 1.000 s (1.00/s), at most 1 in flight" in lines[0]
    assert "DOWNLOAD_DELAY" in lines[0] and "CONCURRENT_REQUESTS_PER_DOMAIN" in lines[0]
    assert "for a faster crawl" in lines[0]

    # more work for two hosts, one of them with an override: status shows each one's policy
    urls.write_text(f"{site_server.url}site/p/5.html\nhttp://other.test/x\n")
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(urls), *redis_arg],
                        worker_env)
    assert pushed.returncode == 0, pushed.stderr
    result = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", "--hosts", "--json",
                                       *redis_arg], worker_env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["host_policy"] == {"host_key": "host", "interval": 1.0, "rate": 1.0,
                                     "burst": 1, "cap": 1, "is_rate": False}
    rows = {row["host"]: row for row in status["hosts"]}
    assert (rows["127.0.0.1"]["interval"], rows["127.0.0.1"]["rate"],
            rows["127.0.0.1"]["cap"], rows["127.0.0.1"]["queued"]) == (1.0, 1.0, 1, 1)
    assert (rows["other.test"]["interval"], rows["other.test"]["rate"],
            rows["other.test"]["cap"]) == (2.5, 0.4, 3)

    text = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", "--hosts", *redis_arg],
                      worker_env)
    assert text.returncode == 0, text.stderr
    assert ("per host (fleet-wide, FLEET_HOST_KEY='host'): "
            + describe_policy(1.0, 1)) in text.stdout
    assert "interval" in text.stdout and "1.000s" in text.stdout


def test_describe_policy_words():
    assert describe_policy(0.5, 4) == "one request every 0.500 s (2.00/s), at most 4 in flight"
    assert describe_policy(0.0, 0) == "no rate limit, no cap on requests in flight"
    assert describe_policy(0.25, 2, burst=3, is_rate=True) == (
        "one request every 0.250 s (4.00/s, burst 3), at most 2 in flight")
