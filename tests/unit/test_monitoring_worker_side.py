"""The worker's side of monitoring and the views' rules, with no Redis: the heartbeat's
resend of an unconfirmed batch, the monitoring settings, Scrapy stats mapped to fleet
counters, error kinds, the series' decoding and the alerts' rules on literal samples
(split from lua/test_monitoring.py, which keeps what runs against a real redis-server)."""

from __future__ import annotations

import re

import msgpack
import pytest

from scrapy_fleet.monitoring import alerts, series
from scrapy_fleet.monitoring.heartbeat import WorkerMonitor, error_kind, fleet_counters
from scrapy_fleet.monitoring.snapshot import counters_of


def test_worker_monitor_resends_an_unconfirmed_batch_unchanged():
    from scrapy_fleet.monitoring.settings import MonitoringConfig
    from scrapy_fleet.stages.settings import StageConfig

    class Stats:
        def __init__(self) -> None:
            self.values: dict[str, int] = {}

        def get_stats(self) -> dict[str, int]:
            return dict(self.values)

    class Config:
        ban_statuses = (403,)
        monitoring = MonitoringConfig(worker_dead_after=15.0, worker_forget_after=120.0)
        stages = StageConfig(role="all")

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
    assert config.ban_statuses == (403, 451) and config.monitoring.alert_block_rate == 0.5
    assert alerts.AlertConfig.from_config(config.monitoring).block_rate == 0.5
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
            "frontier": {"due": 0, "deferred": 0, "leased": 3, "parked": 0, "dead": 0},
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


def _sample(t: float, depth: int, dead: int = 0) -> series.Sample:
    return series.Sample(t, depth, 0, 0, 0, dead, 0, 0, 0, 1)


def test_alerts_on_growing_depth_blocked_host_dead_letters_and_memory():
    now = 1_800_000_000.0
    snap = {"crawl": "c", "at": now, "runnable_now": 3, "started_at": now - 3600,
            "last_ack_at": now - 1, "last_worker_at": now,
            "frontier": {"due": 300, "deferred": 0, "leased": 2, "parked": 0, "dead": 4},
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
            "frontier": {"due": 0, "deferred": 0, "leased": 0, "parked": 0, "dead": 0},
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
