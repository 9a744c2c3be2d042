"""The bounded frontier (FLEET_QUEUE_MAX): does it hold, and what does it cost?

Every run has its own fresh ``redis-server`` (so ``INFO memory`` ``used_memory_peak`` belongs
to that run alone) and its own test-site server; all on 127.0.0.1 in a temporary directory.

a. ``--parts a`` (crawl): a generated site of ``--pages`` x ``--links`` (default 20,000 x 10,
   plus the index) crawled by ``--workers`` (3) example-project ``docs`` workers
   (``scrapy fleet push docs URL``, then ``scrapy crawl docs -s FLEET_IDLE_TIMEOUT=3
   -s FLEET_JSONL_PATH=<one per worker>``), once with ``FLEET_QUEUE_MAX=--cap`` (500) and
   once unbounded (``FLEET_QUEUE_MAX=None``).  A thread samples the frontier's size
   (``FrontierAdmin.size()``) and Redis ``used_memory`` every 0.2 s.  Reported: pages with
   an item (against generate_site's paths), total fetches (items incl. re-fetches), max
   sampled size, memory peak (sampled and ``used_memory_peak``), the fleet-wide
   parked/resumed counters, wall time and unique pages/s, and bounded/unbounded throughput.
b. ``--parts b`` (push): ``--push-lines`` (1,000,000) distinct URL lines of a served site
   (``/site/p/<i % N>.html?n=<i>``; the site server ignores the query) pushed by
   ``scrapy-fleet --queue-max --push-cap (10,000) push urls1m -f FILE`` while
   ``--drain-workers`` (2) workers of ``bench/drain_spider.py`` (one item per page, no
   links; ``FLEET_CRAWL_ID=urls1m``, same FLEET_QUEUE_MAX) drain it, for ``--push-seconds``
   (150 s).  Sampled every 0.5 s: the helper's VmRSS, the size, the fleet-wide counters.
   Then SIGINT to the helper and to each worker (once: they acknowledge and release their
   leases) and a conservation check: pushed == acked + size + dead letters.
c. ``--parts c`` (cost): one worker crawls ``--cost-pages`` x ``--links`` (2000 x 10) with
   ``FLEET_QUEUE_MAX=--cost-cap`` (100,000: never reached, only the bookkeeping runs) and
   with ``None``, alternating for ``--rounds`` (3) rounds; rate = items / (last item -
   engine start) inside the worker (``benchext``), medians, ratio capped / unbounded.

Usage: ``.venv/bin/python bench/bench_backpressure.py [--parts abc] [--pages 20000] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import _harness as h

from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

EXT = {"benchext.BenchStats": 0}
SCRAPY_FLEET = Path(h.PYTHON).with_name("scrapy-fleet")


class Sampler(threading.Thread):
    """Every *interval* s: the frontier's size, Redis used_memory, optionally a process's
    VmRSS and the crawl's fleet-wide counters, and the parked requests (outside the size);
    each sample is (t, size, used_memory, rss, counters, parked)."""

    def __init__(self, redis: h.Redis, crawl: str, interval: float, pid: int | None = None,
                 counters: bool = False) -> None:
        super().__init__(daemon=True)
        self.admin = FrontierAdmin(redis.url, crawl)
        self.client = redis.client()
        self.interval = interval
        self.pid = pid
        self.counters = counters
        self.samples: list[tuple[float, int, int, int | None, dict[str, int], int]] = []
        self.stop_event = threading.Event()
        self.errors = 0

    def rss_kb(self) -> int | None:
        if self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def run(self) -> None:
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            try:
                size = self.admin.size()
                mem = int(self.client.info("memory")["used_memory"])
                raw = self.client.hgetall(self.admin.keys.stats) if self.counters else {}
                counters = {(k.decode() if isinstance(k, bytes) else k): int(v)
                            for k, v in raw.items()}
                parked = int(self.client.llen(self.admin.keys.parked))
                self.samples.append((time.time(), size, mem, self.rss_kb(), counters, parked))
            except Exception:  # a sampling hiccup must not end the bench
                self.errors += 1
            self.stop_event.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(10)
        self.admin.close()
        self.client.close()


def read_items(paths: list[Path]) -> list[dict[str, Any]]:
    items = []
    for path in paths:
        if path.exists():
            items += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return items


def iso_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def redis_memory(redis: h.Redis) -> dict[str, int]:
    client = redis.client()
    info = client.info("memory")
    client.close()
    return {"used_memory": int(info["used_memory"]),
            "used_memory_peak": int(info["used_memory_peak"])}


# -- a: bounded vs unbounded crawl of a large site ---------------------------------------------

def crawl_once(root: Path, www: Path, paths: list[str], queue_max: int | None, workers: int,
               timeout: float, label: str,
               redis_config: dict[str, str] | None = None) -> dict[str, Any]:
    run_dir = root / label
    run_dir.mkdir()
    with h.Redis(run_dir) as redis, h.Site(www, run_dir / "site.log") as site:
        if redis_config:
            config_client = redis.client()
            for name, value in redis_config.items():
                config_client.config_set(name, value)
            config_client.close()
        env = h.worker_env(run_dir)
        start = site.url + "site/"
        expected = {site.url.rstrip("/") + p for p in paths}
        push = h.scrapy_run(["fleet", "push", "docs", start, "-s",
                             f"FLEET_REDIS_URL={redis.url}"], env)
        if push.returncode != 0 or "pushed 1," not in push.stdout:
            raise RuntimeError(f"push failed: {push.stdout}{push.stderr}")
        mem0 = redis_memory(redis)
        outs = [run_dir / f"out-{n}.jsonl" for n in range(workers)]
        stats = [run_dir / f"stats-{n}.json" for n in range(workers)]
        logs = [run_dir / f"w-{n}.log" for n in range(workers)]
        sampler = Sampler(redis, "docs", 0.2)
        sampler.start()
        t0 = time.time()
        procs = [h.scrapy(["crawl", "docs", *h.setting_args({
            "FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 3,
            "FLEET_JSONL_PATH": outs[n], "FLEET_QUEUE_MAX": queue_max,
            "EXTENSIONS": EXT, "BENCH_STATS_PATH": stats[n]})], env, logs[n])
            for n in range(workers)]
        finished = True
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                finished = False
        if not finished:  # stop gracefully, then hard
            for proc in procs:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGINT)
            for proc in procs:
                if not _waited(proc, 30):
                    h.stop(proc)
        wall = time.time() - t0
        sampler.finish()
        codes = [p.returncode for p in procs]
        admin = FrontierAdmin(redis.url, "docs")
        status = admin.status()
        admin.close()
        mem = redis_memory(redis)
    items = read_items(outs)
    urls = {i["url"] for i in items}
    per_worker = [json.loads(s.read_text()) for s in stats if s.exists()]
    last_item = max((w["last_item"] or 0) for w in per_worker) if per_worker else 0.0
    engine0 = min((w["engine_started"] or t0) for w in per_worker) if per_worker else t0
    span = last_item - engine0 if last_item else wall
    sizes = [s[1] for s in sampler.samples]
    mems = [s[2] for s in sampler.samples]
    c = status["counters"]
    return {
        "label": label, "queue_max": queue_max, "redis_config": redis_config or {},
        "finished": finished, "exit_codes": codes,
        "expected_pages": len(expected), "pages_with_item": len(urls & expected),
        "missing": len(expected - urls), "extra_urls": len(urls - expected),
        "all_pages": urls == expected, "fetches": len(items),
        "refetches": len(items) - len(urls),
        "site_requests": sum(1 for _ in open(run_dir / "site.log")) if (
            run_dir / "site.log").exists() else None,
        "max_size": max(sizes, default=0), "samples": len(sizes),
        "samples_above_cap": sum(1 for s in sizes if queue_max and s > queue_max),
        "max_parked": max((s[5] for s in sampler.samples), default=0),
        "max_size_plus_parked": max((s[1] + s[5] for s in sampler.samples), default=0),
        "used_memory_start": mem0["used_memory"],
        "used_memory_max_sampled": max(mems, default=0),
        "used_memory_peak": mem["used_memory_peak"], "used_memory_end": mem["used_memory"],
        "used_memory_peak_above_start": mem["used_memory_peak"] - mem0["used_memory"],
        "parked": c.get("parked", 0), "resumed": c.get("resumed", 0),
        "deferred": c.get("deferred", 0), "refused": c.get("refused", 0),
        "pushed": c.get("pushed", 0), "acked": c.get("acked", 0),
        "duplicates": c.get("duplicates", 0),
        "end_size": status["size"], "end_parked": status["parked"], "dead": status["dead"],
        "wall_s": round(wall, 2), "span_s": round(span, 2),
        "pages_per_s": round(len(urls & expected) / span, 1) if span > 0 else 0.0,
        "fetches_per_s": round(len(items) / span, 1) if span > 0 else 0.0,
    }


def _waited(proc: subprocess.Popen[Any], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def part_a(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    www = root / "www-a"
    paths = generate_site(www, args.pages, args.links, seed=1)
    print(f"a. crawl of {len(paths)} pages x {args.links} links by {args.workers} workers, "
          f"FLEET_QUEUE_MAX={args.cap} vs None", flush=True)
    runs = {}
    plan: list[tuple[str, int | None, dict[str, str] | None]] = [
        ("bounded", args.cap, None), ("unbounded", None, None)]
    if not args.no_lzf_run:
        plan.append(("bounded_lzf", args.cap, {"list-compress-depth": "1"}))
    for label, cap, config in plan:
        run = crawl_once(root, www, paths, cap, args.workers, args.crawl_timeout, label, config)
        runs[label] = run
        extra = f", {config}" if config else ""
        print(f"  {label:9} (max {cap}{extra}): {run['pages_with_item']}/"
              f"{run['expected_pages']} pages with an item "
              f"({'all' if run['all_pages'] else 'NOT ALL'}), {run['fetches']} "
              f"fetches ({run['refetches']} re-fetches), max size {run['max_size']} "
              f"({run['samples']} samples), max parked {run['max_parked']} (max size + parked "
              f"{run['max_size_plus_parked']}), used_memory peak "
              f"{run['used_memory_peak'] / 1e6:.2f} MB (sampled max "
              f"{run['used_memory_max_sampled'] / 1e6:.2f} MB, start "
              f"{run['used_memory_start'] / 1e6:.2f} MB, peak above start "
              f"{run['used_memory_peak_above_start'] / 1e6:.2f} MB), parked {run['parked']}, "
              f"resumed "
              f"{run['resumed']}, wall {run['wall_s']} s, crawl {run['span_s']} s, "
              f"{run['pages_per_s']} pages/s ({run['fetches_per_s']} fetches/s), exit "
              f"{run['exit_codes']}{'' if run['finished'] else ' (STOPPED: timeout)'}",
              flush=True)
    b, u = runs["bounded"], runs["unbounded"]
    ratio = round(b["pages_per_s"] / u["pages_per_s"], 3) if u["pages_per_s"] else None
    print(f"  throughput bounded/unbounded (unique pages/s): {ratio}; fetches per page "
          f"{b['fetches'] / max(b['pages_with_item'], 1):.2f} vs "
          f"{u['fetches'] / max(u['pages_with_item'], 1):.2f}", flush=True)
    mem_ratio = round(b["used_memory_peak"] / u["used_memory_peak"], 3)
    above_ratio = round(b["used_memory_peak_above_start"] / u["used_memory_peak_above_start"], 3)
    print(f"  used_memory peak bounded/unbounded: {mem_ratio} (above the start: {above_ratio})",
          flush=True)
    out = {"pages": len(paths), "links": args.links, "workers": args.workers,
           "cap": args.cap, "bounded": b, "unbounded": u, "throughput_ratio": ratio,
           "memory_peak_ratio": mem_ratio, "memory_above_start_ratio": above_ratio}
    if "bounded_lzf" in runs:
        lz = runs["bounded_lzf"]
        out["bounded_lzf"] = lz
        out["memory_peak_ratio_lzf"] = round(lz["used_memory_peak"] / u["used_memory_peak"], 3)
        out["memory_above_start_ratio_lzf"] = round(
            lz["used_memory_peak_above_start"] / u["used_memory_peak_above_start"], 3)
        print(f"  with list-compress-depth 1: {out['memory_peak_ratio_lzf']} (above the start: "
              f"{out['memory_above_start_ratio_lzf']})", flush=True)
    return out


# -- b: one million URLs into a capped frontier ------------------------------------------------

def part_b(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = root / "push"
    run_dir.mkdir()
    www = root / "www-b"
    n_pages = 1000
    generate_site(www, n_pages, 1, seed=2)
    with h.Redis(run_dir) as redis, h.Site(www, run_dir / "site.log") as site:
        env = h.worker_env(run_dir)
        url_file = run_dir / "urls.txt"
        base = site.url + "site/p/"
        with open(url_file, "w") as fh:
            for i in range(args.push_lines):
                fh.write(f"{base}{i % n_pages}.html?n={i}\n")
        print(f"b. {args.push_lines} URL lines ({url_file.stat().st_size / 1e6:.1f} MB) pushed "
              f"into a frontier capped at {args.push_cap}, {args.drain_workers} workers "
              f"draining, {args.push_seconds} s", flush=True)
        outs = [run_dir / f"drain-{n}.jsonl" for n in range(args.drain_workers)]
        logs = [run_dir / f"drain-{n}.log" for n in range(args.drain_workers)]
        workers = [h.scrapy(["runspider", str(h.BENCH_DIR / "drain_spider.py"),
                             *h.setting_args({
                                 "FLEET_REDIS_URL": redis.url, "FLEET_CRAWL_ID": "urls1m",
                                 "FLEET_QUEUE_MAX": args.push_cap,
                                 "FLEET_JSONL_PATH": outs[n], "LOG_LEVEL": "INFO"})],
                            env, logs[n]) for n in range(args.drain_workers)]
        for n, w in enumerate(workers):
            h.wait_for_text(logs[n], "joined crawl", 60, w)
        helper_log = run_dir / "helper.log"
        with open(helper_log, "wb") as hl:
            helper = subprocess.Popen(
                [str(SCRAPY_FLEET), "--redis", redis.url, "--queue-max", str(args.push_cap),
                 "push", "urls1m", "-f", str(url_file)],
                cwd=run_dir, env=env, stdout=hl, stderr=subprocess.STDOUT,
                start_new_session=True)
        sampler = Sampler(redis, "urls1m", 0.5, pid=helper.pid, counters=True)
        t0 = time.time()
        sampler.start()
        helper_done = False
        try:
            helper.wait(args.push_seconds)
            helper_done = True
        except subprocess.TimeoutExpired:
            pass
        t_stop = time.time()
        if not helper_done:
            os.kill(helper.pid, signal.SIGINT)
        if not _waited(helper, 30):
            h.stop(helper)
        helper_code = helper.returncode
        for w in workers:
            if w.poll() is None:
                os.kill(w.pid, signal.SIGINT)  # once: graceful, releases leases
        worker_graceful = [_waited(w, 60) for w in workers]
        for w in workers:
            h.stop(w)
        worker_codes = [w.returncode for w in workers]
        time.sleep(0.6)
        sampler.finish()
        admin = FrontierAdmin(redis.url, "urls1m")
        status = admin.status()
        admin.close()
        mem = redis_memory(redis)
        helper_out = helper_log.read_text(errors="replace")
    items = read_items(outs)
    c = status["counters"]
    samples = sampler.samples
    during = [s for s in samples if s[0] <= t_stop]
    rss = [s[3] for s in during if s[3] is not None]
    sizes = [s[1] for s in samples]
    pushed, acked = c.get("pushed", 0), c.get("acked", 0)
    dead = status["dead"]
    conserved = pushed == acked + status["size"] + dead
    # pushed/s and acked/s over the timed window, from the sampled counters
    first, last = during[0], during[-1]
    dt = last[0] - first[0]
    push_rate = (last[4].get("pushed", 0) - first[4].get("pushed", 0)) / dt if dt else 0.0
    ack_rate = (last[4].get("acked", 0) - first[4].get("acked", 0)) / dt if dt else 0.0
    # steady state: after the frontier first reached the low watermark
    low = int(args.push_cap * 0.9)
    steady = [s for s in during if s[0] >= next((x[0] for x in during if x[1] >= low),
                                                 during[-1][0])]
    sdt = steady[-1][0] - steady[0][0] if len(steady) > 1 else 0.0
    steady_push = ((steady[-1][4].get("pushed", 0) - steady[0][4].get("pushed", 0)) / sdt
                   if sdt else 0.0)
    fig = {
        "lines": args.push_lines, "cap": args.push_cap, "drain_workers": args.drain_workers,
        "seconds": round(t_stop - t0, 1), "helper_finished": helper_done,
        "helper_exit": helper_code, "worker_exit": worker_codes,
        "workers_stopped_gracefully": worker_graceful,
        "pushed": pushed, "acked": acked, "duplicates": c.get("duplicates", 0),
        "released": c.get("released", 0), "reclaimed": c.get("reclaimed", 0),
        "refused": c.get("refused", 0), "dead": dead,
        "end_size": status["size"], "end_queued": status["queued"],
        "end_leased": status["leased"], "conserved": conserved,
        "items": len(items), "distinct_item_urls": len({i["url"] for i in items}),
        "max_size": max(sizes, default=0), "samples": len(samples),
        "samples_above_cap": sum(1 for s in sizes if s > args.push_cap),
        "rss_kb_first": rss[0] if rss else None, "rss_kb_last": rss[-1] if rss else None,
        "rss_kb_min": min(rss, default=None), "rss_kb_max": max(rss, default=None),
        "rss_kb_after_10s": next((s[3] for s in during if s[0] >= t0 + 10 and s[3]), None),
        # from the first time the frontier was at the low watermark (imports done, waiting)
        "rss_kb_at_cap_min": min((s[3] for s in steady if s[3]), default=None),
        "rss_kb_at_cap_max": max((s[3] for s in steady if s[3]), default=None),
        "pushed_per_s": round(push_rate, 1), "pushed_per_s_at_cap": round(steady_push, 1),
        "fetched_per_s": round(ack_rate, 1),
        "used_memory_peak": mem["used_memory_peak"],
        "used_memory_max_sampled": max((s[2] for s in samples), default=0),
        "helper_output_tail": helper_out[-400:],
    }
    print(f"  pushed {pushed} lines in {fig['seconds']} s: {fig['pushed_per_s']} lines/s "
          f"({fig['pushed_per_s_at_cap']}/s once at the cap); fetched {fig['fetched_per_s']} "
          f"pages/s; max size {fig['max_size']} ({len(samples)} samples, "
          f"{fig['samples_above_cap']} above the cap)", flush=True)
    print(f"  helper VmRSS: first {fig['rss_kb_first']} kB, after 10 s "
          f"{fig['rss_kb_after_10s']} kB, min {fig['rss_kb_min']}, max {fig['rss_kb_max']}, "
          f"last {fig['rss_kb_last']} kB; from the first time at the cap: min "
          f"{fig['rss_kb_at_cap_min']}, max {fig['rss_kb_at_cap_max']} kB", flush=True)
    print(f"  conservation: pushed {pushed} == acked {acked} + size {status['size']} + dead "
          f"{dead}: {conserved}; duplicates {fig['duplicates']}, released "
          f"{fig['released']}, reclaimed {fig['reclaimed']}; items written {len(items)}; "
          f"helper exit {helper_code}, workers exit {worker_codes}", flush=True)
    return fig


# -- c: cost of the cap's bookkeeping (cap not reached) ----------------------------------------

def cost_run(root: Path, www: Path, paths: list[str], cap: int | None, label: str
             ) -> dict[str, Any]:
    run_dir = root / label
    run_dir.mkdir()
    with h.Redis(run_dir) as redis, h.Site(www, run_dir / "site.log") as site:
        env = h.worker_env(run_dir)
        push = h.scrapy_run(["fleet", "push", "docs", site.url + "site/", "-s",
                             f"FLEET_REDIS_URL={redis.url}"], env)
        if push.returncode != 0:
            raise RuntimeError(push.stderr)
        sampler = Sampler(redis, "docs", 0.2)
        sampler.start()
        stats, log = run_dir / "stats.json", run_dir / "w.log"
        proc = h.scrapy(["crawl", "docs", *h.setting_args({
            "FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_QUEUE_MAX": cap,
            "FLEET_JSONL_PATH": run_dir / "out.jsonl", "EXTENSIONS": EXT,
            "BENCH_STATS_PATH": stats})], env, log)
        code = h.wait(proc, 200, log)
        sampler.finish()
        mem = redis_memory(redis)
    data = json.loads(stats.read_text())
    span = data["last_item"] - data["engine_started"]
    return {"code": code, "items": data["items"], "rate": data["items"] / span,
            "max_size": max((s[1] for s in sampler.samples), default=0),
            "parked": data["stats"].get("fleet/backpressure/parked", 0),
            "used_memory_peak": mem["used_memory_peak"]}


def part_c(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    www = root / "www-c"
    paths = generate_site(www, args.cost_pages, args.links, seed=1)
    print(f"c. one worker, {len(paths)} pages x {args.links} links, FLEET_QUEUE_MAX="
          f"{args.cost_cap} (not reached) vs None, {args.rounds} rounds alternating", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"capped": [], "unbounded": []}
    for rnd in range(args.rounds):
        order = ("capped", "unbounded") if rnd % 2 == 0 else ("unbounded", "capped")
        for mode in order:
            cap = args.cost_cap if mode == "capped" else None
            run = cost_run(root, www, paths, cap, f"cost-{mode}-{rnd}")
            runs[mode].append(run)
            print(f"  round {rnd + 1} {mode:9}: {run['items']} items, {run['rate']:.1f} pages/s, "
                  f"max size {run['max_size']}, parked {run['parked']}", flush=True)
    capped = h.median([r["rate"] for r in runs["capped"]])
    unb = h.median([r["rate"] for r in runs["unbounded"]])
    paired = h.median([c["rate"] / u["rate"] for c, u in zip(runs["capped"], runs["unbounded"],
                                                             strict=True)])
    print(f"  median capped {capped:.1f} / unbounded {unb:.1f} pages/s -> ratio "
          f"{capped / unb:.3f} (paired {paired:.3f})", flush=True)
    return {"pages": len(paths), "links": args.links, "cap": args.cost_cap,
            "rounds": args.rounds, "capped_pages_per_s": round(capped, 1),
            "unbounded_pages_per_s": round(unb, 1), "ratio": round(capped / unb, 3),
            "paired_ratio": round(paired, 3),
            "capped_rates": [round(r["rate"], 1) for r in runs["capped"]],
            "unbounded_rates": [round(r["rate"], 1) for r in runs["unbounded"]],
            "items": sorted({r["items"] for r in runs["capped"] + runs["unbounded"]}),
            "max_size": max(r["max_size"] for r in runs["capped"] + runs["unbounded"]),
            "parked": sum(r["parked"] for r in runs["capped"] + runs["unbounded"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="abc", help="which parts to run: a, b, c (default abc)")
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--links", type=int, default=10)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--cap", type=int, default=500)
    parser.add_argument("--no-lzf-run", action="store_true",
                        help="part a: skip the third, bounded run on a Redis with "
                             "list-compress-depth 1")
    parser.add_argument("--crawl-timeout", type=float, default=480,
                        help="a: stop a crawl that has not finished after this many seconds")
    parser.add_argument("--push-lines", type=int, default=1_000_000)
    parser.add_argument("--push-cap", type=int, default=10_000)
    parser.add_argument("--push-seconds", type=float, default=150)
    parser.add_argument("--drain-workers", type=int, default=2)
    parser.add_argument("--cost-pages", type=int, default=2000)
    parser.add_argument("--cost-cap", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started in the background by a shell (SIGINT ignored, inherited by the children):
        # give the push helper back Python's SIGINT handling, or part b cannot stop it with it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    fig: dict[str, Any] = {"bench": "backpressure", **h.machine()}
    with h.workdir() as root:
        if "a" in args.parts:
            fig["crawl"] = part_a(root, args)
        if "b" in args.parts:
            fig["push"] = part_b(root, args)
        if "c" in args.parts:
            fig["cost"] = part_c(root, args)
    print()
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
