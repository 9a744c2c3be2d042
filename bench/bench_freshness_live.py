"""Freshness with live workers (issue 22): real ``scrapy crawl recrawl`` workers (tests/project:
follows the changing site's index) against testsite/changing.py on a compressed time scale
(``--day`` seconds stand for a day: change rates per second), the time-averaged freshness
measured from the site's own truth (``GET /_testsite/changes``) and its request log.

The site: ``--pages`` (40) pages, 60 % never changing, the rest log-uniform 1/60 .. 8 changes a
"day" (bench_freshness.py's static60 setting).  One worker per policy, each on its own host
address of the same site server (the same pages, the same change times: a paired comparison),
its own crawl id, no rate limit (the policies are compared at equal fetches, not under a
budget); the policies in one round at once:

* ``fixed``: ``FLEET_RECRAWL = "fixed"``, ``FLEET_RECRAWL_INTERVAL`` = 1 day (the uniform
  policy at one fetch a page a day);
* ``adaptive``: ``FLEET_RECRAWL = "adaptive"``, base 0.36 day (bench_freshness.py: the base at
  which it fetches about as much as fixed 1 day), min 1/24 day, max 30 days;

then a second round: ``uniform``: fixed at the interval that makes it fetch as many pages a
second as the adaptive policy did (pages / its revisits a second).

Freshness of a policy: each request to a page (the site's log: arrival time, the version then
current was served, or confirmed by a 304) makes the page fresh until its next change (the
truth); averaged over the pages and the window [start + ``--warm`` days, start + ``--days``
days], where start is the policy's first request.  Compared with bench_freshness.py's
simulated figures for the same setting (fixed 1 d 0.885, adaptive 0.923 at the same fetches).

``--first`` (issue 31, the first visits): 200 pages, 60 % never changing, the rest
log-uniform once per 10 s .. once per 30 min, each policy's host at 2 requests a second
(``FLEET_HOST_RATE``), ``--days`` and ``--warm`` in seconds (``--day 1``: 480 and 200 by
default, the issue's 8 minutes measured over the last 280 s): ``adaptive`` (base 30 s, min 5,
max 1800, ``FLEET_RECRAWL_BUDGET`` 0.8) then ``uniform`` at its fetches; the revisits of a
page that never changes over those of a changing one.

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_freshness_live.py [--day 30] [--days 8]``;
``... --first``
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness as h
from bench_politeness import TEST_PROJECT, MultiSite, interrupt

from testsite import generate_site


def freshness(fetches: dict[str, list[float]], changes: dict[str, list[float]], a: float,
              b: float) -> float:
    """Time-averaged share of fresh pages over [a, b]: a page fetched at f is fresh from f
    until its first change after f."""
    total = 0.0
    for path, times in changes.items():
        fs = sorted(fetches.get(path, []))
        for i, f in enumerate(fs):
            end = fs[i + 1] if i + 1 < len(fs) else b
            j = bisect.bisect_right(times, f)
            stale_at = times[j] if j < len(times) else b
            lo, hi = max(f, a), min(end, stale_at, b)
            if hi > lo:
                total += hi - lo
    return total / (len(changes) * (b - a))


def per_page(recs: list[dict[str, Any]], paths: list[str]) -> float:
    """Requests of *recs* to *paths*, per path."""
    wanted = set(paths)
    return sum(1 for r in recs if r["path"] in wanted) / max(1, len(paths))


def run_round(policies: dict[str, dict[str, Any]], args: argparse.Namespace, redis: h.Redis,
              env: dict[str, str], root: Path, site: MultiSite, addrs: dict[str, str],
              truth_url: str) -> dict[str, Any]:
    day = args.day
    procs, logs = [], []
    since = time.time()
    for name, settings in policies.items():
        log = root / f"{name}.log"
        base = {"FLEET_REDIS_URL": redis.url, "FLEET_CRAWL_ID": f"fresh-{name}",
                "FLEET_POLL_INTERVAL": 0.2, "LOG_LEVEL": "INFO"}
        start = site.urls[addrs[name]] + "changing/"
        procs.append(h.scrapy(["crawl", "recrawl", "-a", f"start={start}",
                               *h.setting_args({**base, **settings})], env, log,
                              cwd=TEST_PROJECT))
        logs.append(log)
    time.sleep(args.days * day + 3)
    interrupt(procs)
    with urllib.request.urlopen(truth_url, timeout=30) as resp:
        truth = json.load(resp)
    changes = {path: sorted(p["changes"]) for path, p in truth["pages"].items()}
    out: dict[str, Any] = {}
    for name, addr in addrs.items():
        if name not in policies:
            continue
        recs = [r for r in site.records(addr, since, "/changing/")
                if r["path"] != "/changing/" and r["status"] in (200, 304)]
        if not recs:
            raise RuntimeError(f"{name}: no request (see {root / (name + '.log')})")
        t0 = min(float(r["t"]) for r in recs)
        a, b = t0 + args.warm * day, t0 + args.days * day
        fetches: dict[str, list[float]] = {}
        for r in recs:
            fetches.setdefault(r["path"], []).append(float(r["t"]))
        inside = [r for r in recs if a <= r["t"] < b]
        static = [p for p, info in truth["pages"].items() if info["rate"] == 0]
        moving = [p for p, info in truth["pages"].items() if info["rate"] > 0]

        out[name] = {
            "freshness": round(freshness(fetches, changes, a, b), 4),
            "revisits_static_over_changing": round(per_page(inside, static)
                                                   / max(1e-9, per_page(inside, moving)), 3),
            "fetches_per_day": round(len(inside) / ((b - a) / day), 1),
            "fetches_per_s": round(len(inside) / (b - a), 3),
            "share_304": round(sum(1 for r in inside if r["status"] == 304)
                               / max(1, len(inside)), 3)}
        print(f"  {name}: {json.dumps(out[name])}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--day", type=float, default=30.0, help="seconds standing for a day")
    parser.add_argument("--days", type=float, default=8.0, help="run length, days")
    parser.add_argument("--warm", type=float, default=3.0, help="days left out at the start")
    parser.add_argument("--pages", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--first", action="store_true", help="issue 31's first visits")
    args = parser.parse_args(argv)
    if args.first:
        return first_visits(args)
    day = args.day
    figures: dict[str, Any] = {"bench": "freshness_live", **h.machine(), "args": vars(args)}
    with h.workdir("fleet-bench-fresh-") as root, h.Redis(root) as redis:
        www = root / "www"
        generate_site(www, 10, 2, seed=4)
        env = h.worker_env(root)
        behaviour = {"changing": {"pages": args.pages, "static_share": 0.6,
                                  "seed": args.seed, "rate_min": 1 / 60 / day,
                                  "rate_max": 8 / day}}
        addrs = {"fixed": "127.0.0.41", "adaptive": "127.0.0.42", "uniform": "127.0.0.43"}
        with MultiSite(www, root / "site.jsonl", list(addrs.values()), behaviour) as site:
            truth = site.urls[addrs["fixed"]] + "_testsite/changes"
            print(f"round 1 ({args.days * day:.0f} s): fixed 1 day, adaptive base 0.36 day")
            first = run_round({
                "fixed": {"FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": day},
                "adaptive": {"FLEET_RECRAWL": "adaptive", "FLEET_RECRAWL_INTERVAL": 0.36 * day,
                             "FLEET_RECRAWL_MIN_INTERVAL": max(1.0, day / 24),
                             "FLEET_RECRAWL_MAX_INTERVAL": 30 * day}},
                args, redis, env, root, site, addrs, truth)
            interval = max(1.0, args.pages / first["adaptive"]["fetches_per_s"])
            print(f"round 2: uniform, every {interval:.1f} s (the adaptive policy's fetches)")
            second = run_round({"uniform": {"FLEET_RECRAWL": "fixed",
                                            "FLEET_RECRAWL_INTERVAL": round(interval)}},
                               args, redis, env, root, site, addrs, truth)
    figures.update(first)
    figures.update(second)
    figures["uniform"]["interval_s"] = round(interval)
    h.emit_json(figures)
    return 0


def first_visits(args: argparse.Namespace) -> int:
    """``--first`` (module docstring)."""
    args.day, args.pages = 1.0, 200
    if args.days == 8.0 and args.warm == 3.0:
        args.days, args.warm = 480.0, 200.0
    figures: dict[str, Any] = {"bench": "freshness_live_first", **h.machine(), "args": vars(args)}
    polite = {"FLEET_HOST_RATE": 2, "FLEET_RECRAWL_MIN_INTERVAL": 5,
              "FLEET_RECRAWL_MAX_INTERVAL": 1800}
    with h.workdir("fleet-bench-first-") as root, h.Redis(root) as redis:
        www = root / "www"
        generate_site(www, 10, 2, seed=4)
        env = h.worker_env(root)
        behaviour = {"changing": {"pages": 200, "static_share": 0.6, "seed": args.seed,
                                  "rate_min": 1 / 1800, "rate_max": 1 / 10}}
        addrs = {"adaptive": "127.0.0.44", "uniform": "127.0.0.45"}
        with MultiSite(www, root / "site.jsonl", list(addrs.values()), behaviour) as site:
            truth = site.urls[addrs["adaptive"]] + "_testsite/changes"
            print(f"round 1 ({args.days:.0f} s): adaptive, base 30 s, host at 2/s")
            one = run_round({"adaptive": {"FLEET_RECRAWL": "adaptive",
                                          "FLEET_RECRAWL_INTERVAL": 30, **polite}},
                            args, redis, env, root, site, addrs, truth)
            interval = max(1.0, 200 / one["adaptive"]["fetches_per_s"])
            print(f"round 2: uniform, every {interval:.1f} s (the adaptive policy's fetches)")
            two = run_round({"uniform": {"FLEET_RECRAWL": "fixed", **polite,
                                         "FLEET_RECRAWL_INTERVAL": round(interval)}},
                            args, redis, env, root, site, addrs, truth)
    figures.update(one)
    figures.update(two)
    figures["uniform"]["interval_s"] = round(interval)
    figures["freshness_ratio"] = round(one["adaptive"]["freshness"]
                                       / two["uniform"]["freshness"], 3)
    h.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
