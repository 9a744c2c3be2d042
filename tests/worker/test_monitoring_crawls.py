"""Monitoring of real crawls by scrapy crawl workers of tests/project against a real
redis-server and the test site: exact counts after a crawl, robots.txt denials counted once,
a SIGKILLed worker shown dead then forgotten, a stalled worker, SIGTERM drains (split from
lua/test_monitoring.py, which keeps the calls made directly against Redis)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from support import TEST_PROJECT, queued, read_items, start_worker, tail, wait_all, wait_until
from support import crawl_snapshot as snapshot

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import alerts
from scrapy_fleet.monitoring.sampler import sample
from testsite import generate_site


def status_text(redis_url: str, crawl: str) -> str:
    """``scrapy-fleet --redis URL status CRAWL``'s screen."""
    result = subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                             redis_url, "status", crawl], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_counts_after_a_crawl_with_a_known_share_of_403_are_exact(redis_url, site_factory,
                                                                 worker_env, tmp_path):
    pages = 60
    generate_site(tmp_path / "www", pages, 1, seed=5)
    # p/1.html and p/10.html .. p/19.html answer 403: 11 of the 60
    site = site_factory(tmp_path / "www",
                        behaviour={"failures": [{"prefix": "/site/p/1", "status": 403}]})
    banned = {i for i in range(pages) if str(i).startswith("1")}
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
    procs = [start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_JSONL_PATH": outs[n]},
        worker_env, tmp_path / f"w{n}.log", spider_args={"base": site.url, "n": pages})
        for n in range(2)]
    assert wait_all(procs, 180) == [0, 0], tail(tmp_path / "w0.log") + tail(tmp_path / "w1.log")
    items = read_items(outs)
    assert len(items) == pages - len(banned)
    snap = snapshot(redis_url, "many_starts")
    c = snap["counters"]
    assert c["pages"] == pages
    assert c["responses"] == {"1xx": 0, "2xx": pages - len(banned), "3xx": 0,
                              "4xx": len(banned), "5xx": 0}
    assert c["responses_by_status"] == {"200": pages - len(banned), "403": len(banned)}
    assert (c["items_scraped"], c["items_dropped"]) == (len(items), 0)
    assert c["bans"] == len(banned)
    assert c["requests"]["pushed"] == c["requests"]["acked"] == pages
    assert c["response_bytes"] > 0
    assert snap["rates"]["block_rate"] == round(len(banned) / pages, 6)
    host = "127.0.0.1"  # the politeness host key (FLEET_HOST_KEY "host": ports ignored)
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "many_starts")
    assert client.hmget(keys.hoststats, f"p|{host}", f"b|{host}") == [
        str(pages).encode(), str(len(banned)).encode()]
    assert snap["alerts"] == []  # 18 % of bans is under the 20 % threshold
    (alert,) = snapshot(redis_url, "many_starts",
                        alerts_config=alerts.AlertConfig(block_rate=0.15))["alerts"]
    assert (alert["id"], alert["where"]) == ("host_blocked", "host 127.0.0.1, crawl many_starts")
    assert alert["what"].startswith(f"{len(banned)} of {pages} responses from 127.0.0.1 ")
    assert snap["started_at"] <= alert["since"] <= snap["at"]
    # both workers left: no heartbeat key, not listed
    assert snap["workers"] == [] and client.keys(keys.worker_info("*")) == []
    # status --json and the screen show the same figures
    result = subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                             redis_url, "status", "many_starts", "--json"],
                            capture_output=True, text=True, timeout=60)
    data = json.loads(result.stdout)
    assert data["counters"] == c and data["schema"] == 2 and data["frontier"]["due"] == 0
    text = status_text(redis_url, "many_starts")
    assert f"4xx {len(banned)}" in text and f"403: {len(banned)}" in text, text
    assert f"bans {len(banned)}" in text


def test_robots_denials_are_counted_once_fleet_wide(redis_url, site_factory, worker_env,
                                                     tmp_path):
    pages = 30
    generate_site(tmp_path / "www", pages, 1, seed=9)
    site = site_factory(tmp_path / "www", behaviour={
        "robots": {"127.0.0.1": "User-agent: *\nDisallow: /site/p/1\n"}})
    denied = {i for i in range(pages) if str(i).startswith("1")}
    procs = [start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "ROBOTSTXT_OBEY": True},
        worker_env, tmp_path / f"w{n}.log", spider_args={"base": site.url, "n": pages})
        for n in range(2)]
    assert wait_all(procs, 180) == [0, 0], tail(tmp_path / "w0.log") + tail(tmp_path / "w1.log")
    c = snapshot(redis_url, "many_starts")["counters"]
    fetched = [r for r in site.requests() if r["path"].startswith("/site/p/")]
    assert len(fetched) == pages - len(denied)
    robots = [r for r in site.requests() if r["path"] == "/robots.txt"]
    assert c["robots_denied"] == len(denied)
    assert c["pages"] == len(fetched) + len(robots)
    assert c["items_scraped"] == pages - len(denied)


def _idle_worker(redis_url: str, worker_env: dict[str, str], log: Path,
                 **settings: object) -> subprocess.Popen[bytes]:
    return start_worker(TEST_PROJECT, "fetch", {"FLEET_REDIS_URL": redis_url,
                                                "FLEET_IDLE_TIMEOUT": None, **settings},
                        worker_env, log)


def test_a_sigkilled_worker_is_shown_dead_within_15_s_then_forgotten(redis_url, worker_env,
                                                                     tmp_path):
    log = tmp_path / "w.log"
    proc = _idle_worker(redis_url, worker_env, log, FLEET_WORKER_FORGET_AFTER=25)
    try:
        rows = wait_until(lambda: [w for w in snapshot(redis_url, "fetch")["workers"]
                              if w["health"] == "alive"], 60, "the worker's heartbeat")
    except AssertionError:
        proc.kill()
        raise AssertionError(tail(log)) from None
    row = rows[0]
    assert row["pid"] == proc.pid and row["state"] == "idle" and row["scrapy_version"]
    assert row["id"].startswith(f"{row['host']}:{proc.pid}:")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    seen = []  # (snapshot's time, the worker's last call, its health) from the kill on

    def dead() -> bool:
        s = snapshot(redis_url, "fetch")
        (w,) = [w for w in s["workers"] if w["id"] == row["id"]]
        seen.append((s["at"], w["last_seen"], w["health"]))
        return w["health"] == "dead"

    wait_until(dead, 60, "dead")
    # dead exactly when its last call is more than FLEET_WORKER_DEAD_AFTER (6 s) old, on
    # the snapshot's clock (Redis's): not later, whatever the pace of the polls
    assert len({last for _, last, _ in seen}) == 1  # no call after the kill
    assert alerts.AlertConfig().dead_after == 6
    assert all((health == "dead") == (at - last > 6) for at, last, health in seen
               if abs(at - last - 6) > 0.002), seen  # (both rounded to the ms)
    snap = snapshot(redis_url, "fetch")
    assert snap["workers_alive"] == 0
    assert any(a["id"] == "worker_dead" for a in snap["alerts"])
    assert f"{row['id']}  idle     dead" in status_text(redis_url, "fetch")
    # after FLEET_WORKER_FORGET_AFTER: no key and no entry left (issue 9, item 6)
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "fetch")
    wait_until(lambda: not client.exists(keys.worker_info(row["id"])), 40, "the key to expire")
    sample(client, keys, forget_after=25)
    assert snapshot(redis_url, "fetch")["workers"] == []
    assert client.zcard(keys.workers) == 0
    text = status_text(redis_url, "fetch")
    assert "workers    0 alive\n" in text and row["id"] not in text


def _push_pages(crawl: str, redis_url: str, base: str, n: int) -> FrontierAdmin:
    from scrapy import Request
    from scrapy.utils.request import fingerprint

    from scrapy_fleet import codec

    admin = FrontierAdmin(redis_url, crawl)
    urls = [f"{base}site/p/{i}.html" for i in range(n)]
    admin.push([(fingerprint(Request(u))[:12], 0, codec.encode(Request(u), None), 0,
                 "127.0.0.1") for u in urls])
    return admin


def test_a_worker_holding_leases_without_acknowledging_is_stalled(redis_url, site_factory,
                                                                  worker_env, tmp_path):
    generate_site(tmp_path / "www", 5, 1, seed=8)
    site = site_factory(tmp_path / "www")
    _push_pages("stuck", redis_url, site.url, 2)
    log = tmp_path / "w.log"
    proc = start_worker(TEST_PROJECT, "stuck", {"FLEET_REDIS_URL": redis_url,
                                                "FLEET_STALL_AFTER": 3}, worker_env, log)
    cfg = alerts.AlertConfig(stall_after=3)
    try:
        snap = wait_until(lambda: (s := snapshot(redis_url, "stuck", alerts_config=cfg))["workers"]
                     and s["workers"][0]["health"] == "stalled" and s, 60, "stalled")
    finally:
        proc.kill()
        proc.wait()
    (row,) = snap["workers"]
    assert row["leases"] == 2 and row["state"] == "fetching" and row["pid"] == proc.pid
    assert snap["counters"]["requests"]["acked"] == 0
    ids = {a["id"]: a for a in snap["alerts"]}
    assert {"fleet_stalled", "worker_stalled"} <= set(ids), (ids, tail(log))
    assert "no request acknowledged for" in ids["fleet_stalled"]["what"]
    assert ids["worker_stalled"]["where"] == f"worker {row['id']}, crawl stuck"


def test_sigterm_drains_within_the_drain_timeout_and_leaves_no_lease(redis_url, site_factory,
                                                                    worker_env, tmp_path):
    generate_site(tmp_path / "www", 20, 1, seed=6)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 60}]})
    admin = _push_pages("fetch", redis_url, site.url, 20)
    log = tmp_path / "w.log"
    proc = start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "FLEET_DRAIN_TIMEOUT": 5, "CONCURRENT_REQUESTS": 4,
        "FLEET_PREFETCH": 4, "FLEET_JSONL_PATH": tmp_path / "items.jsonl"}, worker_env, log)
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: any(w["downloads"] > 0 for w in snapshot(redis_url, "fetch")["workers"]),
              60, "downloads in flight")
    except AssertionError:
        proc.kill()
        raise AssertionError(tail(log)) from None
    assert client.zcard(admin.keys.leases) > 0
    os.kill(proc.pid, signal.SIGTERM)
    # the prefetched leases go back at once; the heartbeat says "draining"
    wait_until(lambda: proc.poll() is not None or [
        w for w in snapshot(redis_url, "fetch")["workers"]
        if w["state"] == "draining" and w["leases"] == w["downloads"]], 60, "draining")
    assert proc.poll() is None, "exited before it was seen draining:\n" + tail(log)
    assert wait_all([proc], 120) == [0], tail(log)
    # it left at FLEET_DRAIN_TIMEOUT, before any of the 60 s downloads had finished
    assert read_items([tmp_path / "items.jsonl"]) == []
    assert client.zcard(admin.keys.leases) == 0
    assert queued(client, admin.keys) == 20  # all back, none lost
    assert "(FLEET_DRAIN_TIMEOUT): releasing its" in tail(log, 20000)
    assert client.zcard(admin.keys.workers) == 0


def test_sigterm_on_a_fast_crawl_finishes_in_flight_work_and_exits_0(redis_url, site_factory,
                                                                    worker_env, tmp_path):
    generate_site(tmp_path / "www", 200, 1, seed=7)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.3}]})
    log = tmp_path / "w.log"
    out = tmp_path / "out.jsonl"
    proc = start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_JSONL_PATH": out},
        worker_env, log, spider_args={"base": site.url, "n": 200})
    wait_until(lambda: len(read_items([out], growing=True)) >= 10, 90, "some items")
    os.kill(proc.pid, signal.SIGTERM)
    assert wait_all([proc], 60) == [0], tail(log)
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "many_starts")
    assert client.zcard(keys.leases) == 0
    left = queued(client, keys)
    acked = int(client.hget(keys.stats, "acked") or 0)
    assert left > 0 and acked + left == int(client.hget(keys.stats, "pushed") or 0)
