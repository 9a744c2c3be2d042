"""Pages/s of ONE fleet worker vs plain Scrapy (in-memory scheduler) on the same site.

Both sides run the example project's ``docs`` parse code against the same generated site
(``--pages`` x ``--links``, default 2000 x 10) served by ``python -m testsite``:

* plain: ``scrapy runspider bench/plain_docs.py -a start=URL`` with ``ADDONS={}``,
  ``SCHEDULER=scrapy.core.scheduler.Scheduler``, ``DUPEFILTER_CLASS=RFPDupeFilter`` (checked:
  the run must report ``scheduler/enqueued/memory`` and no ``scheduler/enqueued/redis``);
* fleet: ``scrapy fleet push docs URL`` then ``scrapy crawl docs -s FLEET_REDIS_URL=...
  -s FLEET_IDLE_TIMEOUT=1``.

Both write items with the fleet's JsonLinesPipeline (``FLEET_JSONL_PATH``), so the item sink
is the same.  Rounds alternate the order (plain/fleet, fleet/plain, ...); each figure is
the median over the rounds, and the ratio is fleet / plain of the medians.

Rate = items / (time of the last item - engine start), both taken inside the worker by
``benchext.BenchStats``: process start-up and imports are excluded on both sides, and so is
the fleet's idle wait at the end (FLEET_IDLE_TIMEOUT); the fleet's ramp-up (first lease)
is included.  Wall time of the whole process is reported too.

``--baseline DIR`` (another checkout, e.g. ``git worktree add --detach ../base main``) adds a
third side to every round, *base*: the fleet worker with that tree's ``scrapy_fleet`` first on
``PYTHONPATH``; the order rotates over the rounds, and the change is given as fleet / base
(of the medians and paired).  Crawl CPU per page = the worker's CPU seconds between engine
start and the last item (``time.process_time``, benchext) / items; busy = that CPU / the
same span (1.0: the worker's one thread never waited).  The rest of the span is split into
*loop blocked* (the event loop in its selector: nothing to run, waiting for a download, Redis
or a timer) and *run queue* (the main thread runnable but preempted by other processes:
Linux schedstat), both from benchext, as shares of the span.

Round trips: one more fleet run (not timed) with a MONITOR connection on the bench's Redis
counts the commands every client sent (commands run inside Lua scripts are told apart by
MONITOR's ``lua`` tag), divided by pages.  The worker's ``fleet/redis/roundtrips`` stat and
Redis's total executed commands per page (INFO commandstats, script-internal included)
come from the timed runs.

Usage: ``.venv/bin/python bench/bench_throughput.py [--pages 2000] [--links 10]
[--rounds 3] [--no-monitor] [--baseline DIR]``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _harness as h

from testsite import generate_site

EXT = {"benchext.BenchStats": 0}
PIPELINE = {"scrapy_fleet.pipelines.jsonlines.JsonLinesPipeline": 800}


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by the site server and redis-server during one run."""

    def __init__(self, site: h.Site, redis: h.Redis) -> None:
        assert site.proc is not None and redis.proc is not None
        self.pids = {"site": site.proc.pid, "redis": redis.proc.pid}
        self.start = {k: proc_cpu(p) for k, p in self.pids.items()}

    def used(self) -> dict[str, float]:
        return {k: proc_cpu(p) - self.start[k] for k, p in self.pids.items()}


def summarize(run: dict[str, Any], stats_file: Path, wall: float, cpu: float) -> dict[str, Any]:
    data = json.loads(stats_file.read_text())
    items = data["items"]
    run["roundtrips_crawl"] = data.get("roundtrips_at_last_item", 0)
    run["last_item_time"] = data["last_item"]
    span = data["last_item"] - data["engine_started"]
    steady = data["last_item"] - data["first_item"]
    crawl_cpu = data["cpu_at_last_item"] - data["cpu_at_engine_started"]
    run.update(crawl_cpu_ms_per_page=1000 * crawl_cpu / max(items, 1),
               busy=crawl_cpu / span if span > 0 else 0.0,
               blocked=data.get("blocked_at_last_item", 0.0) / span if span > 0 else 0.0,
               runq=(data.get("runq_at_last_item") or 0.0) / span if span > 0 else 0.0)
    run.update(items=items, span=span, rate=items / span,
               steady_rate=(items - 1) / steady if steady > 0 else 0.0,
               wall=wall, cpu=cpu, cpu_ms_per_page=1000 * cpu / max(items, 1),
               stats=data["stats"])
    return run


def run_plain(root: Path, env: dict[str, str], redis: h.Redis, site: h.Site, start: str,
              n: int) -> dict[str, Any]:
    out, stats, log = (root / f"plain-{n}.jsonl", root / f"plain-{n}.json",
                       root / f"plain-{n}.log")
    settings = {
        "ADDONS": {},
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
        "ITEM_PIPELINES": PIPELINE,
        "FLEET_JSONL_PATH": out,
        "EXTENSIONS": EXT,
        "BENCH_STATS_PATH": stats,
    }
    meter = CpuMeter(site, redis)
    cpu0, t0 = child_cpu(), time.monotonic()
    proc = h.scrapy(["runspider", str(h.BENCH_DIR / "plain_docs.py"), "-a", f"start={start}",
                     *h.setting_args(settings)], env, log)
    code = h.wait(proc, 150, log)
    wall, cpu = time.monotonic() - t0, child_cpu() - cpu0
    if code != 0 or not stats.exists():
        raise RuntimeError(f"plain run exited {code}:\n{log.read_text()[-3000:]}")
    run = summarize({"mode": "plain"}, stats, wall, cpu)
    run.update({f"{k}_cpu_ms_per_page": 1000 * v / run["items"]
                for k, v in meter.used().items()})
    st = run["stats"]
    if not st.get("scheduler/enqueued/memory") or "scheduler/enqueued/redis" in st:
        raise RuntimeError("plain run did not use Scrapy's in-memory scheduler: "
                           f"{ {k: v for k, v in st.items() if k.startswith('scheduler')} }")
    return run


class Monitor:
    """Counts commands sent by clients (not by Lua scripts) with Redis MONITOR."""

    IGNORED = {"info", "config", "flushall", "monitor"}

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"MONITOR\r\n")
        self.client_cmds: list[tuple[float, str]] = []  # (Redis time, command)
        self.lua_cmds: list[float] = []
        self._buf = b""
        self._stop = False
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(5)

    def _line(self, line: bytes) -> None:
        if line == b"+OK":
            self._ready.set()
            return
        try:
            head, rest = line.split(b"] ", 1)
            stamp = float(head.split(b" ", 1)[0].lstrip(b"+"))
        except ValueError:
            return
        cmd = rest.split(b'"', 2)[1].decode(errors="replace").lower() if b'"' in rest else "?"
        if head.endswith(b" lua"):
            self.lua_cmds.append(stamp)
        elif cmd not in self.IGNORED:
            self.client_cmds.append((stamp, cmd))

    def counts(self, until: float | None = None) -> collections.Counter[str]:
        return collections.Counter(c for t, c in self.client_cmds if until is None or t <= until)

    def _run(self) -> None:
        while not self._stop:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\r\n")
            for line in lines:
                self._line(line)

    def close(self) -> None:
        time.sleep(0.3)  # let the last lines arrive
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)


def run_fleet(root: Path, env: dict[str, str], redis: h.Redis, site: h.Site, start: str,
              n: int | str, monitor: bool = False,
              extra: dict[str, str] | None = None,
              tree: Path | None = None) -> dict[str, Any]:
    """One fleet run; *tree*: another checkout whose ``scrapy_fleet`` the worker imports."""
    tag = "fleet" if tree is None else "base"
    out, stats, log = (root / f"{tag}-{n}.jsonl", root / f"{tag}-{n}.json",
                       root / f"{tag}-{n}.log")
    if tree is not None:
        env = {**env, "PYTHONPATH": os.pathsep.join([str(tree), env["PYTHONPATH"]])}
    client = redis.client()
    client.flushall()
    # (the crawl's settings that are fixed at its creation, FLEET_PARTITIONS, go with the push)
    push = h.scrapy_run(["fleet", "push", "docs", *start.split(","),
                         "-s", f"FLEET_REDIS_URL={redis.url}",
                         *(a for k, v in (extra or {}).items() for a in ("-s", f"{k}={v}"))],
                        env)
    if push.returncode != 0 or f"pushed {len(start.split(','))}," not in push.stdout:
        raise RuntimeError(f"push failed: {push.stdout}{push.stderr}")
    client.config_resetstat()
    mon = Monitor(redis.port) if monitor else None
    meter = CpuMeter(site, redis)
    settings = {
        "FLEET_REDIS_URL": redis.url,
        "FLEET_IDLE_TIMEOUT": 1,
        "FLEET_JSONL_PATH": out,
        "EXTENSIONS": EXT,
        "BENCH_STATS_PATH": stats,
        **(extra or {}),
    }
    cpu0, t0 = child_cpu(), time.monotonic()
    proc = h.scrapy(["crawl", "docs", *h.setting_args(settings)], env, log)
    code = h.wait(proc, 150, log)
    wall, cpu = time.monotonic() - t0, child_cpu() - cpu0
    used = meter.used()
    if mon:
        mon.close()
    if code != 0 or not stats.exists():
        raise RuntimeError(f"fleet run exited {code}:\n{log.read_text()[-3000:]}")
    run = summarize({"mode": tag}, stats, wall, cpu)
    run.update({f"{k}_cpu_ms_per_page": 1000 * v / run["items"] for k, v in used.items()})
    cmdstats = client.info("commandstats")
    client.close()
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in cmdstats.items()}
    for ignored in ("info", "config|resetstat"):
        calls.pop(ignored, None)
    run["redis_calls"] = calls
    run["evalsha_usec_per_page"] = sum(
        v["usec"] for k, v in cmdstats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    ) / run["items"]
    run["redis_commands_per_page"] = sum(calls.values()) / run["items"]
    run["evalsha_per_page"] = (calls.get("evalsha", 0) + calls.get("eval", 0)) / run["items"]
    run["worker_roundtrips_per_page"] = (
        run["stats"].get("fleet/redis/roundtrips", 0) / run["items"])
    run["crawl_roundtrips_per_page"] = run["roundtrips_crawl"] / run["items"]
    if mon:
        crawl = mon.counts(until=run["last_item_time"])
        total = mon.counts()
        run["client_cmds_crawl"] = dict(crawl)
        run["client_cmds_total"] = dict(total)
        run["client_cmds_per_page"] = sum(crawl.values()) / run["items"]
        run["client_cmds_total_per_page"] = sum(total.values()) / run["items"]
        run["lua_cmds_per_page"] = sum(
            1 for t in mon.lua_cmds if t <= run["last_item_time"]) / run["items"]
    st = run["stats"]
    if not st.get("scheduler/enqueued/redis"):
        raise RuntimeError("fleet run did not use the FleetScheduler")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--links", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-monitor", action="store_true",
                        help="skip the extra MONITOR run that counts client round trips")
    parser.add_argument("--fleet-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra setting for the fleet worker (repeatable), e.g. "
                             "FLEET_HOST_CONCURRENCY=0 to take the fleet-wide host cap away")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="another checkout (e.g. a worktree of main): its fleet worker "
                             "runs in every round too, as 'base'")
    args = parser.parse_args(argv)
    args.fleet_extra = dict(s.split("=", 1) for s in args.fleet_setting)

    with h.workdir() as root:
        paths = generate_site(root / "www", args.pages, args.links, seed=1)
        figures = measure(root, args, paths)
    return report(args, paths, *figures)


def measure(root: Path, args: argparse.Namespace,
            paths: list[str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any] | None]:
    with h.Redis(root) as redis, h.Site(root / "www", root / "site.log") as site:
        start = site.url + "site/"
        env = h.worker_env(root)
        print(f"site: {len(paths)} pages x {args.links} links at {start}; redis {redis.url}")
        modes = ["plain", "fleet"] + (["base"] if args.baseline else [])
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for rnd in range(args.rounds):
            if len(modes) == 2:
                order = modes if rnd % 2 == 0 else modes[::-1]
            else:  # each side first, second and last equally often
                order = modes[rnd % 3:] + modes[:rnd % 3]
                order = order if (rnd // 3) % 2 == 0 else order[::-1]
            for mode in order:
                if mode == "plain":
                    run = run_plain(root, env, redis, site, start, rnd)
                else:
                    run = run_fleet(root, env, redis, site, start, rnd, extra=args.fleet_extra,
                                    tree=args.baseline.resolve() if mode == "base" else None)
                runs[mode].append(run)
                print(f"  round {rnd + 1} {mode:5}: {run['items']} items, "
                      f"{run['rate']:.0f} pages/s (steady {run['steady_rate']:.0f}), "
                      f"crawl {run['span']:.2f} s, wall {run['wall']:.2f} s, "
                      f"worker CPU {run['cpu_ms_per_page']:.2f} ms/page "
                      f"(crawl {run['crawl_cpu_ms_per_page']:.2f}, busy {run['busy']:.2f}, "
                      f"blocked {run['blocked']:.3f}, run queue {run['runq']:.2f})",
                      flush=True)
                if run["items"] != len(paths):
                    print(f"  WARNING: expected {len(paths)} items, got {run['items']}")
        mon_run = None
        if not args.no_monitor:
            mon_run = run_fleet(root, env, redis, site, start, "monitor", monitor=True,
                               extra=args.fleet_extra)
    return runs, mon_run


def report(args: argparse.Namespace, paths: list[str], runs: dict[str, list[dict[str, Any]]],
           mon_run: dict[str, Any] | None) -> int:

    def med(mode: str, key: str) -> float:
        return h.median([r[key] for r in runs[mode]])

    def ratio(key: str) -> float:
        return round(med("fleet", key) / med("plain", key), 3)

    plain_rate, fleet_rate = med("plain", "rate"), med("fleet", "rate")
    fig: dict[str, Any] = {
        "bench": "throughput", **h.machine(), "pages": len(paths), "links": args.links,
        "rounds": args.rounds,
        "fleet_settings": args.fleet_extra,
        "plain_pages_per_s": round(plain_rate, 1),
        "fleet_pages_per_s": round(fleet_rate, 1),
        "ratio": round(fleet_rate / plain_rate, 3),
        # ratio of each round's fleet run to the plain run next to it, then the median
        "paired_ratio": round(h.median([f["rate"] / p["rate"] for p, f in
                                        zip(runs["plain"], runs["fleet"], strict=True)]), 3),
        "plain_steady_pages_per_s": round(med("plain", "steady_rate"), 1),
        "fleet_steady_pages_per_s": round(med("fleet", "steady_rate"), 1),
        "steady_ratio": ratio("steady_rate"),
        "plain_wall_s": round(med("plain", "wall"), 2),
        "fleet_wall_s": round(med("fleet", "wall"), 2),
        "plain_worker_cpu_ms_per_page": round(med("plain", "cpu_ms_per_page"), 3),
        "fleet_worker_cpu_ms_per_page": round(med("fleet", "cpu_ms_per_page"), 3),
        "plain_crawl_cpu_ms_per_page": round(med("plain", "crawl_cpu_ms_per_page"), 3),
        "fleet_crawl_cpu_ms_per_page": round(med("fleet", "crawl_cpu_ms_per_page"), 3),
        "plain_busy": round(med("plain", "busy"), 3),
        "fleet_busy": round(med("fleet", "busy"), 3),
        "plain_blocked": round(med("plain", "blocked"), 4),
        "fleet_blocked": round(med("fleet", "blocked"), 4),
        "plain_runq": round(med("plain", "runq"), 3),
        "fleet_runq": round(med("fleet", "runq"), 3),
        "plain_site_cpu_ms_per_page": round(med("plain", "site_cpu_ms_per_page"), 3),
        "fleet_site_cpu_ms_per_page": round(med("fleet", "site_cpu_ms_per_page"), 3),
        "fleet_redis_cpu_ms_per_page": round(med("fleet", "redis_cpu_ms_per_page"), 3),
        "roundtrips_per_page_crawl": round(med("fleet", "crawl_roundtrips_per_page"), 4),
        "roundtrips_per_page_total": round(med("fleet", "worker_roundtrips_per_page"), 4),
        "redis_evalsha_per_page_total": round(med("fleet", "evalsha_per_page"), 4),
        "redis_commands_per_page_incl_lua": round(med("fleet", "redis_commands_per_page"), 2),
        "redis_script_usec_per_page": round(med("fleet", "evalsha_usec_per_page"), 1),
        "plain_rates": [round(r["rate"], 1) for r in runs["plain"]],
        "fleet_rates": [round(r["rate"], 1) for r in runs["fleet"]],
        "fleet_roundtrips_per_page_total_runs": [
            round(r["worker_roundtrips_per_page"], 3) for r in runs["fleet"]],
    }
    if "base" in runs:
        base_rate = med("base", "rate")
        fig.update({
            "baseline": str(args.baseline),
            "base_pages_per_s": round(base_rate, 1),
            "base_ratio": round(base_rate / plain_rate, 3),
            "base_paired_ratio": round(h.median([b["rate"] / p["rate"] for p, b in
                                                 zip(runs["plain"], runs["base"], strict=True)]),
                                       3),
            "fleet_vs_base": round(fleet_rate / base_rate, 3),
            "fleet_vs_base_paired": round(h.median([f["rate"] / b["rate"] for b, f in
                                                    zip(runs["base"], runs["fleet"],
                                                        strict=True)]), 3),
            "base_crawl_cpu_ms_per_page": round(med("base", "crawl_cpu_ms_per_page"), 3),
            "base_busy": round(med("base", "busy"), 3),
            "base_blocked": round(med("base", "blocked"), 4),
            "base_runq": round(med("base", "runq"), 3),
            "base_rates": [round(r["rate"], 1) for r in runs["base"]],
        })
    if mon_run:
        fig["client_commands_per_page_crawl"] = round(mon_run["client_cmds_per_page"], 4)
        fig["client_commands_per_page_total"] = round(mon_run["client_cmds_total_per_page"], 4)
        fig["client_commands_crawl"] = mon_run["client_cmds_crawl"]
        fig["client_commands_total"] = mon_run["client_cmds_total"]
        fig["lua_commands_per_page"] = round(mon_run["lua_cmds_per_page"], 2)

    p, f = "plain", "fleet"
    print()
    print(f"Throughput of one worker, {len(paths)} pages x {args.links} links, "
          f"{args.rounds} rounds alternating, medians")
    print("  rate = items / (last item - engine start), timed inside the worker: excludes "
          "process start-up and the fleet's idle wait (FLEET_IDLE_TIMEOUT=1)")
    print(f"  plain Scrapy (memory scheduler): {plain_rate:7.1f} pages/s  "
          f"{h.fmt_list(fig['plain_rates'])}")
    print(f"  fleet worker (Redis frontier)  : {fleet_rate:7.1f} pages/s  "
          f"{h.fmt_list(fig['fleet_rates'])}")
    print(f"  ratio fleet/plain              : {fig['ratio']:.3f} of medians, "
          f"{fig['paired_ratio']:.3f} median of paired runs (goal >= 0.95); "
          f"first->last item only: {fig['steady_ratio']:.3f}")
    if "base" in runs:
        print(f"  baseline fleet worker ({args.baseline}): {fig['base_pages_per_s']:7.1f} "
              f"pages/s  {h.fmt_list(fig['base_rates'])}; base/plain {fig['base_ratio']:.3f} "
              f"(paired {fig['base_paired_ratio']:.3f}); this tree / base "
              f"{fig['fleet_vs_base']:.3f} (paired {fig['fleet_vs_base_paired']:.3f})")
        print(f"  crawl CPU per page, base       : {fig['base_crawl_cpu_ms_per_page']:.3f} ms "
              f"(busy {fig['base_busy']:.2f}, loop blocked {100 * fig['base_blocked']:.1f} %, "
              f"run queue {100 * fig['base_runq']:.0f} %)")
    print(f"  crawl CPU per page, worker     : {p} {fig['plain_crawl_cpu_ms_per_page']:.3f} ms, "
          f"{f} {fig['fleet_crawl_cpu_ms_per_page']:.3f} ms (engine start -> last item); busy "
          f"{p} {fig['plain_busy']:.2f}, {f} {fig['fleet_busy']:.2f} (CPU s / crawl s)")
    print(f"  rest of the crawl's time       : loop blocked in its selector (waiting for I/O or "
          f"a timer) {p} {100 * fig['plain_blocked']:.1f} %, {f} {100 * fig['fleet_blocked']:.1f} "
          f"%; main thread waiting for a processor (run queue) {p} {100 * fig['plain_runq']:.0f} "
          f"%, {f} {100 * fig['fleet_runq']:.0f} %")
    print(f"  whole process wall time        : {p} {fig['plain_wall_s']:.2f} s, "
          f"{f} {fig['fleet_wall_s']:.2f} s (fleet: + 1 s idle timeout)")
    print(f"  CPU per page, worker (process) : {p} {fig['plain_worker_cpu_ms_per_page']:.2f} ms, "
          f"{f} {fig['fleet_worker_cpu_ms_per_page']:.2f} ms (incl. start-up; fleet incl. idle "
          "wait)")
    print(f"  CPU per page, site server      : {p} {fig['plain_site_cpu_ms_per_page']:.2f} ms, "
          f"{f} {fig['fleet_site_cpu_ms_per_page']:.2f} ms; redis-server (fleet): "
          f"{fig['fleet_redis_cpu_ms_per_page']:.2f} ms")
    print(f"  frontier calls per page        : {fig['roundtrips_per_page_crawl']:.3f} until the "
          f"last item, {fig['roundtrips_per_page_total']:.3f} until exit "
          f"(fleet/redis/roundtrips; per run {fig['fleet_roundtrips_per_page_total_runs']}); "
          f"EVALSHA seen by Redis: {fig['redis_evalsha_per_page_total']:.3f}")
    print(f"  Redis commands per page incl. those run inside Lua: "
          f"{fig['redis_commands_per_page_incl_lua']:.1f} (Redis time in scripts: "
          f"{fig['redis_script_usec_per_page']:.0f} us/page)")
    if mon_run:
        print(f"  client commands per page (MONITOR run): "
              f"{fig['client_commands_per_page_crawl']:.3f} until the last item "
              f"{json.dumps(fig['client_commands_crawl'], sort_keys=True)}, "
              f"{fig['client_commands_per_page_total']:.3f} until exit "
              f"{json.dumps(fig['client_commands_total'], sort_keys=True)}")
    spun = [r for r in runs["fleet"]
            if r["worker_roundtrips_per_page"] > 2 * r["crawl_roundtrips_per_page"] + 0.05]
    if spun:
        print(f"  NOTE: in {len(spun)} of {len(runs['fleet'])} fleet runs most frontier calls "
              "came after the last item, during the 1 s idle wait: the idle worker polled "
              "Redis in a tight loop (see bench/README.md, 'idle busy-poll')")
    print()
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
