"""Fetch and parse stages (FLEET_ROLE) joined by the response queue in the frontier.

Real workers, real Redis, a generated site; parse workers killed with SIGKILL mid-crawl.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request
from support import (
    TEST_PROJECT,
    kill_worker,
    read_items,
    run_scrapy,
    start_site,
    start_worker,
    tail,
    wait_all,
)

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.monitoring.snapshot import read_snapshot
from testsite import generate_site


def site_with(tmp_path: Path, pages: int) -> tuple[Any, set[str]]:
    paths = generate_site(tmp_path / "www", pages, 4, seed=5)
    site = start_site(tmp_path / "www", tmp_path / "site.log")
    expected = {site.url.rstrip("/") + p for p in paths} | {site.url + "site/files/notes.txt"}
    return site, expected


def push_start(site: Any, redis_url: str, env: dict[str, str]) -> None:
    result = run_scrapy(TEST_PROJECT, ["fleet", "push", "staged", site.url + "site/",
                                       "-s", f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stdout + result.stderr


def worker(tmp_path: Path, name: str, redis_url: str, env: dict[str, str],
           **settings: Any) -> tuple[Any, Path, Path]:
    out, log = tmp_path / f"out-{name}.jsonl", tmp_path / f"{name}.log"
    # idle 1 s: fleet-wide, and stored responses (queued) or a killed worker's leases keep
    # every worker open
    base = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": out,
            "FLEET_LEASE_TIMEOUT": 3}
    base.update(settings)
    burn = base.pop("burn", 0)
    return start_worker(TEST_PROJECT, "staged", base, env, log, {"burn": burn}), out, log


def content(items: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {i["url"]: (i["status"], i["title"], tuple(i["links"]), i["class"]) for i in items}


@pytest.mark.slow
def test_fetch_and_parse_workers_with_parse_kills(tmp_path: Path, redis_url: str,
                                                  worker_env: dict[str, str]) -> None:
    site, expected = site_with(tmp_path, 60)
    try:
        # baseline: two all-role workers
        push_start(site, redis_url, worker_env)
        base = [worker(tmp_path, f"all-{n}", redis_url, worker_env) for n in range(2)]
        assert wait_all([p for p, _, _ in base], 180) == [0, 0]
        baseline = read_items([o for _, o, _ in base])
        assert {i["url"] for i in baseline} == expected
        assert not any(i["stored"] for i in baseline)
        FrontierAdmin(redis_url, "staged").purge()
        before = len(site.requests())

        push_start(site, redis_url, worker_env)
        fetchers = [worker(tmp_path, f"fetch-{n}", redis_url, worker_env, FLEET_ROLE="fetch")
                    for n in range(2)]
        outs, logs, kills = [], [o for _, _, o in fetchers], 0
        while True:
            proc, out, log = worker(tmp_path, f"parse-{kills}", redis_url, worker_env,
                                    FLEET_ROLE="parse", burn=100)
            outs.append(out)
            logs.append(log)
            if kills == 3:
                break
            deadline = time.monotonic() + 120
            while len(read_items([out], growing=True)) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            kill_worker(proc)  # mid-crawl, most likely mid-callback
            kills += 1
        codes = wait_all([proc] + [p for p, _, _ in fetchers], 240)
        assert codes == [0, 0, 0], "".join(tail(log) for log in logs)
    finally:
        site.stop()
    items = read_items(outs)
    assert {i["url"] for i in items} == expected  # nothing lost
    assert all(i["stored"] for i in items)  # every page parsed from its stored response
    assert content(items) == content(baseline)  # the same items as in one role
    # never re-fetched: each URL downloaded once by the fetch workers (robots off)
    fetched = collections.Counter(r["path"] for r in site.requests()[before:])
    assert max(fetched.values()) == 1, fetched.most_common(3)
    assert len(items) >= len(expected)  # killed parse workers may have written some twice
    parse_pids = {i["pid"] for i in items}
    assert len(parse_pids) >= 2  # several parse workers did the parsing
    # each page counted once fleet-wide and per host (not again by the parse workers)
    client, keys = FrontierAdmin(redis_url, "staged").client, CrawlKeys("fleet", "staged")
    snap = read_snapshot(client, keys)
    assert snap["counters"]["pages"] == sum(fetched.values())
    per_host = {k: int(v) for k, v in client.hgetall(keys.hoststats).items()
                if k.startswith(b"p|")}
    assert sum(per_host.values()) == snap["counters"]["pages"], per_host


@pytest.mark.slow
def test_response_queue_is_bounded_and_a_killed_fetch_worker_loses_nothing(
        tmp_path: Path, redis_url: str, worker_env: dict[str, str]) -> None:
    site, expected = site_with(tmp_path, 40)
    keys = CrawlKeys("fleet", "staged")
    client = FrontierAdmin(redis_url, "staged").client
    try:
        (tmp_path / "urls.txt").write_text("\n".join(sorted(expected)) + "\n")
        pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "staged", "-f",
                                           str(tmp_path / "urls.txt"),
                                           "-s", f"FLEET_REDIS_URL={redis_url}"], worker_env)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        fetch, _, flog = worker(tmp_path, "fetch-0", redis_url, worker_env, FLEET_ROLE="fetch",
                                FLEET_RESPONSE_QUEUE_MAX=5, CONCURRENT_REQUESTS=2)
        peak, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:
            stored = int(client.hget(keys.hostq, STAGE_HOST) or 0)
            peak = max(peak, stored)
            if stored >= 5:
                break
            time.sleep(0.05)
        time.sleep(2)  # it must stop leasing: the queue stays bounded
        stored = int(client.hget(keys.hostq, STAGE_HOST) or 0)
        assert 5 <= stored <= 5 + 2 + 3, stored  # bound + in flight (cap 2 + a quarter)
        assert "Response queue full" in tail(flog)
        # the cockpit shows the response queue and the fetch worker's role
        snap = read_snapshot(client, keys)
        assert snap["frontier"]["stored"] == int(client.hget(keys.hostq, STAGE_HOST))
        assert snap["frontier"]["stored_bytes"] == int(client.hget(keys.stats,
                                                                   "response_queue_bytes"))
        assert [w["role"] for w in snap["workers"]] == ["fetch"]
        kill_worker(fetch)  # its leases return as usual
        procs = [worker(tmp_path, "fetch-1", redis_url, worker_env, FLEET_ROLE="fetch"),
                 worker(tmp_path, "parse-0", redis_url, worker_env, FLEET_ROLE="parse")]
        assert wait_all([p for p, _, _ in procs], 180) == [0, 0], tail(procs[1][2])
    finally:
        site.stop()
    items = read_items([tmp_path / "out-parse-0.jsonl"])
    assert {i["url"] for i in items} == expected
    assert client.hget(keys.stats, "response_queue_bytes") in (b"0", None)
    assert int(client.hget(keys.hostq, STAGE_HOST) or 0) == 0


@pytest.mark.parametrize("role,state", [("parse", "parsing"), ("fetch", "fetching"),
                                        ("all", "fetching")])
def test_a_parse_worker_holding_stored_responses_says_parsing(role: str, state: str) -> None:
    # issue 19: a parse worker was shown as "fetching" in status, top and the dashboard
    import msgpack
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_fleet.frontier.leases import Lease
    from scrapy_fleet.frontier.scheduler import FleetScheduler

    crawler = get_crawler(Spider, {"FLEET_ROLE": role})
    scheduler = FleetScheduler.from_crawler(crawler)
    assert scheduler.book.state == "idle"
    scheduler.book.prefetch.append((Request("http://h.test/"), Lease("e1", 1)))
    assert scheduler.book.state == state
    hb = msgpack.unpackb(scheduler.pump.monitor.payload(scheduler.book.state, 1, 0))["hb"]
    assert (hb["st"], hb["ro"]) == (state, role)
