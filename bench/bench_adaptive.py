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
  ``max_1s_at`` where that window starts (s from the first request).

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_adaptive.py [--scale 1] [--workers 4]
[--status 429] [--only adaptive]``.  Prints a report and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import bisect
import json
import time
from pathlib import Path
from typing import Any

import _harness as h
import redis as redis_lib
from bench_politeness import TEST_PROJECT, MultiSite, interrupt, max_in_window, push, start_fleet

from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

ADDR = "127.0.0.2"
CEILING = 25.0
PAGES = 3000


def phases(scale: float) -> list[list[float]]:
    return [[15 * scale, 20.0], [60 * scale, 5.0], [100 * scale, 20.0]]


def one_run(adaptive: bool, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    tag = "adaptive" if adaptive else "baseline"
    run = root / tag
    run.mkdir()
    curve = phases(args.scale)
    behaviour = {"capacity": [{"prefix": "/site/p/", "phases": curve, "status": args.status,
                               "host": ADDR}]}
    with h.Redis(run) as redis, MultiSite(root / "www", run / "site.jsonl", [ADDR],
                                          behaviour) as site:
        env = h.worker_env(run)
        push(site.page_urls(ADDR, range(PAGES)), redis.url, env, run)
        settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_RATE": CEILING,
                    "FLEET_ADAPTIVE": adaptive, "RETRY_TIMES": 100, "LOG_LEVEL": "INFO",
                    "FLEET_HOST_CONCURRENCY": 16}
        procs, _ = start_fleet(args.workers, settings, env, run, tag)
        start = None
        deadline = time.monotonic() + 120
        while start is None and time.monotonic() < deadline:
            recs = site.records(ADDR, prefix="/site/p/")
            start = recs[0]["t"] if recs else None
            time.sleep(0.2)
        if start is None:
            interrupt(procs)
            raise RuntimeError("no request reached the site")
        time.sleep(max(0.0, start + curve[-1][0] - time.time()))
        interrupt(procs)
        recs = [r for r in site.records(ADDR, prefix="/site/p/")
                if r["t"] < start + curve[-1][0]]
        client = redis_lib.Redis.from_url(redis.url)
        counters = {k.decode(): int(v) for k, v in
                    client.hgetall(CrawlKeys("fleet", "fetch").stats).items()
                    if k.startswith(b"adaptive") and v.isdigit()}
    return {**figures(recs, start, curve), **counters}


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
    }


def max_window_start(times: list[float], width: float = 1.0) -> float:
    """Where (s, site clock) the 1-s window of max_in_window starts (0.0: no request)."""
    counts = [bisect.bisect_left(times, t + width) - i for i, t in enumerate(times)]
    return times[counts.index(max(counts))] if counts else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--status", type=int, default=429)
    parser.add_argument("--only", choices=("adaptive", "baseline"), default=None)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"workers": args.workers, "status": args.status,
                           "scale": args.scale, "machine": h.machine()}
    with h.workdir("fleet-bench-adaptive-") as root:
        generate_site(root / "www", PAGES, 2, seed=4)
        for adaptive in (True, False):
            tag = "adaptive" if adaptive else "baseline"
            if args.only and args.only != tag:
                continue
            out[tag] = one_run(adaptive, args, root)
            print(f"{tag:9s}", json.dumps(out[tag]), flush=True)
    assert TEST_PROJECT.is_dir()
    h.emit_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
