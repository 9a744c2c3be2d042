"""The recrawl on the cockpit (issue 31, item 3): ``top`` and the dashboard's JSON show the
recrawl figures ``status --hosts`` shows (tracked pages, due now and overdue, revisits per
minute, the shares of changed 200s, unchanged 200s and 304s, each host's learned change rate
and price), compared with what Redis holds after a short adaptive recrawl by a real worker
against the changing test site."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from typing import Any

import pytest
import redis
from rich.console import Console
from support import wait_server_past, wait_until
from test_recrawl import KEYS, site_with, stop, tracked_states, worker

from scrapy_fleet.monitoring import server, top
from scrapy_fleet.monitoring.source import FleetSource
from scrapy_fleet.politeness.hosts import host_key

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]
OUTCOMES = ("not_modified", "unchanged", "changed", "gone")


def _share(n: int, total: int) -> float | None:
    return round(n / total, 3) if total else None


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _redis_figures(client: redis.Redis, host: str, now_ms: float) -> dict[str, Any]:
    """What Redis holds: the schedule's counts at *now_ms*, the outcome counters and the
    host's budget HASH (recrawl/budget.py's layout), read here without the views' code."""
    stats = client.hgetall(KEYS.stats)
    outcomes = {o: int(stats.get(f"revisit_{o}".encode(), 0)) for o in OUTCOMES}
    total = sum(outcomes.values())
    due = overdue = 0
    for slot, at in client.zrange(KEYS.revisit_index, 0, -1, withscores=True):
        n = client.llen(KEYS.revisit_slot(slot.decode()))
        due += n if at <= now_ms else 0
        overdue += n if at <= now_ms - 60_000 else 0
    budget = client.hgetall(KEYS.revisit_budget(host))
    pages = sum(int(v) for k, v in budget.items() if not k.startswith((b"r", b"mu")))
    rates = sum(float(v) for k, v in budget.items() if k.startswith(b"r"))
    mu = budget.get(b"mu")
    return {"tracked": int(client.get(KEYS.revisit_count) or 0), "due": due,
            "overdue": overdue, "outcomes": outcomes,
            "changed_share": _share(outcomes["changed"], total),
            "unchanged_share": _share(outcomes["unchanged"], total),
            "not_modified_share": _share(outcomes["not_modified"], total),
            "recrawl_pages": pages,
            "recrawl_rate": round(rates / pages * 86400, 3) if pages and rates else None,
            "recrawl_price": None if mu in (None, b"inf") else round(float(mu), 3),
            "recrawl_priced_out": mu == b"inf"}


@pytest.fixture
def recrawled(redis_url, tmp_path, site_factory, worker_env) -> tuple[redis.Redis, str]:
    """A crawl whose page 0 changed every second and page 1 never (304s), each page revisited
    three times; then one more page of the host pushed, so that the host is in the
    frontier (a top host row)."""
    site = site_with(site_factory, tmp_path, {"pages": 2, "static_share": 1.0,
                                              "periods": {"0": 1.0}})
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="adaptive",
                       FLEET_RECRAWL_INTERVAL=4, FLEET_RECRAWL_MIN_INTERVAL=1,
                       FLEET_RECRAWL_MAX_INTERVAL=100)
    try:
        wait_until(lambda: len(states := tracked_states(client)) == 3
                   and all(len(s.history) >= 3 for s in states.values()), 240,
                   "three revisits of the three pages", interval=0.5)
    finally:
        stop(proc, log)  # budgets and counters synced at close: Redis holds the final figures
    pushed = subprocess.run([*CLI, "--redis", redis_url, "push", "recrawl",
                             site.url + "changing/extra.html"],
                            capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    return client, host_key(site.url)


def test_top_and_the_dashboard_show_the_recrawl_figures_redis_holds(recrawled, redis_url):
    client, host = recrawled
    source = FleetSource(client, KEYS)
    snap = source.snapshot()
    want = _redis_figures(client, host, snap["at"] * 1000)
    rv = snap["recrawl"]
    assert want["outcomes"]["changed"] > 0 and want["outcomes"]["not_modified"] > 0, want
    assert want["recrawl_pages"] == 3 and want["recrawl_rate"] > 0, want
    for name in ("tracked", "due", "overdue", "outcomes", "changed_share", "unchanged_share",
                 "not_modified_share"):
        assert rv[name] == want[name], name
    row = next(h for h in snap["hosts"] if h["host"] == host)
    for name in ("recrawl_pages", "recrawl_rate", "recrawl_price", "recrawl_priced_out"):
        assert row[name] == want[name], name

    # revisits per minute: the counters' increase between two of the source's readings
    assert rv["revisits_per_min"] is None  # (one reading)
    wait_server_past(client, snap["at"] * 1000 + 1500)
    client.hincrby(KEYS.stats, "revisit_changed", 30)
    later = source.snapshot()
    assert later["recrawl"]["revisits_per_min"] == round(30 * 60 / (later["at"] - snap["at"]), 3)

    # top: the recrawl line and the host's cells
    console = Console(record=True, width=220, color_system=None, file=open("/dev/null", "w"))
    console.print(top.render(later, {}, width=220))
    text = console.export_text()
    line = next(t for t in text.splitlines() if t.startswith("recrawl "))
    rv = later["recrawl"]
    assert line.split() == [
        "recrawl", "tracked", str(want["tracked"]), "due", "now", str(rv["due"]), "overdue",
        str(rv["overdue"]), "revisits/min", f"{rv['revisits_per_min']:,.1f}", "changed",
        *_pct(rv["changed_share"]).split(), "unchanged", "200",
        *_pct(rv["unchanged_share"]).split(), "304", *_pct(rv["not_modified_share"]).split()]
    assert rv["changed_share"] == _share(want["outcomes"]["changed"] + 30,
                                         sum(want["outcomes"].values()) + 30)
    cells = next(t.split() for t in text.splitlines() if t.split()[:1] == [host])
    price = "max" if want["recrawl_priced_out"] else (
        "-" if want["recrawl_price"] is None else f"{want['recrawl_price']:.4g}s")
    assert cells[-3:] == [str(want["recrawl_pages"]), f"{want['recrawl_rate']:.3g}", price]
    assert "chg/day" in text

    # status's text shows the same shares
    status = subprocess.run([*CLI, "--redis", redis_url, "status", "recrawl"],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    shares = (f"changed {_pct(rv['changed_share'])}  unchanged 200 "
              f"{_pct(rv['unchanged_share'])}  304 {_pct(rv['not_modified_share'])}")
    assert shares.replace(" %", "%") in status.stdout.replace(" %", "%"), status.stdout

    # the dashboard's JSON (what dashboard.js draws its cards and host table from)
    state = server.MonitorState(FleetSource(client, KEYS), "recrawl")
    httpd = server.make_server(state, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{httpd.server_address[1]}/api/snapshot", timeout=30) as r:
            api = json.loads(r.read())
    finally:
        httpd.shutdown()
        httpd.server_close()
    again = _redis_figures(client, host, api["at"] * 1000)
    for name in ("tracked", "due", "overdue", "outcomes", "changed_share"):
        assert api["recrawl"][name] == again[name], name
    row = next(h for h in api["hosts"] if h["host"] == host)
    assert {k: row[k] for k in ("recrawl_pages", "recrawl_rate", "recrawl_price")} == {
        k: want[k] for k in ("recrawl_pages", "recrawl_rate", "recrawl_price")}


def test_a_crawl_without_a_recrawl_shows_no_recrawl_line_nor_columns(redis_url):
    pushed = subprocess.run([*CLI, "--redis", redis_url, "push", "recrawl", "http://h.test/a"],
                            capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    snap = FleetSource(redis.Redis.from_url(redis_url), KEYS).snapshot()
    assert snap["hosts"][0]["recrawl_pages"] == 0 and snap["hosts"][0]["recrawl_rate"] is None
    console = Console(record=True, width=220, color_system=None, file=open("/dev/null", "w"))
    console.print(top.render(snap, {}, width=220))
    text = console.export_text()
    assert "chg/day" not in text and not any(t.startswith("recrawl ")
                                             for t in text.splitlines())
