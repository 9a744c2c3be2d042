"""Adaptive politeness on the cockpit (issue 35, item 6): ``/metrics``, ``top`` and the
dashboard's JSON show each host's rate, ceiling, learned capacity and last decrease, read by
the reader of ``status --hosts`` from a controller state the real Lua wrote (a real
redis-server, lua/adaptive.lua through the frontier call)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from support import host_entry as entry
from support import server_ms, wait_server_past

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.monitoring import server, top
from scrapy_fleet.monitoring.source import FleetSource

OVERLOAD = 1
CEILING = 20.0  # requests/s: FLEET_HOST_RATE
FIELDS = ("adaptive_rate", "ceiling", "learned_rate", "capacity", "last_decrease",
          "last_decrease_at", "decreases")


def _lease(admin: FrontierAdmin) -> list:
    """One lease (waiting for the host's GCRA turn by the server's clock)."""
    while True:
        reply = admin.call(CallBatch(take=1), worker="w")
        if reply.leased:
            return list(reply.leased)
        if reply.next_ready:
            wait_server_past(admin.client, server_ms(admin.client) + reply.next_ready * 1000)


@pytest.fixture
def adapted(redis_url: str) -> FrontierAdmin:
    """a.test refused twice with 503 (two overload events: 20 -> 10 -> 5 requests/s, learned
    capacity 10) and still 4 entries queued; b.test never complained, 1 entry queued."""
    params = FrontierParams(host_interval=1 / CEILING, host_interval_is_rate=True,
                            host_concurrency=0, adaptive=(0.5, 0.05, 60.0, 2.0))
    admin = FrontierAdmin(redis_url, "adaptview", params=params)
    admin.push([entry(f"http://a.test/{i}") for i in range(6)])
    for _ in range(2):
        leased = _lease(admin)
        admin.call(CallBatch(downloaded=[(e.entry_id, e.token, OVERLOAD, -1, "503")
                                         for e in leased]), worker="w")
    admin.push([entry("http://b.test/0")])
    # the per-host defaults every worker writes at start (frontier/scheduler.py)
    admin.client.hset(admin.keys.config, mapping={
        "host_interval_ms": 50, "host_interval_is_rate": 1, "host_burst": 1,
        "host_concurrency": 0})
    return admin


def _expected(admin: FrontierAdmin) -> dict[str, dict[str, Any]]:
    """What status --hosts shows of each host (FrontierAdmin.hosts), checked against the
    controller's known state first."""
    rows = {r["host"]: {f: r[f] for f in FIELDS} for r in admin.hosts()}
    a, b = rows["a.test"], rows["b.test"]
    assert (a["adaptive_rate"], a["ceiling"], a["learned_rate"], a["capacity"],
            a["last_decrease"], a["decreases"]) == (5.0, CEILING, 5.0, 10.0, "503", 2)
    assert a["last_decrease_at"] is not None and \
        abs(a["last_decrease_at"] - server_ms(admin.client) / 1000) < 600
    assert b == {"adaptive_rate": CEILING, "ceiling": CEILING, "learned_rate": None,
                 "capacity": None, "last_decrease": None, "last_decrease_at": None,
                 "decreases": 0}
    return rows


@pytest.fixture
def monitor(adapted: FrontierAdmin) -> Iterator[str]:
    state = server.MonitorState(FleetSource(adapted.client, adapted.keys), "adaptview",
                                host_metrics=5)
    httpd = server.make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def test_metrics_show_each_hosts_rate_ceiling_capacity_and_last_decrease(adapted, monitor):
    want = _expected(adapted)
    got = {}
    for family in text_string_to_metric_families(_get(monitor + "/metrics").decode()):
        for s in family.samples:
            got[(s.name, tuple(sorted(s.labels.items())))] = s.value
    p = "scrapy_fleet_host_"
    for host in ("a.test", "b.test"):
        h = (("host", host),)
        assert got[(p + "rate_requests_per_second", h)] == want[host]["adaptive_rate"]
        assert got[(p + "rate_ceiling_requests_per_second", h)] == CEILING
        assert got[(p + "rate_decreases_total", h)] == want[host]["decreases"]
    a = (("host", "a.test"),)
    assert got[(p + "learned_capacity_requests_per_second", a)] == 10.0
    assert got[(p + "last_rate_decrease_timestamp_seconds",
                (("host", "a.test"), ("reason", "503")))] == want["a.test"]["last_decrease_at"]
    # a host that never complained: no capacity, no last decrease (absent, not 0)
    assert (p + "learned_capacity_requests_per_second", (("host", "b.test"),)) not in got
    assert not [k for k in got if k[0] == p + "last_rate_decrease_timestamp_seconds"
                and dict(k[1])["host"] == "b.test"]


def test_dashboard_json_holds_the_rows_of_status_hosts(adapted, monitor):
    want = _expected(adapted)
    snap = json.loads(_get(monitor + "/api/snapshot"))
    rows = {h["host"]: {f: h[f] for f in FIELDS} for h in snap["hosts"]}
    assert rows == want


def test_top_rows_show_rate_over_ceiling_capacity_and_the_last_cut(adapted):
    want = _expected(adapted)
    snap = FleetSource(adapted.client, adapted.keys).snapshot()
    console = Console(record=True, width=200, color_system=None, file=open("/dev/null", "w"))
    console.print(top.render(snap, {}, width=200))
    lines = {line.split()[0]: line.split() for line in console.export_text().splitlines()
             if line.split() and line.split()[0] in ("a.test", "b.test")}
    at = time.strftime("%H:%M:%S", time.localtime(want["a.test"]["last_decrease_at"]))
    assert lines["a.test"][-4:] == ["5/20", "10", "503", at]
    assert lines["b.test"][-3:] == ["20/20", "-", "-"]
