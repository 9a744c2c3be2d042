"""Politeness under recrawl (issue 22: "4 workers, one host at R req/s: R +- 2 %, as for a
first crawl"), measured as bench_politeness.py's part 1, from the test site's request log
(server time at arrival), in one run:

* *first crawl* (the baseline, bench_politeness part 1): 4 workers of ``scrapy crawl fetch``
  (tests/project), 200 URLs of one host pushed, ``FLEET_HOST_RATE=2 FLEET_HOST_BURST=1``;
* *revisits*: 4 workers of ``scrapy crawl recrawl`` (tests/project: follows the changing
  site's index) on another host, ``FLEET_RECRAWL=fixed FLEET_RECRAWL_INTERVAL=1``, 30 pages
  (half changing every 2 s, half never: 200s and 304s), same rate: every page is due every
  second, 15x the host's rate, so the rate holds the fleet all along.  The window starts at
  the first revisit (the first visits are over by then).

Figures: requests in ``--seconds`` (60) from the window's start (expected 2 x seconds), the
most in any 1 s window, gaps; for the revisits the share of 304s.  Both runs use
``FLEET_POLL_INTERVAL=0.5`` (the default).

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_recrawl_politeness.py [--seconds 60]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
from bench_politeness import (
    TEST_PROJECT,
    MultiSite,
    interrupt,
    log_stats,
    push,
    start_fleet,
    wait_until,
    window_figures,
)

from testsite import generate_site

PAGES = 30
RATE = 2.0


def first_crawl(args: argparse.Namespace, redis: h.Redis, env: dict[str, str], root: Path,
                site: MultiSite, addr: str) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    push(site.page_urls(addr, range(200)), redis.url, env, root)
    settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_RATE": RATE, "FLEET_HOST_BURST": 1,
                "FLEET_IDLE_TIMEOUT": 30, "LOG_LEVEL": "INFO"}
    since = time.time()
    procs, logs = start_fleet(4, settings, env, root, "first")
    first = wait_until(lambda: site.times(addr, since)[:1], 90.0)
    if not first:
        interrupt(procs)
        raise RuntimeError("no first-crawl request within 90 s")
    time.sleep(max(0.0, first[0] + args.seconds + 0.5 - time.time()))
    interrupt(procs)
    fig = window_figures(site.times(addr, since), args.seconds, 1 / RATE)
    fig["stats"] = log_stats(logs)
    client.close()
    return fig


def revisits(args: argparse.Namespace, redis: h.Redis, env: dict[str, str], root: Path,
             site: MultiSite, addr: str) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_RATE": RATE, "FLEET_HOST_BURST": 1,
                "FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 1, "LOG_LEVEL": "INFO"}
    start = site.urls[addr] + "changing/"
    logs = [root / f"revisit-w{i}.log" for i in range(4)]
    since = time.time()
    procs = [h.scrapy(["crawl", "recrawl", "-a", f"start={start}", *h.setting_args(settings)],
                      env, logs[i], cwd=TEST_PROJECT) for i in range(4)]

    def records() -> list[dict[str, Any]]:
        return site.records(addr, since, "/changing/")

    def first_revisit() -> float | None:
        seen: set[str] = set()
        for rec in records():
            if rec["path"] in seen:
                return float(rec["t"])
            seen.add(rec["path"])
        return None

    t0 = wait_until(first_revisit, 120.0)
    if t0 is None:
        interrupt(procs)
        raise RuntimeError("no revisit within 120 s")
    time.sleep(max(0.0, t0 + args.seconds + 0.5 - time.time()))
    interrupt(procs)
    recs = [r for r in records() if r["t"] >= t0]
    fig = window_figures(sorted(float(r["t"]) for r in recs), args.seconds, 1 / RATE)
    inside = [r for r in recs if r["t"] < t0 + args.seconds]
    fig["status_304_share"] = round(sum(1 for r in inside if r["status"] == 304)
                                    / max(1, len(inside)), 3)
    fig["stats"] = log_stats(logs)
    client.close()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"bench": "recrawl_politeness", **h.machine()}
    with h.workdir("fleet-bench-rvpolite-") as root, h.Redis(root) as redis:
        www = root / "www"
        generate_site(www, 300, 2, seed=4)
        env = h.worker_env(root)
        behaviour = {"changing": {"pages": PAGES, "static_share": 1.0,
                                  "periods": {str(i): 2.0 for i in range(0, PAGES, 2)}}}
        addrs = ["127.0.0.31", "127.0.0.32"]
        with MultiSite(www, root / "site.jsonl", addrs, behaviour) as site:
            figures["first_crawl"] = first_crawl(args, redis, env, root, site, addrs[0])
            print(f"first crawl: {figures['first_crawl']['count']} requests in "
                  f"{args.seconds:.0f} s, max {figures['first_crawl']['max_in_1s']} in 1 s")
            figures["revisits"] = revisits(args, redis, env, root, site, addrs[1])
            print(f"revisits:    {figures['revisits']['count']} requests in "
                  f"{args.seconds:.0f} s, max {figures['revisits']['max_in_1s']} in 1 s, "
                  f"304 share {figures['revisits']['status_304_share']}")
    figures["expected"] = round(args.seconds * RATE)
    h.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
