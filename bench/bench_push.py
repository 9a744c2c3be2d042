"""The push command line's speed: ``scrapy-fleet push CRAWL -f FILE`` of ``--urls`` lines into
an empty crawl, wall clock, this tree beside ``--baseline DIR`` in one run.

The file: ``--urls`` (1,000,000) distinct 50-byte URLs over ``--hosts`` (1,000) hosts, as
bench_memory.py's.  Each run: a fresh ``redis-server``, then the command line exactly as a user
types it (``python -m scrapy_fleet.commands.cli --redis URL push CRAWL -f FILE``, the tree on
PYTHONPATH), timed from the process start to its exit (interpreter and Scrapy imports
included).  Rounds alternate (new, base / base, new / ...; ``--rounds``, 2).  Per run: wall
seconds, URLs/s, the EVALSHA calls and their ``usec`` (``INFO commandstats``: µs per call and
per URL), the CPU seconds of the command (children's utime + stime) and of redis-server
(``/proc/<pid>/stat``).

Part ``--batches 100,200,500,1000`` (instead of the command line): this tree's
``push_lines`` in this process, ``--batch-urls`` (200,000) URLs per run into a fresh
``redis-server`` with each batch size (lines per frontier call), rounds alternating the order;
URLs/s and EVALSHA µs per call and per URL (the time one call holds Redis).

Usage: ``.venv/bin/python bench/bench_push.py --baseline ../push5-base [--urls 1000000]``,
``.venv/bin/python bench/bench_push.py --batches 100,200,500,1000``
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import _harness as h
import redis


def url(i: int, hosts: int) -> str:
    return f"http://h{i % hosts:05d}.example.org/docs/page/{i:09d}.html"


def redis_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(root: Path, name: str, tree: Path, data: Path, urls: int) -> dict[str, Any]:
    with h.Redis(root / f"r-{name}-{time.monotonic_ns()}") as server:
        env = dict(os.environ, PYTHONPATH=str(tree), HOME=str(root), XDG_CONFIG_HOME=str(root),
                   XDG_CACHE_HOME=str(root), XDG_DATA_HOME=str(root))
        used = subprocess.run([h.PYTHON, "-c", "import scrapy_fleet; print(scrapy_fleet.__file__)"],
                              env=env, capture_output=True, text=True, check=True).stdout.strip()
        assert used.startswith(str(tree)), used
        client = redis.Redis.from_url(server.url)
        cpu0 = redis_cpu(server.proc.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run([h.PYTHON, "-m", "scrapy_fleet.commands.cli", "--redis", server.url,
                              "push", "bench", "-f", str(data)],
                             env=env, capture_output=True, text=True, cwd=root)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        # distinct URLs: a duplicate is a false positive of the Bloom filter (~0.01 %)
        counts = re.search(r"pushed (\d+), duplicates (\d+), rejected 0", out.stdout)
        assert out.returncode == 0 and counts, (out.stdout, out.stderr[-2000:])
        assert int(counts[1]) + int(counts[2]) == urls and int(counts[2]) < urls // 1000
        return {
            "impl": name, "tree": used, "wall_s": round(wall, 2), "pushed": int(counts[1]),
            "urls_per_s": round(urls / wall, 1),
            "evalsha_calls": stats.get("calls"),
            "evalsha_usec_per_call": stats.get("usec_per_call"),
            "evalsha_usec_per_url": round(stats.get("usec", 0) / urls, 2),
            "command_cpu_s": round(after.ru_utime + after.ru_stime
                                   - before.ru_utime - before.ru_stime, 2),
            "redis_cpu_s": round(redis_cpu(server.proc.pid) - cpu0, 2),
        }


def batch_run(root: Path, batch: int, urls: int, hosts: int) -> dict[str, Any]:
    from scrapy_fleet.commands.push import default_fingerprinter, push_lines
    from scrapy_fleet.frontier.admin import FrontierAdmin

    with h.Redis(root / f"b-{batch}-{time.monotonic_ns()}") as server:
        client = redis.Redis.from_url(server.url)
        admin = FrontierAdmin(server.url, "batch")
        # the script loaded and the first Bloom slice allocated before the clock starts
        push_lines(admin, [(1, "http://warm.example.org/")], default_fingerprinter())
        client.config_resetstat()
        lines = ((i + 1, url(i, hosts)) for i in range(urls))
        t0 = time.perf_counter()
        report = push_lines(admin, lines, default_fingerprinter(), batch=batch)
        wall = time.perf_counter() - t0
        stats = client.info("commandstats")["cmdstat_evalsha"]
        return {"batch": batch, "pushed": report.pushed, "urls_per_s": round(urls / wall, 1),
                "evalsha_usec_per_call": stats["usec_per_call"],
                "evalsha_usec_per_url": round(stats["usec"] / urls, 2)}


def batches_part(args: argparse.Namespace) -> None:
    sizes = [int(x) for x in args.batches.split(",")]
    figures: dict[str, Any] = {"machine": h.machine(), "urls": args.batch_urls, "runs": []}
    with h.workdir("fleet-push-batch-") as root:
        for r in range(args.rounds):
            for batch in sizes if r % 2 == 0 else sizes[::-1]:
                run = batch_run(root, batch, args.batch_urls, args.hosts)
                run["round"] = r
                figures["runs"].append(run)
                print(f"round {r} batch {batch:>5}: {run['urls_per_s']} URLs/s  EVALSHA "
                      f"{run['evalsha_usec_per_call']} µs/call, {run['evalsha_usec_per_url']} "
                      "µs/URL", flush=True)
    figures["median"] = {
        b: {k: h.median([r[k] for r in figures["runs"] if r["batch"] == b])
            for k in ("urls_per_s", "evalsha_usec_per_call", "evalsha_usec_per_url")}
        for b in sizes}
    for b, m in figures["median"].items():
        print(f"median batch {b:>5}: {m}", flush=True)
    h.emit_json(figures)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, default=None)
    p.add_argument("--urls", type=int, default=1_000_000)
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", default="", help="batch sizes to compare (see above)")
    p.add_argument("--batch-urls", type=int, default=200_000)
    args = p.parse_args()
    if args.batches:
        batches_part(args)
        return
    trees = {"new": h.REPO_ROOT}
    if args.baseline:
        trees["base"] = args.baseline.resolve()
    figures: dict[str, Any] = {"machine": h.machine(), "urls": args.urls, "hosts": args.hosts,
                               "runs": []}
    with h.workdir("fleet-push-") as root:
        data = root / "urls.txt"
        with data.open("w") as handle:
            for i in range(args.urls):
                handle.write(url(i, args.hosts) + "\n")
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                run = one_run(root, name, tree, data, args.urls)
                run["round"] = r
                figures["runs"].append(run)
                print(f"round {r} {name:>4}: {run['wall_s']} s  {run['urls_per_s']} URLs/s  "
                      f"EVALSHA {run['evalsha_calls']} calls, {run['evalsha_usec_per_call']} "
                      f"µs/call, {run['evalsha_usec_per_url']} µs/URL  CPU command "
                      f"{run['command_cpu_s']} s, redis {run['redis_cpu_s']} s", flush=True)
    if "base" in trees:
        walls = {name: h.median([r["wall_s"] for r in figures["runs"] if r["impl"] == name])
                 for name in trees}
        figures["median_wall_s"] = walls
        figures["speedup"] = round(walls["base"] / walls["new"], 2)
        print(f"median wall: new {walls['new']} s, base {walls['base']} s: "
              f"{figures['speedup']}x", flush=True)
    h.emit_json(figures)


if __name__ == "__main__":
    main()
