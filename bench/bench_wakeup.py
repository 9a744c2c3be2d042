"""Wake-up latency: how soon an idle fleet worker fetches a URL pushed into an empty frontier.

One ``scrapy crawl docs`` worker (no FLEET_IDLE_TIMEOUT: it waits for work forever) joins an
empty crawl.  2 s after its log says "joined crawl", the bench pushes a URL with
``FrontierAdmin.push`` (what ``scrapy fleet push`` runs) and measures the time from the push
returning to the site server's log line for that URL (the server's ``t``, same clock).
Repeated ``--pushes`` times (different pages, same worker, 0.5-1.5 s random pause after
each page was fetched).  Each pushed request carries ``meta={"scope": <its own URL>}``, so
the docs spider yields its item but follows no link: one push, one fetch.

Modes (one worker each, in this order):

* ``default``: the fleet's settings (``FLEET_POLL_INTERVAL`` 0.5 s);
* ``poll5``: ``FLEET_POLL_INTERVAL=5`` (and ``FLEET_LEASE_TIMEOUT=300``), standing in for a
  Redis scheduler without wake-up, which is only asked for work at Scrapy's 5 s engine
  heartbeat.

The pause before each push is drawn from [0.3, 0.3 + poll interval] s, so pushes land at
random phases of the worker's poll cycle.  For each mode the bench also reports how often
the idle worker calls Redis (EVALSHA/s from ``INFO commandstats``) and the worker's CPU use,
in two idle windows: right after joining (before any push) and after the pushes (default
mode: once ``FLEET_LEASE_TIMEOUT / 3`` has passed since the worker last held a lease).

Usage: ``.venv/bin/python bench/bench_wakeup.py [--pushes 5] [--modes default,poll5]``
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULTS
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

#: mode -> worker settings.  poll5 also gets a long lease timeout, so that the idle
#: busy-poll (see bench/README.md) cannot start between its pushes: its pushes then show the
#: plain 5 s polling they stand for.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "poll5": {"FLEET_POLL_INTERVAL": 5, "FLEET_LEASE_TIMEOUT": 300},
}
HEARTBEAT = 5.0  # Scrapy's engine slot heartbeat (ExecutionEngine._SLOT_HEARTBEAT_INTERVAL)


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def idle_window(client: Any, pid: int, seconds: float) -> dict[str, float]:
    c0, e0, t0 = proc_cpu(pid), evalsha_calls(client), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return {"evalsha_per_s": round((evalsha_calls(client) - e0) / dt, 1),
            "worker_cpu": round((proc_cpu(pid) - c0) / dt, 2)}


def wait_fetch(site: h.Site, path: str, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rec in reversed(site.records()):
            if rec["path"] == path:
                return float(rec["t"])
        time.sleep(0.01)
    return None


def run_mode(root: Path, redis: h.Redis, site: h.Site, name: str, extra: dict[str, Any],
             pushes: int, first_page: int, rng: random.Random) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    env = h.worker_env(root)
    log = root / f"worker-{name}.log"
    settings = {"FLEET_REDIS_URL": redis.url, **extra}
    proc = h.scrapy(["crawl", "docs", *h.setting_args(settings)], env, log)
    admin = FrontierAdmin(redis.url, "docs")
    result: dict[str, Any] = {"mode": name, "settings": extra}
    try:
        h.wait_for_text(log, "joined crawl", 60, proc)
        time.sleep(0.5)
        result["idle_at_start"] = idle_window(client, proc.pid, 1.5)  # ends 2 s after joining
        latencies = []
        poll = float(extra.get("FLEET_POLL_INTERVAL", DEFAULTS["FLEET_POLL_INTERVAL"]))
        time.sleep(rng.uniform(0.0, poll))
        for i in range(pushes):
            path = f"/site/p/{first_page + i}.html"
            url = site.url.rstrip("/") + path
            payload = codec.encode(Request(url, meta={"scope": url}))
            admin.push([(b"", 0, payload)])
            pushed = time.time()
            fetched = wait_fetch(site, path, HEARTBEAT * 3)
            if fetched is None:
                raise RuntimeError(f"{url} not fetched within {HEARTBEAT * 3} s")
            latencies.append(fetched - pushed)
            print(f"  {name:8} push {i + 1}: fetched {1000 * (fetched - pushed):7.1f} ms "
                  "after the push returned", flush=True)
            time.sleep(rng.uniform(0.3, 0.3 + poll))
        # idle again: wait until the lease heartbeat (lease timeout / 3) is due with no lease
        heartbeat = float(extra.get("FLEET_LEASE_TIMEOUT", DEFAULTS["FLEET_LEASE_TIMEOUT"])) / 3
        if heartbeat <= 20:
            time.sleep(max(0.0, heartbeat - 1.0))
        result["idle_later"] = idle_window(client, proc.pid, max(2.0, poll + 0.5))
        result["latencies_ms"] = [round(1000 * x, 1) for x in latencies]
        result["median_ms"] = round(1000 * h.median(latencies), 1)
        result["max_ms"] = round(1000 * max(latencies), 1)
    finally:
        h.stop(proc)
        admin.close()
        client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--modes", default="default,poll5")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    modes = [m for m in args.modes.split(",") if m]
    results = []
    with h.workdir() as root:
        generate_site(root / "www", 50, 4, seed=1)
        with h.Redis(root) as redis, h.Site(root / "www", root / "site.log") as site:
            for n, mode in enumerate(modes):
                results.append(run_mode(root, redis, site, mode, MODES[mode], args.pushes,
                                        n * args.pushes, rng))

    print(f"\nWake-up latency: push into an empty frontier -> the idle worker's fetch "
          f"({args.pushes} pushes per mode, same worker)")
    for r in results:
        print(f"  {r['mode']:8} {r['settings']!s:28} median {r['median_ms']:7.1f} ms, "
              f"max {r['max_ms']:7.1f} ms  {h.fmt_list(r['latencies_ms'])}")
        for window in ("idle_at_start", "idle_later"):
            w = r[window]
            print(f"           idle ({window.replace('_', ' ')}): {w['evalsha_per_s']:8.1f} "
                  f"EVALSHA/s, worker CPU {100 * w['worker_cpu']:.0f} %")
    print(f"  reference: Scrapy's engine heartbeat is {HEARTBEAT:.0f} s (a scheduler that is only "
          f"polled by it starts a pushed URL after 0-{HEARTBEAT:.0f} s, {HEARTBEAT / 2:.1f} s on "
          "average)")
    fig: dict[str, Any] = {"bench": "wakeup", **h.machine(), "pushes": args.pushes,
                           "engine_heartbeat_s": HEARTBEAT, "modes": results}
    for r in results:
        fig[f"{r['mode']}_median_ms"] = r["median_ms"]
        fig[f"{r['mode']}_max_ms"] = r["max_ms"]
        fig[f"{r['mode']}_idle_evalsha_per_s_start"] = r["idle_at_start"]["evalsha_per_s"]
        fig[f"{r['mode']}_idle_evalsha_per_s_later"] = r["idle_later"]["evalsha_per_s"]
    print()
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
