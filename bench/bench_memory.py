"""Redis memory per queued request, and the push helper's speed, on an empty crawl.

For each tree (this one, and ``--baseline DIR``, e.g. a ``git worktree`` of main) and each
host count (``--hosts 1000,1``), a fresh ``redis-server`` gets ``--urls`` (1,000,000) distinct
50-byte URLs pushed with the push helper's own loop (``scrapy_fleet.commands.push.push_lines``,
as ``scrapy-fleet push`` runs it: parse, encode, fingerprint, batches of 200) over H hosts.

Reported: ``used_memory`` after minus before, per URL (every key counted: queue, data, per
host counters, ready set, Bloom filter, ...); the Bloom filter's part (``MEMORY USAGE`` of
its keys) and the rest per URL; ``MEMORY USAGE`` of each crawl key (``--keys``, sampled:
``SAMPLES 0`` = exact for the aggregate types, slow on big keys, so only the ones named; the
queue buckets, one LIST per host and priority, summed as ``qb:*``);
URLs pushed per second (wall clock of the whole push).

Usage: ``.venv/bin/python bench/bench_memory.py --baseline ../frontier-baseline
[--urls 1000000] [--hosts 1000,1]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if "--child" not in sys.argv:  # a child imports the scrapy_fleet of PYTHONPATH, not ours
    import _harness as h


def url(i: int, hosts: int) -> str:
    # 50 bytes: "http://h00042.example.org/docs/page/000001234.html" has 50 characters
    return f"http://h{i % hosts:05d}.example.org/docs/page/{i:09d}.html"


def child(args: argparse.Namespace) -> None:
    import redis

    import scrapy_fleet
    from scrapy_fleet.commands.push import default_fingerprinter, push_lines
    from scrapy_fleet.frontier.admin import FrontierAdmin

    assert len(url(0, 1)) == 50
    r = redis.Redis.from_url(args.url)
    before = r.info("memory")["used_memory"]
    admin = FrontierAdmin(args.url, "mem")
    lines = ((i + 1, url(i, args.hosts)) for i in range(args.urls))
    t0 = time.perf_counter()
    report = push_lines(admin, lines, default_fingerprinter())
    wall = time.perf_counter() - t0
    after = r.info("memory")["used_memory"]
    keys = sorted(k.decode() for k in r.scan_iter(match="fleet:{mem}:*", count=1000))
    usage: dict[str, int] = {}
    enc: dict[str, str] = {}
    buckets = 0
    for k in keys:
        name = k.split(":", 2)[2]
        if name.startswith("op:"):
            continue
        size = r.memory_usage(k, samples=0 if "bloom" in k else 5) or 0
        if name.startswith("qb:"):  # the queue buckets (one LIST per host and priority)
            buckets += 1
            usage["qb:*"] = usage.get("qb:*", 0) + size
            enc["qb:*"] = r.object("encoding", k).decode()
        else:
            usage[name] = size
            enc[name] = r.object("encoding", k).decode()
    if buckets:
        enc["qb:*"] += f" x{buckets}"
    bloom = sum(v or 0 for k, v in usage.items() if k.startswith("bloom"))
    n = max(report.pushed, 1)
    print(json.dumps({
        "tree": str(Path(scrapy_fleet.__file__).parent.parent), "hosts": args.hosts,
        "pushed": report.pushed, "urls_per_s": round(report.pushed / wall, 1),
        "used_memory_delta": after - before, "bytes_per_url": round((after - before) / n, 1),
        "bloom_bytes": bloom, "bytes_per_url_without_bloom": round((after - before - bloom) / n, 1),
        "keys": usage, "encodings": enc}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", default="")
    p.add_argument("--baseline", type=Path, default=None)
    p.add_argument("--urls", type=int, default=1_000_000)
    p.add_argument("--hosts", default="1000,1")
    args = p.parse_args()
    if args.child:
        args.hosts = int(args.hosts)
        child(args)
        return
    trees = {"new": h.REPO_ROOT}
    if args.baseline:
        trees["base"] = args.baseline.resolve()
    figures: dict[str, Any] = {"machine": h.machine(), "urls": args.urls, "runs": []}
    with h.workdir("fleet-memory-") as root:
        for hosts in [int(x) for x in args.hosts.split(",")]:
            for name, tree in trees.items():
                with h.Redis(root / f"r-{name}-{hosts}") as server:
                    env = dict(os.environ)
                    env["PYTHONPATH"] = str(tree)
                    out = subprocess.run(
                        [h.PYTHON, str(Path(__file__).resolve()), "--child", "--url", server.url,
                         "--urls", str(args.urls), "--hosts", str(hosts)],
                        capture_output=True, text=True, env=env, cwd=h.BENCH_DIR, check=True)
                    run = json.loads(out.stdout.strip().splitlines()[-1])
                    run["impl"] = name
                    figures["runs"].append(run)
                    print(f"{name:>5} hosts={hosts:<5} pushed={run['pushed']} "
                          f"{run['urls_per_s']} URLs/s  {run['bytes_per_url']} B/URL "
                          f"({run['bytes_per_url_without_bloom']} without the Bloom filter, "
                          f"bloom {run['bloom_bytes']} B)  keys={run['keys']} "
                          f"enc={run['encodings']}", flush=True)
    h.emit_json(figures)


if __name__ == "__main__":
    main()
