"""The cockpit's views on snapshots of the contract's shape (docs/monitoring.md): the
Prometheus families, the rich frame of ``top``, and the HTTP routes of the monitor.

The snapshots here are literal dicts of the read API's shape, so each expected value is
known; tests/e2e/test_monitoring_live.py runs the same views on a real crawl."""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from scrapy_fleet.monitoring import metrics, server, top
from scrapy_fleet.monitoring.source import Points

SNAPSHOT: dict[str, Any] = {
    "schema": 2,
    "crawl": "docs",
    "at": 1764582000.123,
    "frontier": {"due": 12, "deferred": 3, "leased": 8, "parked": 0, "dead": 1,
                 "failed": 0, "seen": 5012, "size": 23},
    "counters": {
        "responses": {"1xx": 0, "2xx": 4900, "3xx": 20, "4xx": 80, "5xx": 2},
        "pages": 5002,
        "items_scraped": 4900, "items_dropped": 7,
        "download_errors": {"timeout": 1, "dns": 0, "connection": 2, "other": 0},
        "requests": {"pushed": 5100, "duplicate": 40000, "leased": 5020, "acked": 5000,
                     "reclaimed": 12, "dead_lettered": 1},
        "bans": 80, "rate_limited": 3, "robots_denied": 4, "response_bytes": 123456789,
    },
    "rates": {"pages_per_min": 612.0, "items_per_min": 600.0, "block_rate": 0.016},
    "eta_seconds": 95.0,
    "runnable_now": 4,
    "workers": [
        {"id": "vm:123:1764581000", "host": "vm", "pid": 123, "started_at": 1764581000.0,
         "state": "fetching", "health": "alive", "leases": 16, "downloads": 8, "pages": 1000,
         "items": 990, "errors": 0, "scrapy_version": "2.19.0", "fleet_version": "0.1.0",
         "last_seen": 1764581999.0},
        {"id": "vm:124:1764581001", "host": "vm", "pid": 124, "started_at": 1764581001.0,
         "state": "idle", "health": "stalled", "leases": 2, "downloads": 0, "pages": 10,
         "items": 9, "errors": 1, "scrapy_version": "2.19.0", "fleet_version": "0.1.0",
         "last_seen": 1764581990.0},
        {"id": "vm:99:1764580000", "host": "vm", "pid": 99, "started_at": 1764580000.0,
         "state": "fetching", "health": "dead", "leases": 0, "downloads": 5, "pages": 3,
         "items": 3, "errors": 0, "scrapy_version": "2.19.0", "fleet_version": "0.1.0",
         "last_seen": 1764581900.0},
    ],
    "workers_alive": 1,
    # (adaptive politeness: 127.0.0.1:8000 was refused with 503 twice, 20 -> 10 -> 5/s)
    "hosts": [{"host": f"127.0.0.{n}:8000", "queued": 10 - n, "leased": 1, "pages": 100 * n,
               "bans": n, "block_rate": n / 1000, "hold_until": None,
               "adaptive_rate": 5.0 if n == 1 else 20.0, "ceiling": 20.0,
               "learned_rate": 5.0 if n == 1 else None, "capacity": 10.0 if n == 1 else None,
               "last_decrease": "503" if n == 1 else None,
               "last_decrease_at": 1764581940.0 if n == 1 else None,
               "decreases": 2 if n == 1 else 0, "adaptive_cap": 0} for n in range(1, 8)],
    "alerts": [{"id": "block_rate", "severity": "warning", "what": "block rate 4 % on host",
                "where": "host 127.0.0.3:8000", "since": 1764581900.0,
                "next": "scrapy fleet status docs --hosts"},
               {"id": "block_rate", "severity": "warning", "what": "block rate 5 % on host",
                "where": "host 127.0.0.4:8000", "since": 1764581910.0, "next": "..."},
               {"id": "no_worker", "severity": "critical", "what": "no worker alive",
                "where": "crawl docs", "since": 1764581800.0, "next": "scrapy crawl docs"}],
    "redis": {"used_memory": 3400000, "maxmemory": 0},
    "hosts_total": 7, "hosts_sampled": False, "hosts_ready": 5,
    "started_at": 1764581000.0, "last_ack_at": 1764581999.5, "last_worker_at": 1764581999.0,
    "idle_seconds": None, "start_requests": {"state": "done", "seeded_by": "vm:123:1764581000"},
}

SERIES: dict[str, Points] = {
    "depth_due": [(1764581950.0, 30.0), (1764581960.0, None), (1764581970.0, 20.0),
                  (1764581980.0, 12.0)],
    "depth_leased": [(1764581950.0, 8.0), (1764581960.0, None), (1764581970.0, 8.0),
                     (1764581980.0, 8.0)],
    "pages_per_min": [(1764581950.0, 0.0), (1764581960.0, 300.0), (1764581970.0, 600.0),
                      (1764581980.0, 612.0)],
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parsed exposition: (sample name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exposition(snap: dict[str, Any], host_metrics: int = 0) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry(DictSource(snap), host_metrics)).decode()


class DictSource:
    """A data source that returns a given snapshot (or raises *error*): the views' input."""

    def __init__(self, snap: dict[str, Any], series: dict[str, Points] | None = None,
                 error: Exception | None = None) -> None:
        self.snap = snap
        self.series_data = series if series is not None else SERIES
        self.error = error
        self.error_since: float | None = None
        self.tiers = {"10s": (10, 360), "1m": (60, 1440), "10m": (600, 1008)}
        self.reads = 0

    def snapshot(self) -> dict[str, Any]:
        self.reads += 1
        if self.error is not None:
            self.error_since = self.error_since or 1764582001.0
            raise self.error
        return copy.deepcopy(self.snap)

    def series(self, names: Iterable[str], tier: str = "10s",
               since_s: float | None = None) -> dict[str, Points]:
        names = list(names)
        if tier not in self.tiers:
            raise ValueError(f"unknown tier {tier!r}")
        for name in names:
            if not name.startswith(("depth_", "pages_", "items_", "block_", "workers_")):
                raise ValueError(f"unknown series {name}")
        if self.error is not None:
            raise self.error
        return {name: [p for p in self.series_data.get(name, [])
                       if since_s is None or p[0] >= since_s] for name in names}


# -- /metrics ------------------------------------------------------------------------------


def test_metrics_carry_the_snapshot_exactly_with_prometheus_names():
    got = samples(exposition(SNAPSHOT))
    assert got[("scrapy_fleet_up", ())] == 1
    assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 12
    assert got[("scrapy_fleet_frontier_requests", (("state", "deferred"),))] == 3
    assert got[("scrapy_fleet_frontier_requests", (("state", "dead"),))] == 1
    assert got[("scrapy_fleet_dupefilter_fingerprints", ())] == 5012
    assert got[("scrapy_fleet_runnable_requests", ())] == 4
    for status_class, n in SNAPSHOT["counters"]["responses"].items():
        assert got[("scrapy_fleet_responses_total", (("status_class", status_class),))] == n
    assert got[("scrapy_fleet_pages_total", ())] == 5002
    assert got[("scrapy_fleet_items_total", (("outcome", "scraped"),))] == 4900
    assert got[("scrapy_fleet_items_total", (("outcome", "dropped"),))] == 7
    assert got[("scrapy_fleet_download_errors_total", (("kind", "connection"),))] == 2
    assert got[("scrapy_fleet_requests_total", (("event", "duplicate"),))] == 40000
    assert got[("scrapy_fleet_requests_total", (("event", "dead_lettered"),))] == 1
    assert got[("scrapy_fleet_bans_total", ())] == 80
    assert got[("scrapy_fleet_rate_limited_total", ())] == 3
    assert got[("scrapy_fleet_robots_denied_total", ())] == 4
    assert got[("scrapy_fleet_response_bytes_total", ())] == 123456789
    assert got[("scrapy_fleet_pages_per_second", ())] == pytest.approx(612 / 60)
    assert got[("scrapy_fleet_items_per_second", ())] == pytest.approx(10.0)
    assert got[("scrapy_fleet_block_ratio", ())] == pytest.approx(0.016)
    assert got[("scrapy_fleet_eta_seconds", ())] == 95
    assert got[("scrapy_fleet_workers", (("health", "alive"),))] == 1
    assert got[("scrapy_fleet_workers", (("health", "stalled"),))] == 1
    assert got[("scrapy_fleet_workers", (("health", "dead"),))] == 1
    # the dead worker's state and downloads are not counted
    assert got[("scrapy_fleet_workers_by_state", (("state", "fetching"),))] == 1
    assert got[("scrapy_fleet_workers_by_state", (("state", "idle"),))] == 1
    assert got[("scrapy_fleet_downloads_active", ())] == 8
    assert got[("scrapy_fleet_alerts", (("alert", "block_rate"), ("severity", "warning")))] == 2
    assert got[("scrapy_fleet_alerts", (("alert", "no_worker"), ("severity", "critical")))] == 1
    assert got[("scrapy_fleet_redis_used_memory_bytes", ())] == 3400000
    assert got[("scrapy_fleet_hosts", ())] == 7 and got[("scrapy_fleet_hosts_ready", ())] == 5
    assert got[("scrapy_fleet_last_ack_timestamp_seconds", ())] == 1764581999.5
    assert got[("scrapy_fleet_snapshot_timestamp_seconds", ())] == pytest.approx(1764582000.123)
    # bounded: nothing names a host or a worker unless asked for
    labels = {name for (_, ls) in got for name, _ in ls}
    assert labels <= {"state", "status_class", "outcome", "kind", "event", "health", "alert",
                      "severity"}
    assert all(name.startswith("scrapy_fleet_") for name, _ in got)


def test_null_rates_have_no_sample_and_missing_data_reads_zero():
    snap = copy.deepcopy(SNAPSHOT)
    snap["rates"] = {"pages_per_min": 0.0, "items_per_min": 0.0, "block_rate": None}
    snap["eta_seconds"] = None
    snap["counters"]["responses"] = {}
    got = samples(exposition(snap))
    assert ("scrapy_fleet_block_ratio", ()) not in got
    assert ("scrapy_fleet_eta_seconds", ()) not in got
    assert got[("scrapy_fleet_pages_per_second", ())] == 0
    assert got[("scrapy_fleet_responses_total", (("status_class", "2xx"),))] == 0


def test_host_metrics_are_opt_in_and_capped():
    many = copy.deepcopy(SNAPSHOT)
    many["hosts"] = [{"host": f"h{n}.example", "queued": 1000 - n, "leased": 0, "pages": n,
                      "bans": 0, "block_rate": None, "hold_until": None} for n in range(200)]
    base = samples(exposition(many))
    assert not any(name.startswith("scrapy_fleet_host_") for name, _ in base)
    three = samples(exposition(many, host_metrics=3))
    hosts = {dict(ls)["host"] for name, ls in three if name.startswith("scrapy_fleet_host_")}
    assert hosts == {"h0.example", "h1.example", "h2.example"}
    assert three[("scrapy_fleet_host_requests", (("host", "h1.example"), ("state", "queued")))] \
        == 999
    assert three[("scrapy_fleet_host_pages_total", (("host", "h2.example"),))] == 2
    capped = samples(exposition(many, host_metrics=10_000))
    hosts = {dict(ls)["host"] for name, ls in capped if name.startswith("scrapy_fleet_host_")}
    assert len(hosts) == metrics.HOST_METRICS_MAX


def test_host_metrics_carry_the_adaptive_controller_within_the_per_host_bound():
    got = samples(exposition(SNAPSHOT, host_metrics=7))
    adapted, calm = (("host", "127.0.0.1:8000"),), (("host", "127.0.0.2:8000"),)
    p = "scrapy_fleet_host_"
    assert got[(p + "rate_requests_per_second", adapted)] == 5.0
    assert got[(p + "rate_requests_per_second", calm)] == 20.0
    assert got[(p + "rate_ceiling_requests_per_second", adapted)] == 20.0
    assert got[(p + "learned_capacity_requests_per_second", adapted)] == 10.0
    assert (p + "learned_capacity_requests_per_second", calm) not in got
    assert got[(p + "rate_decreases_total", adapted)] == 2
    assert got[(p + "last_rate_decrease_timestamp_seconds",
                (("host", "127.0.0.1:8000"), ("reason", "503")))] == 1764581940.0
    per_host = [sum(1 for _, ls in got if dict(ls).get("host") == h["host"])
                for h in SNAPSHOT["hosts"]]
    assert max(per_host) == metrics.SERIES_PER_HOST == per_host[0]


def test_default_exposition_has_a_fixed_number_of_series():
    small = copy.deepcopy(SNAPSHOT)
    small["hosts"], small["workers"], small["alerts"] = [], [], []
    big = copy.deepcopy(SNAPSHOT)
    big["hosts"] = SNAPSHOT["hosts"] * 100
    big["workers"] = SNAPSHOT["workers"] * 100
    n_small = len(samples(exposition(small)))
    n_big = len(samples(exposition(big)))
    assert n_small == n_big - 2  # the big one only adds its 2 alert (id, severity) pairs
    assert n_big <= 150


def test_metrics_answer_up_0_while_redis_cannot_be_read():
    source = DictSource(SNAPSHOT, error=redis.ConnectionError("Connection refused"))
    from prometheus_client import generate_latest

    reg = metrics.registry(source)
    got = samples(generate_latest(reg).decode())
    assert got[("scrapy_fleet_up", ())] == 0
    assert got[("scrapy_fleet_scrape_errors_total", ())] == 1
    assert ("scrapy_fleet_frontier_requests", (("state", "due"),)) not in got
    got = samples(generate_latest(reg).decode())
    assert got[("scrapy_fleet_scrape_errors_total", ())] == 2
    source.error = None
    got = samples(generate_latest(reg).decode())
    assert got[("scrapy_fleet_up", ())] == 1
    assert got[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 12


# -- top -----------------------------------------------------------------------------------


def frame_text(snap: dict[str, Any], series: dict[str, Points], **kwargs: Any) -> str:
    console = Console(record=True, width=120, color_system=None, file=open("/dev/null", "w"))
    console.print(top.render(snap, series, width=120, **kwargs))
    return console.export_text()


def test_sparkline_scales_from_zero_to_the_maximum():
    assert top.sparkline([0, 5, 10], 3) == "▁▅█"
    assert top.sparkline([None, 10], 5) == " █"
    assert top.sparkline([1, 2, 3, 4], 2) == "▆█"  # the last values, scaled on those shown
    assert top.sparkline([0, 0], 2) == "▁▁"
    assert top.sparkline([], 4) == ""


def test_top_frame_shows_depth_rates_workers_hosts_and_alerts():
    text = frame_text(SNAPSHOT, SERIES)
    assert "crawl docs" in text
    assert "workers alive 1 of 3" in text
    lines = text.splitlines()
    due = next(line for line in lines if line.strip().startswith("due"))
    assert "12" in due and top.sparkline([30, None, 20, 12], 80) in due
    pages = next(line for line in lines if line.strip().startswith("pages/min"))
    assert "612.0" in pages and top.sparkline([0, 300, 600, 612], 80) in pages
    depth = next(line for line in lines if line.strip().startswith("depth"))
    assert " 23 " in depth  # due 12 + deferred 3 + leased 8 + parked 0
    assert "block rate 1.6 %" in text and "ETA 95 s" in text
    for worker in SNAPSHOT["workers"]:
        row = next(line for line in lines if worker["id"] in line)
        assert worker["state"] in row and worker["health"] in row
    assert "127.0.0.1:8000" in text
    assert "CRITICAL no worker alive (crawl docs)" in text
    assert "→ scrapy crawl docs" in text


def test_top_hosts_fit_120_columns_with_the_adaptive_cells():
    """rate/ceil, learned capacity and the last cut (docs/politeness.md), host names whole."""
    text = frame_text(SNAPSHOT, SERIES)
    clock = time.strftime("%H:%M:%S", time.localtime(1764581940.0))
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.strip().startswith("127.0.0.")}
    assert rows["127.0.0.1:8000"][-4:] == ["5/20", "10", "503", clock]
    assert rows["127.0.0.2:8000"][-3:] == ["20/20", "-", "-"]
    no_ceiling = [dict(SNAPSHOT["hosts"][1], ceiling=None, adaptive_rate=None)]
    other = frame_text(dict(SNAPSHOT, hosts=no_ceiling), SERIES)
    row = next(line for line in other.splitlines() if "127.0.0.2:8000" in line)
    assert row.split()[-3:] == ["-", "-", "-"]


def test_top_frame_limits_hosts_and_shows_an_error_line():
    text = frame_text(SNAPSHOT, SERIES, hosts=2, error="ConnectionError: refused")
    hosts_table = text.split("top hosts")[1].split("WARNING")[0]
    assert "127.0.0.2:8000" in hosts_table and "127.0.0.3:8000" not in hosts_table
    assert "Redis cannot be read: ConnectionError: refused" in text


def test_top_once_prints_one_frame():
    console = Console(record=True, width=100, color_system=None, file=open("/dev/null", "w"))
    assert top.run_top(DictSource(SNAPSHOT), once=True, console=console) == 0
    assert "vm:123:1764581000" in console.export_text()


# -- HTTP routes ---------------------------------------------------------------------------


@pytest.fixture
def monitor() -> Iterator[tuple[str, DictSource]]:
    source = DictSource(SNAPSHOT)
    state = server.MonitorState(source, "docs", refresh=1.0)
    httpd = server.make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", source
    httpd.shutdown()
    httpd.server_close()


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_http_routes(monitor):
    base, _ = monitor
    status, ctype, body = get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert samples(body.decode())[("scrapy_fleet_frontier_requests", (("state", "due"),))] == 12
    status, ctype, body = get(base + "/api/snapshot")
    assert status == 200 and ctype == "application/json"
    assert json.loads(body) == SNAPSHOT
    status, _, body = get(base + "/api/series?name=depth_due,pages_per_min&tier=10s")
    data = json.loads(body)
    assert status == 200 and data["tier"] == "10s" and data["step_s"] == 10
    assert data["series"]["depth_due"] == [list(p) for p in SERIES["depth_due"]]
    assert set(data["series"]) == {"depth_due", "pages_per_min"}
    status, _, body = get(base + "/api/series?name=depth_due&name=depth_leased"
                                 "&since=1764581970")
    assert json.loads(body)["series"]["depth_leased"] == [[1764581970.0, 8.0],
                                                          [1764581980.0, 8.0]]
    status, _, body = get(base + "/api/series?name=nope")
    assert status == 400 and "unknown series nope" in json.loads(body)["error"]
    status, _, body = get(base + "/api/series?tier=1y")
    assert status == 400 and "unknown tier" in json.loads(body)["error"]
    status, _, body = get(base + "/api/series?since=yesterday")
    assert status == 400
    status, ctype, body = get(base + "/")
    assert status == 200 and ctype.startswith("text/html")
    page = body.decode()
    assert 'data-crawl="docs"' in page and 'data-refresh-ms="1000"' in page
    assert "http://" not in page.replace('"http://www.w3.org', "")  # nothing from elsewhere
    for asset in ("/static/dashboard.js", "/static/dashboard.css"):
        status, _, body = get(base + asset)
        assert status == 200 and body
        assert b"https://" not in body and b"//cdn" not in body
    assert get(base + "/static/../server.py")[0] == 404
    assert get(base + "/static/nope.js")[0] == 404
    assert get(base + "/nope")[0] == 404
    assert get(base + "/healthz")[:1] == (200,)


def test_http_keeps_serving_while_redis_is_down(monitor):
    base, source = monitor
    assert get(base + "/api/snapshot")[0] == 200
    source.error = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    status, _, body = get(base + "/api/snapshot")
    reply = json.loads(body)
    assert status == 503 and "Connection refused" in reply["error"]
    assert reply["last_snapshot"] == SNAPSHOT and reply["error_since"] == 1764582001.0
    assert get(base + "/api/series")[0] == 503
    status, _, body = get(base + "/metrics")
    assert status == 200 and samples(body.decode())[("scrapy_fleet_up", ())] == 0
    assert get(base + "/")[0] == 200
    source.error = None
    assert get(base + "/api/snapshot")[0] == 200


def test_views_say_what_leased_and_items_count():
    # issue 19: `leased 18` in the frontier beside `leased 8` in a host row was not
    # explained (workers' leases, prefetched included, vs a host's downloads in progress),
    # and `items scraped` read as the items written while it counts what workers reported
    from scrapy_fleet.monitoring import screen

    snap = copy.deepcopy(SNAPSHOT)
    snap["rates"]["window_s"] = 30.2
    for text in (screen.render(snap), frame_text(snap, SERIES)):
        assert "downloading" in text and " leased " not in text.split("host")[-1], text
    status = screen.render(snap)
    assert "leased 8 (held by workers: prefetched, downloading or parsing)" in status
    assert "scraped 4900  dropped 7  failed 0 (as the workers reported them)" in status
    assert "items/min (last 30 s)" in status
    frame = frame_text(snap, SERIES)
    assert "items (reported) 4,900" in frame
    assert "rates per minute (last 30 s)" in frame
