"""The cockpit's data (scrapy_fleet/monitoring/): exact fleet-wide counters after real crawls,
heartbeats and worker health with real SIGKILL/SIGTERM, bounded keys and series, replays.

Everything runs against a real redis-server; crawls are real ``scrapy crawl`` processes
against the local test site.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import redis
from support import TEST_PROJECT, queued, read_items, start_worker, tail, wait_all, wait_until

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys import CrawlKeys
from scrapy_fleet.monitoring import alerts, series
from scrapy_fleet.monitoring.heartbeat import WorkerMonitor, error_kind, fleet_counters
from scrapy_fleet.monitoring.sampler import sample
from scrapy_fleet.monitoring.snapshot import counters_of, read_series, read_snapshot
from testsite import generate_site


def payload(cs: int | None = None, counters: dict[str, int] | None = None,
            hosts: list[list[object]] | None = None, forget_ms: int = 120_000,
            leases: int = 0, state: str = "idle") -> bytes:
    """ARGV[2] of a frontier call, as WorkerMonitor.payload builds it."""
    arg: dict[str, object] = {"hb": {"st": state, "l": leases, "h": "testhost", "pid": 1,
                                     "sa": 1.0},
                              "fa": forget_ms, "da": 15_000}
    if cs is not None:
        arg.update(cs=cs, c=counters or {}, hp=hosts or [])
    return msgpack.packb(arg, use_bin_type=False)


def snapshot(redis_url: str, crawl: str, **kwargs: object) -> dict:
    client = redis.Redis.from_url(redis_url)
    try:
        return read_snapshot(client, CrawlKeys("fleet", crawl), **kwargs)  # type: ignore[arg-type]
    finally:
        client.close()


def status_text(redis_url: str, crawl: str) -> str:
    """``scrapy-fleet --redis URL status CRAWL``'s screen."""
    result = subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                             redis_url, "status", crawl], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- counters: exact, atomic, once per op id -------------------------------------------------


def test_two_workers_adding_to_one_counter_concurrently_lose_nothing(redis_url):
    calls = 300

    def worker(name: str) -> None:
        admin = FrontierAdmin(redis_url, "conc")
        for n in range(1, calls + 1):
            admin.call(CallBatch(beat=True), worker=name,
                       monitor=payload(n, {"resp/200": 1, "pages": 1, "items_scraped": 2},
                                       [["h.test", 1, 0]]))
        admin.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}:1:1",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = snapshot(redis_url, "conc")["counters"]
    assert (c["pages"], c["responses"]["2xx"], c["items_scraped"]) == (600, 600, 1200)
    client = redis.Redis.from_url(redis_url)
    assert client.hget(CrawlKeys("fleet", "conc").hoststats, "p|h.test") == b"600"


def test_a_replayed_call_counts_once(redis_url):
    admin = FrontierAdmin(redis_url, "replay")
    arg = payload(1, {"resp/200": 3, "pages": 3})
    first = admin.call(CallBatch(beat=True), worker="w:1:1", op_id="op-1", monitor=arg)
    again = admin.call(CallBatch(beat=True), worker="w:1:1", op_id="op-1", monitor=arg)
    assert first.now_ms == again.now_ms  # the cached reply: the script did not run again
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 3
    # the same batch resent with a new op id (every retry of a call failed after the script
    # ran): its sequence number was applied already, so it is skipped
    admin.call(CallBatch(beat=True), worker="w:1:1", monitor=arg)
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 3
    admin.call(CallBatch(beat=True), worker="w:1:1", monitor=payload(2, {"pages": 1}))
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 4


def test_a_bad_monitoring_argument_is_refused_before_any_write(redis_url):
    admin = FrontierAdmin(redis_url, "bad")
    admin.push([(b"a" * 12, 0, b"x", 0, "h")])
    client = redis.Redis.from_url(redis_url)
    before = client.hgetall(admin.keys.stats)
    for arg in (b"\xc1", msgpack.packb({"c": {"evil": 1}, "cs": 1}),
                msgpack.packb({"c": {"pages": -5}, "cs": 1}),
                msgpack.packb({"hb": {"st": "x" * 500}})):
        with pytest.raises(redis.ResponseError, match="fleet: "):
            admin.call(CallBatch(take=1), worker="w:1:1", monitor=arg)
    assert client.hgetall(admin.keys.stats) == before
    assert client.zcard(admin.keys.leases) == 0  # the take did not run either


def test_a_monitoring_key_of_another_type_is_one_clear_error_and_changes_nothing(redis_url):
    admin = FrontierAdmin(redis_url, "foreign")
    admin.push([(b"f" * 12, 0, b"x", 0, "h")])
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    client.set(keys.mon, "not ours")
    client.set(keys.hostbans, "not ours either")
    client.delete(keys.series("1m"))
    client.lpush(keys.series("1m"), "a list")
    with pytest.raises(redis.ResponseError, match=r"fleet:\{foreign\}:mon holds a string"):
        admin.call(CallBatch(take=1), worker="w:1:1", monitor=payload())
    assert (queued(client, keys), client.zcard(keys.leases)) == (1, 0)
    snap = snapshot(redis_url, "foreign")  # status still reads what it can
    assert snap["frontier"]["due"] == 1 and snap["started_at"] is None
    client.delete(keys.mon, keys.hostbans)
    admin.call(CallBatch(take=1), worker="w:1:1", monitor=payload())  # a ring of the wrong
    assert client.strlen(keys.series("1m")) == series.tier_bytes("1m")  # type starts afresh


def test_worker_monitor_resends_an_unconfirmed_batch_unchanged():
    class Stats:
        def __init__(self) -> None:
            self.values: dict[str, int] = {}

        def get_stats(self) -> dict[str, int]:
            return dict(self.values)

    class Config:
        ban_statuses = (403,)
        worker_dead_after = 15.0
        worker_forget_after = 120.0
        role = "all"

    stats = Stats()
    mon = WorkerMonitor(stats, Config(), 1.0, "vm", 7)
    stats.values = {"downloader/response_status_count/200": 4,
                    "downloader/response_status_count/403": 1, "item_scraped_count": 4}
    first = msgpack.unpackb(mon.payload("fetching", 2, 1))
    stats.values["downloader/response_status_count/200"] = 9  # more came since
    resent = msgpack.unpackb(mon.payload("fetching", 2, 1))  # the first call failed
    assert (resent["cs"], resent["c"]) == (first["cs"], first["c"]) == (
        1, {"resp/200": 4, "resp/403": 1, "pages": 5, "bans": 1, "items_scraped": 4})
    mon.confirmed()
    nxt = msgpack.unpackb(mon.payload("fetching", 2, 1))
    assert (nxt["cs"], nxt["c"]) == (2, {"resp/200": 5, "pages": 5})


def test_monitoring_settings_are_checked_once_with_clear_errors():
    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.errors import FleetConfigError

    config = FleetConfig.from_settings({"FLEET_BAN_STATUSES": "403, 451",
                                        "FLEET_ALERT_BLOCK_RATE": "0.5"})
    assert config.ban_statuses == (403, 451) and config.alert_block_rate == 0.5
    assert alerts.AlertConfig.from_config(config).block_rate == 0.5
    for settings, fragment in (
            ({"FLEET_HEARTBEAT_INTERVAL": 20}, "FLEET_HEARTBEAT_INTERVAL=20 is invalid: "
                                               "expected seconds < FLEET_WORKER_DEAD_AFTER"),
            ({"FLEET_WORKER_FORGET_AFTER": 5}, "FLEET_WORKER_FORGET_AFTER=5 is invalid"),
            ({"FLEET_BAN_STATUSES": [403, 999]}, "FLEET_BAN_STATUSES=[403, 999] is invalid"),
            ({"FLEET_ALERT_BLOCK_RATE": 2}, "FLEET_ALERT_BLOCK_RATE=2 is invalid"),
            ({"FLEET_DRAIN_TIMEOUT": -1}, "FLEET_DRAIN_TIMEOUT=-1 is invalid")):
        with pytest.raises(FleetConfigError, match=re.escape(fragment)):
            FleetConfig.from_settings(settings)


def test_stats_map_to_fleet_counters():
    got = fleet_counters({
        "downloader/response_status_count/200": 10, "downloader/response_status_count/429": 2,
        "downloader/response_status_count/403": 3, "item_dropped_count": 1,
        "downloader/exception_type_count/twisted.internet.error.DNSLookupError": 2,
        "downloader/exception_type_count/twisted.internet.error.TimeoutError": 1,
        "downloader/exception_type_count/builtins.ValueError": 1,
        "downloader/response_bytes": 1234, "fleet/proxy/verdict/ban": 2,
        "fleet/politeness/robots_disallowed": 5, "start_time": 3.5}, (403,))
    assert got == {"resp/200": 10, "resp/429": 2, "resp/403": 3, "pages": 15, "bans": 3,
                   "rate_limited": 2, "items_dropped": 1, "errors/dns": 2,
                   "errors/timeout": 1, "errors/other": 1, "response_bytes": 1234,
                   "proxy_bans": 2, "robots_denied": 5}
    assert error_kind("twisted.internet.error.ConnectionRefusedError") == "connection"
    assert error_kind("OpenSSL.SSL.Error") == "tls"
    # Scrapy 2.19 raises its own download exceptions (a fresh-user trial saw them as "other")
    assert [error_kind(f"scrapy.exceptions.{name}") for name in (
        "DownloadConnectionRefusedError", "CannotResolveHostError", "DownloadTimeoutError",
        "DownloadFailedError")] == ["connection", "dns", "timeout", "connection"]


def test_offsite_filtered_requests_are_counted_as_such_not_as_download_errors():
    # issue 19: a request OffsiteMiddleware filters raises IgnoreRequest, which Scrapy's
    # DownloaderStats counts as an exception: it was shown as a download error "other"
    stats = {"downloader/exception_type_count/scrapy.exceptions.IgnoreRequest": 4,
             "offsite/filtered": 4, "offsite/domains": 1,
             "downloader/exception_type_count/builtins.ValueError": 1}
    got = fleet_counters(stats, (403,))
    assert got == {"errors/offsite": 4, "errors/other": 1}
    c = counters_of(got)
    assert c["download_errors"] == {"timeout": 0, "dns": 0, "connection": 0, "tls": 0,
                                    "other": 1}
    assert c["offsite_filtered"] == 4
    # a subclass raised for a failure (a proxy that banned it through every exit) stays one
    assert fleet_counters({"downloader/exception_type_count/scrapy_fleet.proxies."
                           "ProxyBanError": 2}, (403,)) == {"errors/other": 2}


def test_a_worker_waiting_with_no_live_proxy_exit_raises_proxy_no_exit():
    snap = {"crawl": "c", "at": 1000.0, "runnable_now": 1, "started_at": 900.0,
            "last_ack_at": 990.0, "redis": {"used_memory": 0, "maxmemory": 0},
            "frontier": {"due": 0, "scheduled": 0, "leased": 3, "parked": 0, "dead": 0},
            "workers": [{"id": "w1", "health": "alive", "state": "no_exit", "leases": 3,
                         "last_ack": 950.0, "host": "h", "pid": 1, "last_seen": 999.0},
                        {"id": "w2", "health": "alive", "state": "fetching", "leases": 0,
                         "last_ack": 990.0, "host": "h", "pid": 2, "last_seen": 999.0}]}
    (alert,) = alerts.evaluate(snap, [], [], alerts.AlertConfig())
    assert (alert["id"], alert["severity"], alert["since"]) == ("proxy_no_exit", "critical",
                                                                 950.0)
    assert alert["what"].startswith("1 worker(s) hold requests waiting for a proxy exit")
    snap["workers"][0]["health"] = "dead"  # a dead worker's last state raises nothing new
    assert [a["id"] for a in alerts.evaluate(snap, [], [], alerts.AlertConfig())] == [
        "worker_dead"]


# -- a real crawl: exact counts ---------------------------------------------------------------


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
    assert data["counters"] == c and data["schema"] == 1 and data["queued"] == 0
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


# -- heartbeats and health --------------------------------------------------------------------


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
    # dead exactly when its last call is more than FLEET_WORKER_DEAD_AFTER (15 s) old, on
    # the snapshot's clock (Redis's): not later, whatever the pace of the polls
    assert len({last for _, last, _ in seen}) == 1  # no call after the kill
    assert alerts.AlertConfig().dead_after == 15
    assert all((health == "dead") == (at - last > 15) for at, last, health in seen
               if abs(at - last - 15) > 0.002), seen  # (both rounded to the ms)
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


#: FLEET_WORKER_FORGET_AFTER of the churn test's calls (ms): a worker id silent that long is
#: forgotten by the next call
CHURN_FORGET_MS = 1500


# pause: seconds between two churned calls; 0.01 stands for a machine on which the 200 calls
# take longer than CHURN_FORGET_MS (a loaded one: 190 ids were still listed, not 201)
@pytest.mark.parametrize("pause", [0.0, 0.01], ids=["fast", "slow"])
def test_churned_worker_ids_leave_no_keys_behind(redis_url, pause):
    # (max_leases: the 29 entries' leases expire and are reclaimed, by the churned workers'
    # calls too, as often as a slow machine makes them; none may become a dead letter, which
    # would add the crawl-wide `dead` key that this test does not expect)
    params = FrontierParams(op_ttl=1.0, max_leases=10_000)
    resident = FrontierAdmin(redis_url, "churn", params=params)
    resident.push([(bytes([i]) * 12, 0, b"x", 0, "h.test") for i in range(1, 30)])
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    client = redis.Redis.from_url(redis_url)
    registered = []  # per churned worker: was it in the worker list, with its info, at once?

    def churn(names: range) -> None:
        for n in names:  # each leases a request and vanishes, like a SIGKILLed worker
            admin = FrontierAdmin(redis_url, "churn",
                                  params=FrontierParams(op_ttl=1.0, lease_timeout=1.0,
                                                        max_leases=10_000))
            worker = f"gone{n}:{n}:1"
            admin.call(CallBatch(take=1), worker=worker,
                       monitor=payload(1, {"pages": 1}, [[f"h{n}.test", 1, 1]],
                                       forget_ms=CHURN_FORGET_MS))
            # (checked after its own call, not after all 200: a call forgets the ids silent
            # for CHURN_FORGET_MS, and how many calls fit in that depends on the machine)
            registered.append(client.zscore(resident.keys.workers, worker) is not None
                              and client.exists(resident.keys.worker_info(worker)) == 1)
            admin.close()
            time.sleep(pause)

    churn(range(1))  # the crawl-wide keys it creates (stats, hoststats, expiries...) stay
    time.sleep(CHURN_FORGET_MS / 1000 + 1)
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    baseline = sorted(client.keys("*"))
    churn(range(1, 201))
    assert registered == [True] * 201
    # (at least CHURN_FORGET_MS after the last churned call, and the leases' 1 s)
    time.sleep(CHURN_FORGET_MS / 1000 + 1)
    # the resident's next call reclaims the expired leases and forgets the departed ids
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    keys_now = sorted(client.keys("*"))

    def others(names: list[bytes]) -> list[bytes]:
        return [k for k in names if b":op:" not in k]

    assert others(keys_now) == others(baseline)
    assert len(keys_now) - len(others(keys_now)) <= 1  # the resident's last reply only
    assert client.zcard(resident.keys.workers) == 1
    assert client.hlen(resident.keys.wlive) == 0 and client.zcard(resident.keys.leases) == 0
    assert snapshot(redis_url, "churn")["counters"]["pages"] == 201


# -- series ----------------------------------------------------------------------------------


def test_series_have_fixed_bytes_whatever_the_crawl(redis_url):
    admin = FrontierAdmin(redis_url, "ser")
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    admin.push([(b"s" * 12, 0, b"x", 0, "h")])
    sizes = {t: client.strlen(keys.series(t)) for t in series.TIERS}
    assert sizes == {t: series.tier_bytes(t) for t in series.TIERS}
    assert sum(sizes.values()) == (360 + 1440 + 1008) * 80 < 1_000_000
    for chunk in range(20):  # 10,000 entries on 1,000 hosts, 100 workers
        admin.push([(f"{chunk:04d}{i:08d}".encode(), 0, b"x", 0, f"h{i % 1000}")
                    for i in range(500)])
    for n in range(100):
        admin.call(CallBatch(beat=True), worker=f"w{n}:1:1", monitor=payload(1, {"pages": 1}))
    assert {t: client.strlen(keys.series(t)) for t in series.TIERS} == sizes
    points = read_series(client, keys, "depth_due")
    assert len(points) == 360
    # one sample per 10 s step fleet-wide (the test spans one or two steps), each the depth
    # then; none before the crawl began
    values = [v for _, v in points if v is not None]
    assert 1 <= len(values) <= 2 and values[0] == 1.0 and values == sorted(values)
    assert values[-1] <= 10_001
    assert not sample(client, keys)  # this step has its sample: no second one fleet-wide
    with pytest.raises(ValueError, match="unknown series"):
        read_series(client, keys, "nope")


def test_series_decode_keeps_only_the_current_lap():
    step, points = series.TIERS["10s"]
    now = 1_800_000_000.0
    raw = bytearray(series.tier_bytes("10s"))

    def put(t: float, pages: int, bans: int) -> None:
        slot = int(t * 1000) // (step * 1000)
        values = [int(t * 1000), 5, 0, 1, 0, 0, pages, pages, bans, 2]
        series._SLOT.pack_into(raw, (slot % points) * series.SLOT_BYTES, *values)

    put(now - 20, 100, 0)
    put(now - 10, 160, 6)
    put(now - 30 - step * points, 7, 7)  # an old lap still in its slot: ignored
    samples = series.decode(bytes(raw), "10s", now)
    assert [s.pages for s in samples] == [100, 160]
    rates = series.points_of(samples, "pages_per_min")
    assert rates == [(now - 20, None), (now - 10, 360.0)]
    assert series.points_of(samples, "block_rate")[1][1] == 0.1


def _ring(samples: list[tuple[float, int, int]]) -> bytes:
    """A 10 s ring holding (t, due, pages) samples, as lua/monitoring.lua writes them."""
    step, points = series.TIERS["10s"]
    raw = bytearray(series.tier_bytes("10s"))
    for t, due, pages in samples:
        slot = int(t * 1000) // (step * 1000)
        series._SLOT.pack_into(raw, (slot % points) * series.SLOT_BYTES,
                               int(t * 1000), due, 0, 0, 0, 0, pages, pages // 2, 0, 1)
    return bytes(raw)


def test_rates_of_a_young_crawl_are_over_its_age(redis_url):
    # issue 19: on a 30 s old crawl pages/min was the count of the last 60 s (half the
    # rate); and (next test) the ETA read "-" while the queue fell from 16k to 6k (it
    # compared the depth with the first sample, taken when the push had barely begun)
    admin = FrontierAdmin(redis_url, "young")
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(6000)])
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "young")
    sec, usec = client.time()
    now = sec + usec / 1e6
    client.set(keys.series("10s"), _ring([(now - 30, 100, 0), (now - 20, 16000, 500),
                                          (now - 10, 11000, 1000)]))
    client.hset(keys.stats, mapping={"pages": 1500, "items_scraped": 750})
    snap = read_snapshot(client, keys)
    rates, window = snap["rates"], snap["at"] - (now - 30)  # the crawl's age: its 1st sample
    assert rates["pages_per_min"] == pytest.approx(1500 * 60 / window, rel=1e-3)
    assert rates["items_per_min"] == pytest.approx(750 * 60 / window, rel=1e-3)
    assert rates["window_s"] == pytest.approx(window, abs=0.1)
    client.close()


def test_the_eta_shows_as_soon_as_the_queue_falls(redis_url):
    admin = FrontierAdmin(redis_url, "falling")
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(6000)])
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "falling")
    sec, usec = client.time()
    now = sec + usec / 1e6
    client.set(keys.series("10s"), _ring([(now - 30, 100, 0), (now - 20, 16000, 500),
                                          (now - 10, 11000, 1000)]))
    client.hset(keys.stats, "pages", 1500)  # pages fetched (what the workers counted)
    snap = read_snapshot(client, keys)
    window = snap["at"] - (now - 30)
    # 16000 -> 6000 in 20 s since the peak: 6000 more take 12 s
    assert snap["frontier"]["depth"] == 6000
    assert snap["eta_seconds"] == pytest.approx(6000 * (now + window - 30 - (now - 20))
                                                / 10000, abs=0.5)
    # a queue that fell, then no page fetched over the last minute (no worker left): no ETA
    client.set(keys.series("10s"), _ring([(now - 80, 100, 0), (now - 70, 16000, 500),
                                          (now - 60, 11000, 1500), (now - 1, 6000, 1500)]))
    stalled = read_snapshot(client, keys)
    assert stalled["rates"]["pages_per_min"] == 0 and stalled["eta_seconds"] is None
    # a queue that does not fall has no ETA
    client.set(keys.series("10s"), _ring([(now - 20, 100, 0), (now - 10, 5000, 10)]))
    assert read_snapshot(client, keys)["eta_seconds"] is None
    client.close()


# -- runnable_now -----------------------------------------------------------------------------


def test_runnable_now_counts_what_the_caps_let_run(redis_url):
    params = FrontierParams(host_concurrency=2)
    admin = FrontierAdmin(redis_url, "run", params=params)
    client = redis.Redis.from_url(redis_url)
    client.hset(admin.keys.config, "host_concurrency", 2)  # as the workers write it
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(1000)])
    assert snapshot(redis_url, "run")["runnable_now"] == 2  # 1000 queued, capped at 2
    for _ in range(3):  # a capped host's slots are shared among the live workers: one first
        admin.call(CallBatch(take=10), worker="w:1:1", monitor=payload())
    snap = snapshot(redis_url, "run")
    assert (snap["frontier"]["leased"], snap["runnable_now"]) == (2, 2)  # never 0 in flight
    admin.push([(f"x{i:011d}".encode(), 0, b"x", 0, f"h{i}.test") for i in range(50)])
    assert snapshot(redis_url, "run")["runnable_now"] == 52


# -- alerts -----------------------------------------------------------------------------------


def test_no_worker_alert_says_what_where_and_what_next(redis_url):
    admin = FrontierAdmin(redis_url, "lonely")
    admin.push([(b"l" * 12, 0, b"x", 0, "h")])
    (alert,) = snapshot(redis_url, "lonely")["alerts"]
    assert alert["id"] == "no_worker" and alert["severity"] == "critical"
    assert "1 request(s) wait" in alert["what"] and alert["where"] == "crawl lonely"
    assert alert["next"].startswith("start workers: scrapy crawl")


def _sample(t: float, depth: int, dead: int = 0) -> series.Sample:
    return series.Sample(t, depth, 0, 0, 0, dead, 0, 0, 0, 1)


def test_alerts_on_growing_depth_blocked_host_dead_letters_and_memory():
    now = 1_800_000_000.0
    snap = {"crawl": "c", "at": now, "runnable_now": 3, "started_at": now - 3600,
            "last_ack_at": now - 1, "last_worker_at": now,
            "frontier": {"due": 300, "scheduled": 0, "leased": 2, "parked": 0, "dead": 4},
            "workers": [{"id": "w", "health": "alive", "leases": 2, "host": "vm", "pid": 1,
                         "last_seen": now, "last_ack": now - 1}],
            "redis": {"used_memory": 95, "maxmemory": 100}}
    samples = [_sample(now - 60 * (11 - i), 100 + 10 * i, dead=1 if i < 5 else 4)
               for i in range(11)]
    host = {"host": "x.test", "pages": 100, "bans": 40, "block_rate": 0.4,
            "first_ban": now - 50}
    got = {a["id"]: a for a in alerts.evaluate(snap, samples, [host], alerts.AlertConfig())}
    assert set(got) == {"depth_growing", "host_blocked", "dead_letters_growing",
                        "redis_memory"}
    assert got["depth_growing"]["since"] == now - 660
    assert "from 100 to 200" in got["depth_growing"]["what"]
    assert got["host_blocked"]["where"].startswith("host x.test")
    assert got["host_blocked"]["since"] == now - 50
    assert got["dead_letters_growing"]["next"] == "scrapy fleet dead c"
    assert next(iter(got)) == "redis_memory"  # critical first
    stalled = dict(snap, last_ack_at=now - 500)
    ids = [a["id"] for a in alerts.evaluate(stalled, [], [], alerts.AlertConfig())]
    assert "fleet_stalled" in ids


def test_a_dead_workers_alert_tells_whether_its_leases_are_still_out():
    # its row keeps the lease count of its last call; once nothing is leased fleet-wide the
    # alert must not say they will go back (fresh-user trial: a finished crawl said so)
    now = 1_800_000_000.0
    dead = {"id": "w", "health": "dead", "leases": 1, "host": "vm", "pid": 7,
            "last_seen": now - 60, "last_ack": now - 61}
    snap = {"crawl": "c", "at": now, "runnable_now": 0, "started_at": now - 3600,
            "last_ack_at": now - 1, "last_worker_at": now, "workers": [dead],
            "frontier": {"due": 0, "scheduled": 0, "leased": 0, "parked": 0, "dead": 0},
            "redis": {"used_memory": 1, "maxmemory": 0}}

    def what(**frontier: int) -> str:
        s = dict(snap, frontier={**snap["frontier"], **frontier})
        (alert,) = [a for a in alerts.evaluate(s, [], [], alerts.AlertConfig())
                    if a["id"] == "worker_dead"]
        return alert["what"]

    assert what() == ("worker w stopped calling the frontier; the 1 lease(s) it held at its "
                      "last call have gone back to the queue (none is leased now)")
    assert what(leased=3).endswith("go back to the queue when they expire")
    snap["workers"] = [dict(dead, leases=0)]
    assert what(leased=3).endswith("it held no lease")


# -- SIGTERM: drain -------------------------------------------------------------------------


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
