"""Adaptive politeness (issue 35): one host whose capacity changes, 4 workers under a ceiling.

The site (``python -m testsite serve``, behaviour ``capacity``: a token bucket) serves
20 req/s for 15 s, 5 req/s until 60 s, 20 again until 100 s (times scaled by ``--scale``),
counted from its first page request, and answers ``--status`` (429 by default, no
Retry-After) above capacity.  The fleet: ``--workers`` real ``scrapy crawl fetch`` processes
of the tests' project, ``FLEET_HOST_RATE=25`` (the ceiling).  Each run stops (SIGINT) at the
curve's end.  Two runs per invocation: the controller (``FLEET_ADAPTIVE`` True, the
default) and the baseline beside it (``FLEET_ADAPTIVE=False``: holds and back-off only, as
main @3e0fb0b).  Every figure comes from the site's own request log:

* ``rate_2s_at_drop_plus_5``: requests/s in the 2 s ending 5 s after the drop (issue: <= 6);
* ``over_share_low``: share of refused answers from 5 s after the drop to the rise
  (issue: <= 5 %), and ``over_share_low_last30``: in the low phase's last 30 s (<= 2 %);
* ``goodput_low``: successful pages/s during the low phase (issue: >= 4; main: 1.3);
* ``recovery_s``: seconds from the rise to the first 2-s window of >= 16 successful pages/s
  (issue: <= 30); ``max_1s``: most requests in any 1-s window (issue: <= 26), and
  ``max_1s_at`` where that window starts (s from the first request);
* ``steady``: successful pages/s in the second half of each phase (7.5-15 s, 37.5-60 s,
  80-100 s at scale 1), the figure compared across fleet sizes.

Options for issue 35's other figures (each a run of its own in the same invocation):

* ``--workers 1,2,4``: one controller run per fleet size, then ``steady_vs_mean``: each
  size's steady rates over the sizes' mean, per phase (issue: within 0.9-1.1);
* ``--mode latency``: the site refuses nothing; it is one FIFO server of the phase's rate
  and each answer is held 50 ms plus its wait in that queue (testsite ``Capacity.latency``),
  the fleet has 4 slots for the host (``FLEET_HOST_CONCURRENCY=4``).  Per phase's second
  half: ``inflight_avg`` (requests held at the site, time-averaged: Little's law, the sum of
  their holds over the window's length), ``p95_ms`` of the holds, ``tput_over_cap`` (issue:
  <= 5 in flight, p95 <= 100 ms, throughput >= 0.8 x capacity);
* ``--autothrottle``: Scrapy's own AutoThrottle, 4 plain ``scrapy runspider`` processes (no
  fleet) with a quarter of the URLs each, ``DOWNLOAD_DELAY`` = ``AUTOTHROTTLE_START_DELAY``
  = 4 / 25 s (together the same 25 req/s ceiling), the rest Scrapy's defaults;
* ``--crawl-delay 120``: a second host (127.0.0.3) whose robots.txt asks ``Crawl-delay:
  120`` beside the capacity host, ``ROBOTSTXT_OBEY`` on; the run lasts until two of its
  pages could have been fetched (2 x delay + 20 s); ``slow_gaps_s``: the gaps between its
  requests, and the capacity host's figures over the curve as in the other runs.

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_adaptive.py [--scale 1] [--workers 4]
[--status 429] [--only adaptive] [--mode latency] [--autothrottle] [--crawl-delay S]``.
Prints a report and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import _harness as h
import redis as redis_lib
from bench_politeness import (
    PLAIN_SPIDER,
    TEST_PROJECT,
    MultiSite,
    interrupt,
    max_in_window,
    push,
    start_fleet,
)

from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

ADDR = "127.0.0.2"
SLOW = "127.0.0.3"  # --crawl-delay: the host asking a long Crawl-delay
CEILING = 25.0
PAGES = 3000
BASE_LATENCY = 0.05  # --mode latency: the site's latency without a queue (s)


def phases(scale: float) -> list[list[float]]:
    return [[15 * scale, 20.0], [60 * scale, 5.0], [100 * scale, 20.0]]


def behaviour(args: argparse.Namespace) -> dict[str, Any]:
    rule: dict[str, Any] = {"prefix": "/site/p/", "phases": phases(args.scale),
                            "status": args.status, "host": ADDR}
    if args.mode == "latency":
        rule["latency"] = BASE_LATENCY
    out: dict[str, Any] = {"capacity": [rule]}
    if args.crawl_delay:
        out["robots"] = {SLOW: f"User-agent: *\nCrawl-delay: {args.crawl_delay:g}\n"}
    return out


def start_plain_autothrottle(urls: list[str], env: dict[str, str], run: Path
                             ) -> list[Any]:
    """Scrapy's AutoThrottle, 4 processes of the plain spider of bench_politeness (no fleet,
    no add-on), a quarter of *urls* each; each process's delay floor 4/25 s."""
    spider_file = run / "plain_fetch.py"
    spider_file.write_text(PLAIN_SPIDER)
    procs = []
    for i in range(4):
        listing = run / f"plain-urls-{i}.txt"
        listing.write_text("\n".join(urls[i::4]) + "\n")
        procs.append(h.scrapy(
            ["runspider", str(spider_file), "-a", f"urls={listing}", *h.setting_args({
                "ADDONS": {}, "AUTOTHROTTLE_ENABLED": True, "DOWNLOAD_DELAY": 4 / CEILING,
                "AUTOTHROTTLE_START_DELAY": 4 / CEILING, "RETRY_TIMES": 100,
                "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO"})],
            env, run / f"plain-w{i}.log", cwd=run))
    return procs


def one_run(tag: str, args: argparse.Namespace, root: Path, workers: int = 4,
            adaptive: bool = True, autothrottle: bool = False) -> dict[str, Any]:
    run = root / tag
    run.mkdir()
    curve = phases(args.scale)
    binds = [ADDR, SLOW] if args.crawl_delay else [ADDR]
    with h.Redis(run) as redis, MultiSite(root / "www", run / "site.jsonl", binds,
                                          behaviour(args)) as site:
        env = h.worker_env(run)
        urls = site.page_urls(ADDR, range(PAGES))
        if autothrottle:
            procs = start_plain_autothrottle(urls, env, run)
        else:
            slow = site.page_urls(SLOW, range(10)) if args.crawl_delay else []
            push(slow + urls, redis.url, env, run)
            settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_RATE": CEILING,
                        "FLEET_ADAPTIVE": adaptive, "RETRY_TIMES": 100, "LOG_LEVEL": "INFO",
                        "FLEET_HOST_CONCURRENCY": 4 if args.mode == "latency" else 16}
            if args.crawl_delay:
                settings["ROBOTSTXT_OBEY"] = True
            procs, _ = start_fleet(workers, settings, env, run, tag)
        start = first_request(site, procs)
        end = curve[-1][0] + (2 * args.crawl_delay + 20 if args.crawl_delay else 0)
        time.sleep(max(0.0, start + end - time.time()))
        interrupt(procs)
        recs = [r for r in site.records(ADDR, prefix="/site/p/")
                if r["t"] < start + curve[-1][0]]
        out = (latency_figures(recs, start, curve) if args.mode == "latency"
               else figures(recs, start, curve))
        if args.crawl_delay:
            out.update(slow_figures(site.records(SLOW), start))
        if not autothrottle:
            out.update(adaptive_counters(redis.url))
    return out


def first_request(site: MultiSite, procs: list[Any]) -> float:
    """The site's time (s) of the capacity host's first page request (waits up to 120 s)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        recs = site.records(ADDR, prefix="/site/p/")
        if recs:
            return float(recs[0]["t"])
        time.sleep(0.2)
    interrupt(procs)
    raise RuntimeError("no request reached the site")


def adaptive_counters(redis_url: str) -> dict[str, Any]:
    """The crawl's adaptive counters and, as ``state``, the capacity host's controller at the
    end ("r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n", lua/adaptive.lua)."""
    client = redis_lib.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "fetch")
    out: dict[str, Any] = {k.decode(): int(v) for k, v in client.hgetall(keys.stats).items()
                           if k.startswith(b"adaptive") and v.isdigit()}
    state = client.hget(keys.adaptive, ADDR)
    out["state"] = state.decode() if state else None
    return out


def steady_windows(start: float, curve: list[list[float]]) -> list[tuple[float, float, float]]:
    """(from, to, capacity) of each phase's second half, site clock (s)."""
    out, before = [], 0.0
    for until, rate in curve:
        out.append((start + (before + until) / 2, start + until, rate))
        before = until
    return out


def figures(recs: list[dict[str, Any]], start: float, curve: list[list[float]]
            ) -> dict[str, Any]:
    drop, rise, end = (start + c[0] for c in curve)

    def count(a: float, b: float, ok: bool | None = None) -> int:
        return sum(1 for r in recs if a <= r["t"] < b
                   and (ok is None or (r["status"] == 200) == ok))

    low_from = drop + 5 * (rise - drop) / 45  # 5 s after the drop at scale 1
    last30 = rise - 30 * (rise - drop) / 45
    ok_times = sorted(r["t"] for r in recs if r["status"] == 200)
    times = sorted(r["t"] for r in recs)
    recovery = None
    t = rise
    while t + 2 <= end:
        if sum(1 for x in ok_times if t <= x < t + 2) >= 32:
            recovery = round(t + 2 - rise, 1)
            break
        t += 0.5
    return {
        "requests": len(recs), "ok": len(ok_times),
        "refused": sum(1 for r in recs if r["status"] != 200),
        "over_share_all": round(count(start, end, False) / max(1, count(start, end)), 3),
        "goodput_high1": round(count(start, drop, True) / (drop - start), 2),
        "rate_2s_at_drop_plus_5": round(count(drop + 3, drop + 5) / 2, 1),
        "over_share_low": round(count(low_from, rise, False) / max(1, count(low_from, rise)), 3),
        "over_share_low_last30": round(count(last30, rise, False) / max(1, count(last30, rise)),
                                       3),
        "goodput_low": round(count(drop, rise, True) / (rise - drop), 2),
        "goodput_high2": round(count(rise, end, True) / (end - rise), 2),
        "recovery_s": recovery,
        "max_1s": max_in_window(times, 1.0),
        "max_1s_at": round(max_window_start(times) - start, 1),
        "steady": [round(count(a, b, True) / (b - a), 2)
                   for a, b, _ in steady_windows(start, curve)],
    }


def latency_figures(recs: list[dict[str, Any]], start: float, curve: list[list[float]]
                    ) -> dict[str, Any]:
    """Per phase's second half: throughput over capacity, requests held at the site on
    average (Little's law: the sum of the holds of the requests arriving in the window over
    its length), p95 and median hold (ms), and the mean of the site's in-flight count at
    arrival."""
    phases_out = []
    for a, b, cap in steady_windows(start, curve):
        held = sorted(r.get("held", 0.0) for r in recs if a <= r["t"] < b)
        ok = sum(1 for r in recs if a <= r["t"] < b and r["status"] == 200)
        conc = [r["concurrent"] for r in recs if a <= r["t"] < b]
        phases_out.append({
            "capacity": cap, "tput": round(ok / (b - a), 2),
            "tput_over_cap": round(ok / (b - a) / cap, 2),
            "inflight_avg": round(sum(held) / (b - a), 2),
            "p50_ms": round(1000 * held[len(held) // 2], 1) if held else None,
            "p95_ms": round(1000 * held[int(0.95 * (len(held) - 1))], 1) if held else None,
            "concurrent_at_arrival": round(sum(conc) / len(conc), 2) if conc else None})
    end = start + curve[-1][0]
    return {"requests": len(recs), "refused": sum(1 for r in recs if r["status"] != 200),
            "inflight_avg_all": round(sum(r.get("held", 0.0) for r in recs) / (end - start), 2),
            "phases": phases_out, "steady": [p["tput"] for p in phases_out]}


def slow_figures(recs: list[dict[str, Any]], start: float) -> dict[str, Any]:
    """The Crawl-delay host's requests: robots.txt and page times (s from the capacity host's
    first request) and the gaps between consecutive ones."""
    times = sorted(r["t"] for r in recs)
    return {"slow_paths": [r["path"] for r in sorted(recs, key=lambda r: r["t"])],
            "slow_at_s": [round(t - start, 1) for t in times],
            "slow_gaps_s": [round(b - a, 2) for a, b in itertools.pairwise(times)]}


def max_window_start(times: list[float], width: float = 1.0) -> float:
    """Where (s, site clock) the 1-s window of max_in_window starts (0.0: no request)."""
    counts = [bisect.bisect_left(times, t + width) - i for i, t in enumerate(times)]
    return times[counts.index(max(counts))] if counts else 0.0


def spread(runs: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Each run's steady rates over the runs' mean, per phase."""
    per_phase = list(zip(*(r["steady"] for r in runs.values()), strict=True))
    means = [sum(p) / len(p) for p in per_phase]
    return {tag: [round(x / m, 3) if m else 0.0 for x, m in zip(r["steady"], means, strict=True)]
            for tag, r in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", default="4", help="fleet sizes, e.g. 1,2,4")
    parser.add_argument("--status", type=int, default=429)
    parser.add_argument("--only", choices=("adaptive", "baseline"), default=None)
    parser.add_argument("--mode", choices=("refuse", "latency"), default="refuse")
    parser.add_argument("--autothrottle", action="store_true",
                        help="also Scrapy's AutoThrottle, 4 plain processes")
    parser.add_argument("--crawl-delay", type=float, default=0.0,
                        help="a second host asking this Crawl-delay (s)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.workers.split(",")]
    out: dict[str, Any] = {"workers": sizes, "status": args.status, "mode": args.mode,
                           "crawl_delay": args.crawl_delay, "scale": args.scale,
                           "machine": h.machine(), "load": os.getloadavg()}
    runs: list[tuple[str, dict[str, Any]]] = []
    if args.only != "baseline":
        runs += [(f"adaptive-w{n}" if len(sizes) > 1 else "adaptive", {"workers": n})
                 for n in sizes]
    if args.only != "adaptive":
        runs.append(("baseline", {"workers": max(sizes), "adaptive": False}))
    if args.autothrottle:
        runs.append(("autothrottle-x4", {"autothrottle": True}))
    with h.workdir("fleet-bench-adaptive-") as root:
        generate_site(root / "www", PAGES, 2, seed=4)
        for tag, kwargs in runs:
            out[tag] = one_run(tag, args, root, **kwargs)
            print(f"{tag:15s}", json.dumps(out[tag]), flush=True)
    sized = {t: out[t] for t, _ in runs if t.startswith("adaptive-w")}
    if len(sized) > 1:
        out["steady_vs_mean"] = spread(sized)
        print("steady_vs_mean", json.dumps(out["steady_vs_mean"]), flush=True)
    out["load_after"] = os.getloadavg()
    assert TEST_PROJECT.is_dir()
    h.emit_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
