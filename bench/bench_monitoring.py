"""Cost of the cockpit's data (scrapy_fleet/monitoring/): Redis calls it adds per worker, bytes
of its series, time of one ``read_snapshot`` with 100,000 hosts in the frontier.

1. *Calls*: one ``scrapy crawl docs`` worker of this tree and one of ``main`` (its files
   taken with ``git archive main`` into the temporary directory and put first on PYTHONPATH)
   run the same windows, one after the other, each on a fresh Redis; a MONITOR connection
   counts every command clients send (commands run inside Lua scripts, tagged ``lua``, are
   left out).  Windows:
   * ``idle``: empty crawl, no FLEET_IDLE_TIMEOUT, the default FLEET_POLL_INTERVAL (0.5 s);
   * ``idle_poll30``: the same with FLEET_POLL_INTERVAL=30 and FLEET_LEASE_TIMEOUT=300, a
     worker that would call Redis twice a minute: what the heartbeat (FLEET_HEARTBEAT_INTERVAL
     5 s, so that a silent worker is dead within 15 s) adds at worst;
   * ``busy``: crawling a generated site (3000 pages x 5 links, each page held 50 ms by the
     site server, CONCURRENT_REQUESTS 16), a window of ``--busy`` seconds from the 3rd second
     on; calls per second, per page, and the worker's CPU seconds per page (utime + stime from
     /proc); ``--rounds`` rounds in the order branch, main, main, branch, ... (medians), as
     the machine's load moves pages/s a lot.
   Added = this tree - main: per second for the idle windows; for the busy one, per page
   (times this tree's pages/s, for a figure per second at its rate).
2. *Series bytes*: STRLEN and MEMORY USAGE of the three ring buffers (10 s x 360, 1 min x
   1440, 10 min x 1008) after the first sample, after a week's worth of slots written (every
   slot filled by SETRANGE with valid samples), and after 10,000 pushes on 1,000 hosts and
   500 churned worker ids: the same bytes.
3. *Snapshot*: ``read_snapshot`` with 100,000 hosts (one queued entry each) in the frontier,
   median of 20 calls, and its round trips.
4. *Worker CPU*: microseconds of ``WorkerMonitor.payload`` + ``confirmed`` per frontier call
   (stats of 83 entries) and of ``on_response`` with its host key per response, in this
   process (the busy windows' CPU per page moves too much with the machine's load to show a
   cost this small).

Usage: ``.venv/bin/python bench/bench_monitoring.py [--idle 20] [--busy 15] [--no-main]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
import msgpack
from bench_throughput import Monitor

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import series
from scrapy_fleet.monitoring.snapshot import read_snapshot
from testsite import generate_site


def main_tree(root: Path) -> Path:
    """``main``'s files in *root*/main (git archive: the main worktree is not touched)."""
    dest = root / "main"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(h.REPO_ROOT), "archive", "main"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def env_for(root: Path, tree: Path | None) -> dict[str, str]:
    env = h.worker_env(root)
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}:{env['PYTHONPATH']}"
    return env


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def window(redis: h.Redis, proc: Any, seconds: float) -> dict[str, Any]:
    mon = Monitor(redis.port)
    cpu0 = proc_cpu(proc.pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    cpu = proc_cpu(proc.pid) - cpu0
    mon.close()
    counts = mon.counts()
    total = sum(counts.values())
    return {"calls_per_s": round(total / dt, 3), "by_command": dict(counts.most_common(6)),
            "seconds": round(dt, 1), "alive": proc.poll() is None, "cpu_s": round(cpu, 2)}


def run_idle(root: Path, redis: h.Redis, tree: Path | None, extra: dict[str, Any],
             seconds: float, tag: str) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    log = root / f"idle-{tag}.log"
    proc = h.scrapy(["crawl", "docs", *h.setting_args({"FLEET_REDIS_URL": redis.url,
                                                       **extra})], env_for(root, tree), log)
    try:
        h.wait_for_text(log, "joined crawl", 90, proc)
        time.sleep(2.0)
        return window(redis, proc, seconds)
    finally:
        h.stop(proc)


def run_busy(root: Path, redis: h.Redis, site: h.Site, tree: Path | None, seconds: float,
             tag: str) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    env = env_for(root, tree)
    push = h.scrapy_run(["fleet", "push", "docs", site.url + "site/", "-s",
                         f"FLEET_REDIS_URL={redis.url}"], env)
    if push.returncode != 0:
        raise RuntimeError(push.stderr)
    log = root / f"busy-{tag}.log"
    proc = h.scrapy(["crawl", "docs", *h.setting_args({
        "FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 2, "CONCURRENT_REQUESTS": 16})],
        env, log)
    keys = CrawlKeys("fleet", "docs")
    try:
        h.wait_for_text(log, "joined crawl", 90, proc)
        time.sleep(3.0)
        acked0 = int(client.hget(keys.stats, "acked") or 0)
        out = window(redis, proc, seconds)
        acked = int(client.hget(keys.stats, "acked") or 0) - acked0
        out["pages_per_s"] = round(acked / out["seconds"], 1)
        out["calls_per_page"] = round(out["calls_per_s"] / max(out["pages_per_s"], 1e-9), 4)
        out["cpu_ms_per_page"] = round(1000 * out["cpu_s"] / max(acked, 1), 3)
        return out
    finally:
        h.stop(proc)


def series_bytes(redis: h.Redis) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    admin = FrontierAdmin(redis.url, "week")
    keys = admin.keys
    admin.push([(b"w" * 12, 0, b"x", 0, "h")])  # the first call takes the first samples

    def sizes() -> dict[str, Any]:
        strlen = {t: client.strlen(keys.series(t)) for t in series.TIERS}
        usage = {t: client.memory_usage(keys.series(t)) or 0 for t in series.TIERS}
        return {"strlen": strlen, "strlen_total": sum(strlen.values()),
                "memory_usage_total": sum(usage.values())}

    first = sizes()
    now_ms = int(time.time() * 1000)
    for tier, (step, points) in series.TIERS.items():  # a week (or the tier's span) of slots
        raw = bytearray(series.tier_bytes(tier))
        for n in range(points):
            t = now_ms - n * step * 1000
            slot = (t // (step * 1000)) % points
            series._SLOT.pack_into(raw, slot * series.SLOT_BYTES, t, 10, 1, 2, 0, 0, n, n, 0, 3)
        client.setrange(keys.series(tier), 0, bytes(raw))
    week = sizes()
    for chunk in range(20):
        admin.push([(f"{chunk:04d}{i:08d}".encode(), 0, b"x", 0, f"h{i % 1000}")
                    for i in range(500)])
    for n in range(500):
        arg = msgpack.packb({"hb": {"st": "idle"}, "cs": 1, "c": {"pages": 1}, "fa": 1000},
                            use_bin_type=False)
        admin.call(CallBatch(beat=True), worker=f"churn{n}:{n}:1", monitor=arg)
    after = sizes()
    return {"first_sample": first, "week_filled": week, "after_churn": after}


def snapshot_time(redis: h.Redis, hosts: int = 100_000) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    admin = FrontierAdmin(redis.url, "wide", params=None)
    for start in range(0, hosts, 500):
        admin.push([(f"{i:012d}".encode(), 0, b"x", 0, f"h{i}.test")
                    for i in range(start, min(hosts, start + 500))])
    keys = admin.keys
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        snap = read_snapshot(client, keys)
        times.append(time.perf_counter() - t0)
    return {"hosts": hosts, "median_ms": round(1000 * statistics.median(times), 1),
            "max_ms": round(1000 * max(times), 1), "round_trips": 3,
            "hosts_sampled": snap["hosts_sampled"], "runnable_now": snap["runnable_now"],
            "due": snap["frontier"]["due"]}


def worker_cost() -> dict[str, float]:
    import timeit

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.monitoring.heartbeat import WorkerMonitor
    from scrapy_fleet.politeness import hosts as politeness

    class Stats:
        def __init__(self) -> None:
            self.values = {f"other/stat/{i}": i for i in range(80)}
            self.values.update({"downloader/response_status_count/200": 1000,
                                "item_scraped_count": 900, "downloader/response_bytes": 10**6})

        def get_stats(self) -> dict[str, int]:
            return dict(self.values)

    stats = Stats()
    mon = WorkerMonitor(stats, FleetConfig.from_settings({}), 1.0, "vm", 1)

    def call() -> None:
        stats.values["downloader/response_status_count/200"] += 3
        mon.payload("fetching", 10, 5)
        mon.confirmed()

    n = 20_000
    per_call = timeit.timeit(call, number=n) / n
    per_response = timeit.timeit(
        lambda: mon.on_response(politeness.host_key("http://127.0.0.1:8000/site/p/1.html"),
                                200), number=n) / n
    return {"payload_us_per_call": round(per_call * 1e6, 1),
            "on_response_us": round(per_response * 1e6, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=20.0, help="seconds per idle window")
    parser.add_argument("--busy", type=float, default=15.0, help="seconds of the busy window")
    parser.add_argument("--rounds", type=int, default=2, help="busy windows per tree")
    parser.add_argument("--no-main", action="store_true", help="skip main's worker")
    opts = parser.parse_args(argv)
    figures: dict[str, Any] = {"machine": h.machine()}
    with h.workdir() as root, h.Redis(root) as redis:
        generate_site(root / "www", 3000, 5, seed=11)
        trees: dict[str, Path | None] = {"branch": None}
        if not opts.no_main:
            trees["main"] = main_tree(root)
        calls: dict[str, Any] = {}
        site_log = root / "site.jsonl"
        with h.Site(root / "www", site_log) as site:
            site_cfg = ('{"delays": [{"prefix": "/site/p/", "seconds": 0.05}]}')
            import urllib.request

            urllib.request.urlopen(urllib.request.Request(
                site.url + "_testsite/config", data=site_cfg.encode(), method="PUT")).read()
            for name, tree in trees.items():
                calls[name] = {
                    "idle": run_idle(root, redis, tree, {}, opts.idle, name),
                    "idle_poll30": run_idle(root, redis, tree, {
                        "FLEET_POLL_INTERVAL": 30, "FLEET_LEASE_TIMEOUT": 300}, opts.idle,
                        name + "-p30"),
                    "busy_rounds": [],
                }
                print(f"{name}: {calls[name]}", flush=True)
            names = list(trees)
            for r in range(opts.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    got = run_busy(root, redis, site, trees[name], opts.busy, f"{name}-{r}")
                    calls[name]["busy_rounds"].append(got)
                    print(f"{name} busy round {r + 1}: {got}", flush=True)
            for name in names:
                rounds = calls[name]["busy_rounds"]
                calls[name]["busy"] = {
                    key: round(h.median([x[key] for x in rounds]), 4)
                    for key in ("calls_per_s", "pages_per_s", "calls_per_page",
                                "cpu_ms_per_page")}
        figures["calls"] = calls
        if "main" in calls:
            figures["added_calls_per_s"] = {
                w: round(calls["branch"][w]["calls_per_s"] - calls["main"][w]["calls_per_s"], 3)
                for w in ("idle", "idle_poll30")}
            per_page = (calls["branch"]["busy"]["calls_per_page"]
                        - calls["main"]["busy"]["calls_per_page"])
            figures["added_calls_per_page_busy"] = round(per_page, 4)
            figures["added_calls_per_s"]["busy"] = round(
                per_page * calls["branch"]["busy"]["pages_per_s"], 3)
            figures["cpu_ms_per_page_busy"] = {
                n: calls[n]["busy"]["cpu_ms_per_page"] for n in names}
        figures["series_bytes"] = series_bytes(redis)
        print(f"series: {figures['series_bytes']}", flush=True)
        figures["snapshot"] = snapshot_time(redis)
        print(f"snapshot: {figures['snapshot']}", flush=True)
    figures["worker_cost"] = worker_cost()
    print(f"worker cost: {figures['worker_cost']}", flush=True)
    h.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
