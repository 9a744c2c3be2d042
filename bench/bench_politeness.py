"""Fleet-wide politeness (issue 3): rate accuracy, concurrency cap, head-of-line, robots, 429.

Every figure comes from the test site server's own request log (``t``: the server's
``time.time()`` when a request arrived), never from the workers.  The site is
``python -m testsite serve`` bound to several loopback addresses (127.0.0.2,
127.0.0.3, ... are distinct hosts); workers are real ``scrapy crawl fetch`` processes of the
tests' project (tests/project: the ``fetch`` spider fetches what is pushed and follows
nothing), pushed with ``scrapy fleet push fetch -f FILE``.  One private redis-server,
FLUSHALL before each run.

Parts (``--parts 1,2,3,4,5``, all by default, about 5.5 minutes):

1. **accuracy**: 4 workers, ``FLEET_HOST_RATE=2 FLEET_HOST_BURST=1``, 200 URLs of one host;
   60 s (``--seconds``) from the server's first request, then SIGINT.  Requests in the window
   [first, first + 60 s) (the issue: 120 ± 3) and the most in any sliding 1 s window
   (the issue: <= 3).  Run once per ``--polls`` value (``FLEET_POLL_INTERVAL``, default
   ``0.5,0.1``).  Baseline in the same bench run: the same 4 processes as plain Scrapy
   (``scrapy runspider`` of a spider written to the temporary directory, no add-on, each
   process a quarter of 600 URLs of another host, ``DOWNLOAD_DELAY=0.5
   RANDOMIZE_DOWNLOAD_DELAY=False``), same window: the issue expects about 4x.
   Diagnostics: the gaps between consecutive requests against the interval T = 0.5 s
   (a GCRA with burst 1 forgets a late take: every ms a token waits for a worker is lost,
   ``lost slots = sum(gap - T) / T``), frontier calls per second (EVALSHA, ``INFO
   commandstats``), and the Redis clock against the bench's (``TIME`` vs ``time.time()``).
2. **concurrency**: ``FLEET_HOST_CONCURRENCY=2``, 4 workers, 24 pages the server holds 1 s
   each: the server's ``max_concurrent`` for the host (``GET /_testsite/stats``) and the
   achieved pages/s = pages / (last arrival + 1 s - first arrival).
3. **head-of-line**: 2 workers (``--hol-workers``); 400 URLs of an unlimited host alone,
   and the same 400 after 20 URLs of a host limited to 1 request/s
   (``FLEET_HOST_OVERRIDES={"127.0.0.2": {"rate": 1}}``), pushed first so that they head the
   FIFO; alternating runs (alone, with, with, alone; ``--hol-rounds`` pairs).  Pages/s of the
   unlimited host = (n - 1) / (last - first arrival); SIGINT once its 400 are logged.
4. **robots.txt**: 4 workers, ``ROBOTSTXT_OBEY=True``, a host whose robots.txt says
   ``Disallow: /site/p/1`` and ``Crawl-delay: 1``, 25 URLs (11 disallowed): robots.txt
   requests, disallowed URLs requested, min and median gap between page requests.
5. **429**: a host answering its first page request 429 with ``Retry-After: 5`` (concurrency
   1 on it, so that no second request of that host is in flight when the 429 comes back),
   another host with 150 pages held 0.1 s each (``FLEET_HOST_CONCURRENCY=2``), 4 workers:
   the gap from the 429 to the next request to that host, that host's requests during the
   5 s, and the other host's requests during them.

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_politeness.py [--parts 1,3] [--seconds 60]
[--polls 0.5,0.1]``.  Prints a report, and as its last line one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import _harness as h

from testsite import generate_site

TEST_PROJECT = h.REPO_ROOT / "tests" / "project"
SPIDER = "fetch"
PAGES = 700  # generated pages /site/p/0.html .. /site/p/699.html

PLAIN_SPIDER = '''\
"""Plain Scrapy baseline of bench_politeness.py: fetch the URLs listed in a file."""
import scrapy


class PlainFetchSpider(scrapy.Spider):
    name = "plain_fetch"

    def __init__(self, urls="", **kwargs):
        super().__init__(**kwargs)
        self.urls_file = urls

    async def start(self):
        with open(self.urls_file, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield scrapy.Request(line.strip())

    def parse(self, response):
        yield {"url": response.url, "status": response.status}
'''


# -- processes -----------------------------------------------------------------------------


class MultiSite:
    """The test site server on several loopback addresses (one port), with a behaviour."""

    def __init__(self, www: Path, log: Path, binds: Sequence[str],
                 behaviour: dict[str, Any] | None = None) -> None:
        self.www, self.log, self.binds, self.behaviour = www, log, list(binds), behaviour
        self.proc: subprocess.Popen[str] | None = None
        self.urls: dict[str, str] = {}

    def __enter__(self) -> MultiSite:
        args = [h.PYTHON, "-m", "testsite", "serve", str(self.www), "--port", "0",
                "--log", str(self.log)]
        for addr in self.binds:
            args += ["--bind", addr]
        if self.behaviour is not None:
            config = self.log.with_suffix(".behaviour.json")
            config.write_text(json.dumps(self.behaviour))
            args += ["--config", str(config)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=h.REPO_ROOT)
        assert self.proc.stdout is not None
        for addr in self.binds:
            line = self.proc.stdout.readline().strip()
            if not line.startswith("http://"):
                h.stop(self.proc)
                raise RuntimeError(f"site server did not start: {line!r}")
            self.urls[addr] = line
        return self

    def __exit__(self, *exc: Any) -> None:
        h.stop(self.proc)

    def records(self, addr: str | None = None, since: float = 0.0,
                prefix: str = "") -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if ((addr is None or rec["addr"] == addr) and rec["t"] >= since
                        and rec["path"].startswith(prefix)):
                    out.append(rec)
        return out

    def times(self, addr: str, since: float = 0.0, prefix: str = "/site/p/") -> list[float]:
        return sorted(float(r["t"]) for r in self.records(addr, since, prefix))

    def stats(self) -> dict[str, Any]:
        url = self.urls[self.binds[0]] + "_testsite/stats"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return dict(json.load(resp))

    def page_urls(self, addr: str, pages: Iterable[int]) -> list[str]:
        return [f"{self.urls[addr]}site/p/{i}.html" for i in pages]


def push(urls: Sequence[str], redis_url: str, env: dict[str, str], root: Path) -> None:
    listing = root / "push.txt"
    listing.write_text("\n".join(urls) + "\n")
    done = h.scrapy_run(["fleet", "push", SPIDER, "-f", str(listing), "-s",
                         f"FLEET_REDIS_URL={redis_url}"], env, timeout=60, cwd=TEST_PROJECT)
    if done.returncode != 0:
        raise RuntimeError(f"fleet push failed: {done.stderr[-2000:]}")


def start_fleet(n: int, settings: dict[str, Any], env: dict[str, str], root: Path,
                tag: str) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    logs = [root / f"{tag}-w{i}.log" for i in range(n)]
    procs = [h.scrapy(["crawl", SPIDER, *h.setting_args(settings)], env, logs[i],
                      cwd=TEST_PROJECT) for i in range(n)]
    return procs, logs


def interrupt(procs: Sequence[subprocess.Popen[Any]], timeout: float = 20.0) -> list[int | None]:
    """SIGINT each (Scrapy's graceful shutdown: the fleet worker releases its leases), then
    wait; whatever is left after *timeout* s gets SIGTERM/SIGKILL.  Our own children only."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            h.stop(proc)
    return [proc.returncode for proc in procs]


def wait_all(procs: Sequence[subprocess.Popen[Any]], timeout: float) -> bool:
    """True when every process exited by itself within *timeout* s."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def wait_until(predicate: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


STAT_RE = re.compile(r"'((?:fleet/politeness|robotstxt|retry|downloader/response_status_count)"
                     r"[^']*)': (\d+)")


def log_stats(logs: Iterable[Path]) -> dict[str, int]:
    """Politeness-related counters summed over the workers' final stats dumps."""
    total: dict[str, int] = {}
    for log in logs:
        if log.exists():
            for key, value in STAT_RE.findall(log.read_text(errors="replace")):
                total[key] = total.get(key, 0) + int(value)
    return dict(sorted(total.items()))


def evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def redis_clock_offset(client: Any, samples: int = 5) -> float:
    """Redis TIME minus the bench's time.time() (s), at the midpoint of the call."""
    offsets = []
    for _ in range(samples):
        before = time.time()
        sec, usec = client.time()
        after = time.time()
        offsets.append(sec + usec / 1e6 - (before + after) / 2)
    return h.median(offsets)


# -- statistics ----------------------------------------------------------------------------


def max_in_window(times: Sequence[float], width: float = 1.0) -> int:
    """The most requests in any window [s, s + width) (the maximum is reached at s = a request)."""
    return max((bisect.bisect_left(times, t + width) - i for i, t in enumerate(times)),
               default=0)


def gap_figures(times: Sequence[float], interval: float | None = None) -> dict[str, Any]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        return {}
    out: dict[str, Any] = {"min_gap_s": round(min(gaps), 3),
                           "median_gap_s": round(h.median(gaps), 3),
                           "mean_gap_s": round(statistics.fmean(gaps), 3),
                           "max_gap_s": round(max(gaps), 3)}
    if interval:
        late = [g - interval for g in gaps]
        out["late_ms_median"] = round(1000 * h.median(late), 1)
        out["late_ms_p90"] = round(1000 * sorted(late)[int(0.9 * (len(late) - 1))], 1)
        out["lost_slots"] = round(sum(max(0.0, x) for x in late) / interval, 1)
        out["gaps_under_T_minus_20ms"] = sum(1 for g in gaps if g < interval - 0.02)
    return out


def window_figures(times: Sequence[float], seconds: float,
                   interval: float | None = None) -> dict[str, Any]:
    if not times:
        return {"count": 0}
    t0 = times[0]
    inside = [t for t in times if t < t0 + seconds]
    out = {"count": len(inside), "max_in_1s": max_in_window(inside)}
    out.update(gap_figures(inside, interval))
    return out


# -- part 1: accuracy -----------------------------------------------------------------------


class LeaseTrace(threading.Thread):
    """``--trace``: sample the crawl's leases every 3 ms (``ZRANGE leases`` with scores and
    ``HGETALL lease``), so that each lease's Redis time (expiry - FLEET_LEASE_TIMEOUT) and
    worker are known.  The k-th lease of the rate-limited host is the k-th request the server
    logs, which splits each request's lateness into "token free -> leased" (nobody asked for
    work yet) and "leased -> at the server" (the worker's own path to the socket)."""

    def __init__(self, redis: h.Redis, crawl: str = SPIDER, lease_timeout: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.client = redis.client()
        self.leases_key, self.lease_key = f"fleet:{{{crawl}}}:leases", f"fleet:{{{crawl}}}:lease"
        self.lease_ms = lease_timeout * 1000
        self.seen: dict[bytes, tuple[float, str]] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            pipe = self.client.pipeline(transaction=False)
            pipe.zrange(self.leases_key, 0, -1, withscores=True)
            pipe.hgetall(self.lease_key)
            zr, owners = pipe.execute()
            for entry, score in zr:
                if entry not in self.seen:
                    owner = owners.get(entry, b"").decode().rsplit("|", 1)[-1]
                    self.seen[entry] = ((score - self.lease_ms) / 1000, owner)
            time.sleep(0.003)

    def stop(self) -> list[tuple[float, str]]:
        self.halt.set()
        self.join(5)
        self.client.close()
        return sorted(self.seen.values())


def trace_figures(leases: list[tuple[float, str]], times: Sequence[float], seconds: float,
                  interval: float) -> dict[str, Any]:
    t0 = times[0] if times else 0.0
    inside = [t for t in times if t < t0 + seconds]
    k = min(len(leases), len(inside))
    if k < 3:
        return {"leases_traced": len(leases)}
    lease_t = [x[0] for x in leases[:k]]
    owners = [x[1] for x in leases[:k]]
    to_lease = [b - a - interval for a, b in itertools.pairwise(lease_t)]
    to_server = [s - lt for s, lt in zip(inside[:k], lease_t, strict=True)]
    same = sum(1 for a, b in itertools.pairwise(owners) if a == b)
    return {"leases_traced": len(leases),
            "token_free_to_lease_ms": {
                "median": round(1000 * h.median(to_lease), 1),
                "mean": round(1000 * statistics.fmean(to_lease), 1),
                "p90": round(1000 * sorted(to_lease)[int(0.9 * (k - 2))], 1)},
            "lease_to_server_ms": {"median": round(1000 * h.median(to_server), 1),
                                   "mean": round(1000 * statistics.fmean(to_server), 1),
                                   "max": round(1000 * max(to_server), 1)},
            "same_worker_as_previous": f"{same}/{k - 1}",
            "leases_per_worker": {w: owners.count(w) for w in sorted(set(owners))}}


def timed_run(site: MultiSite, addr: str, procs: Sequence[subprocess.Popen[Any]],
              seconds: float, since: float, logs: Sequence[Path]) -> float:
    """Wait for the host's first request, let *seconds* pass from it (server clock), SIGINT."""
    first = wait_until(lambda: site.times(addr, since)[:1], 90.0)
    if not first:
        interrupt(procs)
        tail = logs[0].read_text(errors="replace")[-3000:] if logs[0].exists() else ""
        raise RuntimeError(f"no request to {addr} within 90 s\n{tail}")
    t0 = first[0]
    time.sleep(max(0.0, t0 + seconds + 0.5 - time.time()))
    interrupt(procs)
    return t0


def plain_run(site: MultiSite, addr: str, seconds: float, env: dict[str, str],
              root: Path) -> dict[str, Any]:
    """Plain Scrapy, per-process DOWNLOAD_DELAY=0.5: 4 processes, a quarter of 600 URLs each,
    no fleet (``scrapy runspider`` in a directory without scrapy.cfg: no project, no add-on)."""
    spider_file = root / "plain_fetch.py"
    spider_file.write_text(PLAIN_SPIDER)
    urls = site.page_urls(addr, range(600))
    procs, logs = [], []
    since = time.time()
    for i in range(4):
        listing = root / f"plain-urls-{i}.txt"
        listing.write_text("\n".join(urls[i::4]) + "\n")
        logs.append(root / f"plain-w{i}.log")
        procs.append(h.scrapy(
            ["runspider", str(spider_file), "-a", f"urls={listing}", *h.setting_args({
                "ADDONS": {}, "DOWNLOAD_DELAY": 0.5, "RANDOMIZE_DOWNLOAD_DELAY": False,
                "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO"})],
            env, logs[i], cwd=root))
    timed_run(site, addr, procs, seconds, since, logs)
    plain_logs = " ".join(x.read_text(errors="replace") for x in logs)
    fleet_free = "Fleet worker" not in plain_logs and "scheduler/enqueued/redis" not in \
        plain_logs and "scheduler/enqueued/memory" in plain_logs
    plain = window_figures(site.times(addr, since), seconds, 0.5)
    plain["fleet_free"] = fleet_free
    print(f"   plain Scrapy x4 (DOWNLOAD_DELAY=0.5 each): {plain['count']} requests, "
          f"max {plain['max_in_1s']} in 1 s, median gap {plain.get('median_gap_s')} s "
          f"(memory scheduler, no fleet: {fleet_free})")
    return plain



def part_accuracy(args: argparse.Namespace, redis: h.Redis, env: dict[str, str],
                  root: Path, www: Path) -> dict[str, Any]:
    seconds = args.seconds
    polls = [float(x) for x in args.polls.split(",") if x.strip()]
    fleet_addrs = [f"127.0.0.{10 + i}" for i in range(len(polls))]
    plain_addr = "127.0.0.3"
    client = redis.client()
    result: dict[str, Any] = {"seconds": seconds, "expected": round(seconds * 2),
                              "redis_clock_offset_ms": round(1000 * redis_clock_offset(client), 2)}
    print(f"\n== 1. accuracy: 4 workers, FLEET_HOST_RATE=2, FLEET_HOST_BURST=1, {seconds:.0f} s "
          f"(expected {seconds * 2:.0f} +- 3, <= 3 per 1 s window)")
    print(f"   Redis TIME - bench time.time(): {result['redis_clock_offset_ms']} ms "
          "(site server and Redis share the machine's clock)")
    with MultiSite(www, root / "site-accuracy.jsonl", [plain_addr, *fleet_addrs]) as site:
        plain: dict[str, Any] = {}
        if not args.skip_plain:
            plain = result["plain"] = plain_run(site, plain_addr, seconds, env, root)

        for poll, addr in zip(polls, fleet_addrs, strict=True):
            client.flushall()
            client.config_resetstat()
            push(site.page_urls(addr, range(200)), redis.url, env, root)
            settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_RATE": 2,
                        "FLEET_HOST_BURST": 1, "FLEET_IDLE_TIMEOUT": 30,
                        "FLEET_POLL_INTERVAL": poll, "LOG_LEVEL": "INFO"}
            since = time.time()
            tracer = LeaseTrace(redis) if args.trace else None
            if tracer:
                tracer.start()
            procs, logs = start_fleet(4, settings, env, root, f"acc-poll{poll}")
            e0 = [0.0, 0]

            def first_seen(addr: str = addr, since: float = since,
                           e0: list[float] = e0) -> list[float]:
                got = site.times(addr, since)[:1]
                if got and not e0[1]:
                    e0[:] = [time.time(), evalsha_calls(client)]
                return got

            wait_until(first_seen, 90.0)
            t0 = timed_run(site, addr, procs, seconds, since, logs)
            calls = (evalsha_calls(client) - e0[1]) / max(1e-3, time.time() - e0[0])
            fig = window_figures(site.times(addr, since), seconds, 0.5)
            fig["evalsha_per_s"] = round(calls, 1)
            fig["poll_interval"] = poll
            fig["stats"] = log_stats(logs)
            fig["first_request_after_start_s"] = round(t0 - since, 2)
            if tracer:
                fig["trace"] = trace_figures(tracer.stop(), site.times(addr, since), seconds,
                                             0.5)
            result[f"fleet_poll{poll}"] = fig
            print(f"   fleet x4, FLEET_POLL_INTERVAL={poll}: {fig['count']} requests "
                  f"(expected {seconds * 2:.0f}), max {fig['max_in_1s']} in 1 s; gaps min "
                  f"{fig.get('min_gap_s')} median {fig.get('median_gap_s')} mean "
                  f"{fig.get('mean_gap_s')} max {fig.get('max_gap_s')} s; lateness vs 0.5 s: "
                  f"median {fig.get('late_ms_median')} ms, p90 {fig.get('late_ms_p90')} ms, "
                  f"{fig.get('lost_slots')} slots lost; {fig['evalsha_per_s']} frontier calls/s")
            if "trace" in fig:
                print(f"     trace: {json.dumps(fig['trace'])}")
        main_fleet = result.get(f"fleet_poll{polls[0]}") if polls else None
        if plain and main_fleet and main_fleet["count"]:
            result["plain_over_fleet"] = round(plain["count"] / main_fleet["count"], 2)
            print(f"   plain / fleet: {result['plain_over_fleet']}x")
    client.close()
    return result


# -- part 2: concurrency ---------------------------------------------------------------------


def part_concurrency(args: argparse.Namespace, redis: h.Redis, env: dict[str, str],
                     root: Path, www: Path) -> dict[str, Any]:
    addr = "127.0.0.2"
    n = 24
    print("\n== 2. concurrency: FLEET_HOST_CONCURRENCY=2, 4 workers, pages held 1 s by the server")
    behaviour = {"delays": [{"prefix": "/site/p/", "seconds": 1.0}]}
    client = redis.client()
    client.flushall()
    with MultiSite(www, root / "site-conc.jsonl", [addr], behaviour) as site:
        push(site.page_urls(addr, range(n)), redis.url, env, root)
        procs, _ = start_fleet(4, {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_CONCURRENCY": 2,
                                      "FLEET_IDLE_TIMEOUT": 2}, env, root, "conc")
        wait_until(lambda: len(site.times(addr)) >= n, 90.0)
        if not wait_all(procs, 20.0):
            interrupt(procs)
        times = site.times(addr)
        recs = site.records(addr, prefix="/site/p/")
        stats = site.stats()
    fig = {"pages": len(times), "max_concurrent": stats["max_concurrent"].get(addr),
           "max_concurrent_logged": max((r["concurrent"] for r in recs), default=0),
           "pages_per_s": round(len(times) / (times[-1] + 1.0 - times[0]), 2) if times else 0}
    client.close()
    print(f"   {fig['pages']} pages, server max_concurrent {fig['max_concurrent']} (limit 2), "
          f"{fig['pages_per_s']} pages/s (ideal 2.0)")
    return fig


# -- part 3: head-of-line --------------------------------------------------------------------


def part_head_of_line(args: argparse.Namespace, redis: h.Redis, env: dict[str, str],
                      root: Path, www: Path) -> dict[str, Any]:
    slow, fast = "127.0.0.2", "127.0.0.3"
    n_fast, n_slow = 400, 20
    workers = args.hol_workers
    print(f"\n== 3. head-of-line: {workers} workers, {n_fast} URLs of an unlimited host, alone "
          f"or after {n_slow} URLs of a host limited to 1 request/s")
    client = redis.client()
    rates: dict[str, list[float]] = {"alone": [], "with_slow": []}
    slow_during: list[int] = []
    slow_gaps: list[float] = []
    order = ["alone", "with_slow", "with_slow", "alone"] * args.hol_rounds
    order = order[:2 * args.hol_rounds]  # pairs: (alone, with), (with, alone), ...
    with MultiSite(www, root / "site-hol.jsonl", [slow, fast]) as site:
        for i, mode in enumerate(order):
            client.flushall()
            urls = site.page_urls(slow, range(n_slow)) if mode == "with_slow" else []
            urls += site.page_urls(fast, range(n_fast))
            push(urls, redis.url, env, root)
            settings = {"FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 2,
                        "FLEET_HOST_OVERRIDES": {slow: {"rate": 1}}}
            since = time.time()
            procs, _ = start_fleet(workers, settings, env, root, f"hol{i}-{mode}")
            done = wait_until(lambda s=since: len(site.times(fast, s)) >= n_fast, 120.0, 0.1)
            interrupt(procs)
            times = site.times(fast, since)
            if not done or len(times) < 2:
                raise RuntimeError(f"head-of-line run {mode}: {len(times)} of {n_fast} fetched")
            rate = (len(times) - 1) / (times[-1] - times[0])
            rates[mode].append(rate)
            extra = ""
            if mode == "with_slow":
                st = site.times(slow, since)
                inside = [t for t in st if times[0] <= t <= times[-1]]
                slow_during.append(len(inside))
                slow_gaps += [b - a for a, b in itertools.pairwise(st)]
                extra = (f"; slow host: {len(inside)} requests meanwhile, "
                         f"{len(st)} before SIGINT")
            print(f"   run {i + 1} {mode:9}: {rate:6.1f} pages/s over {times[-1] - times[0]:.2f} s"
                  + extra)
    client.close()
    alone, with_slow = h.median(rates["alone"]), h.median(rates["with_slow"])
    fig = {"workers": workers, "alone_pages_per_s": [round(x, 1) for x in rates["alone"]],
           "with_slow_pages_per_s": [round(x, 1) for x in rates["with_slow"]],
           "alone_median": round(alone, 1), "with_slow_median": round(with_slow, 1),
           "ratio": round(with_slow / alone, 3), "slow_requests_during": slow_during,
           "slow_min_gap_s": round(min(slow_gaps), 3) if slow_gaps else None}
    print(f"   median alone {fig['alone_median']} / with slow host {fig['with_slow_median']} "
          f"pages/s -> ratio {fig['ratio']} (goal >= 0.8); slow host min gap "
          f"{fig['slow_min_gap_s']} s")
    return fig


# -- part 4: robots.txt ----------------------------------------------------------------------


def part_robots(args: argparse.Namespace, redis: h.Redis, env: dict[str, str],
                root: Path, www: Path) -> dict[str, Any]:
    addr = "127.0.0.2"
    robots = "User-agent: *\nDisallow: /site/p/1\nCrawl-delay: 1\n"
    n = 25
    disallowed = {f"/site/p/{i}.html" for i in range(n) if str(i).startswith("1")}
    print(f"\n== 4. robots.txt: 4 workers, ROBOTSTXT_OBEY=True, {robots!r}, {n} URLs "
          f"({len(disallowed)} disallowed)")
    client = redis.client()
    client.flushall()
    with MultiSite(www, root / "site-robots.jsonl", [addr], {"robots": {addr: robots}}) as site:
        push(site.page_urls(addr, range(n)), redis.url, env, root)
        procs, logs = start_fleet(4, {"FLEET_REDIS_URL": redis.url, "ROBOTSTXT_OBEY": True,
                                      "FLEET_IDLE_TIMEOUT": 3}, env, root, "robots")
        wait_until(lambda: len(site.times(addr)) >= n - len(disallowed), 90.0, 0.1)
        if not wait_all(procs, 20.0):
            interrupt(procs)
        recs = site.records(addr)
    paths = [r["path"] for r in recs]
    pages = sorted(r["t"] for r in recs if r["path"].startswith("/site/p/"))
    robots_t = [r["t"] for r in recs if r["path"] == "/robots.txt"]
    gaps = [b - a for a, b in itertools.pairwise(pages)]
    fig = {"robots_requests": paths.count("/robots.txt"),
           "max_gap_s": round(max(gaps), 3) if gaps else None,
           "gaps_over_1_5s": sum(1 for g in gaps if g > 1.5),
           "disallowed_requested": sum(1 for p in paths if p in disallowed),
           "pages_requested": len(pages), "pages_allowed": n - len(disallowed),
           "min_gap_s": round(min(gaps), 3) if gaps else None,
           "median_gap_s": round(h.median(gaps), 3) if gaps else None,
           "robots_to_first_page_s": round(pages[0] - robots_t[0], 3)
           if pages and robots_t else None,
           "stats": log_stats(logs)}
    client.close()
    print(f"   robots.txt requests {fig['robots_requests']} (expect 1), disallowed requested "
          f"{fig['disallowed_requested']} (expect 0), pages {fig['pages_requested']}/"
          f"{fig['pages_allowed']}, gaps min {fig['min_gap_s']} median {fig['median_gap_s']} s "
          f"max {fig['max_gap_s']} s ({fig['gaps_over_1_5s']} over 1.5 s) (Crawl-delay 1), "
          f"robots.txt -> first page {fig['robots_to_first_page_s']} s")
    return fig


# -- part 5: 429 with Retry-After --------------------------------------------------------------


def part_retry_after(args: argparse.Namespace, redis: h.Redis, env: dict[str, str],
                     root: Path, www: Path) -> dict[str, Any]:
    busy, other = "127.0.0.2", "127.0.0.3"
    print("\n== 5. 429 with Retry-After: 5 on one host (its first page request), 4 workers, "
          "another host crawled meanwhile")
    behaviour = {"failures": [{"prefix": "/site/p/", "status": 429, "retry_after": 5,
                               "first": 1, "host": busy}],
                 "delays": [{"prefix": "/site/p/", "seconds": 0.1, "host": other}]}
    client = redis.client()
    client.flushall()
    with MultiSite(www, root / "site-429.jsonl", [busy, other], behaviour) as site:
        push(site.page_urls(busy, range(10)) + site.page_urls(other, range(150)), redis.url,
             env, root)
        settings = {"FLEET_REDIS_URL": redis.url, "FLEET_HOST_CONCURRENCY": 2, "RETRY_TIMES": 3,
                    "FLEET_HOST_OVERRIDES": {busy: {"concurrency": 1}}, "FLEET_IDLE_TIMEOUT": 2}
        procs, logs = start_fleet(4, settings, env, root, "r429")
        wait_until(lambda: len([r for r in site.records(busy, prefix="/site/p/")
                                if r["status"] == 200]) >= 10
                   and len(site.times(other)) >= 150, 90.0, 0.1)
        if not wait_all(procs, 20.0):
            interrupt(procs)
        busy_recs = sorted((r["t"], r["status"]) for r in site.records(busy, prefix="/site/p/"))
        other_t = site.times(other)
    t429 = next((t for t, s in busy_recs if s == 429), None)
    after = [t for t, _ in busy_recs if t429 is not None and t > t429]
    fig: dict[str, Any] = {"got_429": t429 is not None}
    if t429 is not None:
        fig.update({
            "gap_429_to_next_s": round(after[0] - t429, 3) if after else None,
            "busy_requests_within_5s": sum(1 for t in after if t < t429 + 5),
            "busy_requests_before_429": sum(1 for t, _ in busy_recs if t < t429),
            "other_requests_within_5s": sum(1 for t in other_t if t429 < t < t429 + 5),
            "other_first_last_s": [round(other_t[0] - t429, 2), round(other_t[-1] - t429, 2)]
            if other_t else None,
            "busy_200": sum(1 for _, s in busy_recs if s == 200),
            "stats": log_stats(logs)})
    client.close()
    print(f"   429 -> next request to that host: {fig.get('gap_429_to_next_s')} s (expect >= 5), "
          f"its requests within the 5 s: {fig.get('busy_requests_within_5s')}, other host's: "
          f"{fig.get('other_requests_within_5s')} (> 0; other host from/to "
          f"{fig.get('other_first_last_s')} s after the 429), busy host 200s "
          f"{fig.get('busy_200')}/10")
    return fig


PARTS = {1: ("accuracy", part_accuracy), 2: ("concurrency", part_concurrency),
         3: ("head_of_line", part_head_of_line), 4: ("robots", part_robots),
         5: ("retry_after", part_retry_after)}


def tree_fingerprint() -> dict[str, Any]:
    """Which code was measured: a hash of scrapy_fleet/ (the tree may be uncommitted) and the
    time of its newest file."""
    import hashlib

    digest, newest = hashlib.sha256(), 0.0
    for path in sorted((h.REPO_ROOT / "scrapy_fleet").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".lua"):
            digest.update(path.relative_to(h.REPO_ROOT).as_posix().encode())
            digest.update(path.read_bytes())
            newest = max(newest, path.stat().st_mtime)
    return {"tree_sha256": digest.hexdigest()[:12],
            "tree_newest_file": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="1,2,3,4,5")
    parser.add_argument("--seconds", type=float, default=60.0, help="part 1 window (s)")
    parser.add_argument("--polls", default="0.5,0.1",
                        help="part 1: FLEET_POLL_INTERVAL values, one fleet run each")
    parser.add_argument("--skip-plain", action="store_true", help="part 1: no plain Scrapy run")
    parser.add_argument("--trace", action="store_true",
                        help="part 1: sample the leases every 3 ms (see LeaseTrace)")
    parser.add_argument("--hol-workers", type=int, default=2)
    parser.add_argument("--hol-rounds", type=int, default=2, help="part 3: runs of each mode")
    args = parser.parse_args(argv)
    parts = [int(x) for x in args.parts.split(",") if x.strip()]
    figures: dict[str, Any] = {"bench": "politeness", **h.machine(), **tree_fingerprint()}
    print(f"scrapy_fleet tree {figures['tree_sha256']} (newest file {figures['tree_newest_file']})")
    started = time.monotonic()
    with h.workdir("fleet-bench-polite-") as root, h.Redis(root) as redis:
        www = root / "www"
        generate_site(www, PAGES, 2, seed=4)
        env = h.worker_env(root)
        for part in parts:
            name, func = PARTS[part]
            t = time.monotonic()
            figures[name] = func(args, redis, env, root, www)
            figures[name]["bench_seconds"] = round(time.monotonic() - t, 1)
    figures["total_seconds"] = round(time.monotonic() - started, 1)
    print(f"\ntotal {figures['total_seconds']} s")
    h.emit_json(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
