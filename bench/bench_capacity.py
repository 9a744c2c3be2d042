"""Capacity of one Redis core as a frontier: synthetic workers, no HTTP.

N synthetic clients make exactly the calls a fleet worker makes, through
``scrapy_fleet.frontier.client.AsyncFrontier`` (so the client of the tree under test runs,
with whatever it does locally): each call acknowledges the requests "fetched" since the last
call with their links (group k = links of the k-th acknowledgement), as many as fit in the
worker's bound of links per call (``pump.PUSH_CHUNK``, 100; an acknowledgement is never split
from its links, the rest go with the next call), says their downloads are over, asks for
leases up to 16 held (``FLEET_PREFETCH``), and every 20th call extends every lease it
holds (the heartbeat).  One client holds at most 16 leases, as a worker of
CONCURRENT_REQUESTS = 16 does; a call that leased nothing is followed by a wait of
FLEET_POLL_INTERVAL (0.5 s), as the worker's pump waits.  Host concurrency cap 8
(CONCURRENT_REQUESTS_PER_DOMAIN), no delay: with 1 host, at most 8 pages are in flight
fleet-wide, whatever the clients.

The crawl is a generated site of the shape of the issue's measurement: page ``i`` links to
one new page (``i + seeds``: the frontier's size stays ~constant), to its host's index and
its host's ``missing.html`` (the same for every page of a host) and to 7 pages already pushed
(pseudo-random among the last 5,000): ~90 % of the links are duplicates.  Pages are spread
over H hosts (``host = i mod H``).  Payloads are ``scrapy_fleet.codec.encode`` of the request
as the scheduler sees it (callback, Referer, depth), URLs ~50 bytes.

The baseline is the same driver with another tree's ``scrapy_fleet`` (``--baseline DIR``,
e.g. a ``git worktree`` of main), and scrapy-redis's per-page command sequence (written from
its documented behaviour, not its code: pop = MULTI ZRANGE 0 0 / ZREMRANGEBYRANK 0 0 EXEC,
one ``SADD`` of the 40-hex fingerprint per link, ``ZADD`` of the pickled request dict per new
link, one round trip each).

Per cell (implementation x clients x hosts), on a fresh ``redis-server``:
* pages/s per Redis core = acknowledged pages / Redis process CPU seconds
  (utime + stime of ``/proc/<pid>/stat``), and the wall-clock pages/s;
* µs of Redis execution time per page: the sum of ``usec`` of ``INFO commandstats`` over the
  commands the clients send (EVALSHA, which includes what the script runs, and any direct
  command; commands run inside scripts are counted again under their own names and left out)
  divided by pages;
* call latency p50 / p99 as the client sees it (includes the driver's own event loop: on a
  loaded machine an upper bound), the server's longest call (``SLOWLOG`` at >= 1 ms, and the
  highest ``LATENCY HISTOGRAM`` bucket of EVALSHA), and ``usec_per_call``.

``--storm``: 10,000 leases (1,000 hosts) expire at once (their expiry set to the past); a
client's calls (no take: only the reclaims) then reclaim them; the calls needed, the longest
call and ``usec_per_call`` are reported.

Usage: ``.venv/bin/python bench/bench_capacity.py --baseline ../frontier-baseline
[--clients 1,4,16,64,256] [--hosts 1,100,10000] [--seconds 8] [--impls new,base,scrapy-redis]
[--storm]``; ``--quick`` is clients 1,16,64 x hosts 1,100 x 4 s.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if "--child" not in sys.argv:  # a child imports the scrapy_fleet of PYTHONPATH, not ours
    import _harness as h

LINKS_NEW, LINKS_NAV, LINKS_BACK = 1, 2, 7
#: a client that got nothing waits this long (FLEET_POLL_INTERVAL's default)
POLL_INTERVAL = 0.5
WINDOW = 5000
PAGE_RE = re.compile(rb"/p/(\d+)\.html")


def url_of(i: int, hosts: int) -> str:
    host = i % hosts
    return f"http://h{host:05d}.example.org/docs/p/{i:08d}.html"


def nav_urls(host: int) -> list[str]:
    return [f"http://h{host:05d}.example.org/docs/", f"http://h{host:05d}.example.org/x.html"]


def redis_cpu(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the child: synthetic clients against one Redis --------------------------------------------


class Site:
    def __init__(self, hosts: int, seeds: int) -> None:
        from scrapy import Request, Spider

        from scrapy_fleet import codec
        from scrapy_fleet.frontier.bloom import bloom_key

        class _S(Spider):
            name = "docs"

            def parse(self, response: Any) -> None:
                pass

        self.spider = _S()
        self.hosts = hosts
        self.seeds = seeds
        self.codec = codec
        self.Request = Request
        self.bloom_key = bloom_key

    def request(self, url: str, parent: str | None) -> Any:
        if parent is None:
            return self.Request(url)
        return self.Request(url, callback=self.spider.parse, headers={"Referer": parent},
                            meta={"depth": 3})

    def fleet_push(self, url: str, parent: str | None) -> tuple[bytes, int, bytes, str]:
        req = self.request(url, parent)
        from scrapy.utils.request import fingerprint

        host = url.split("/")[2]
        return (self.bloom_key(fingerprint(req)), 0, self.codec.encode(req, self.spider), host)

    def links(self, i: int, rng: random.Random) -> list[str]:
        out = [url_of(i + self.seeds, self.hosts)]
        out += nav_urls(i % self.hosts)
        lo = max(0, i - WINDOW)
        out += [url_of(rng.randrange(lo, i) if i > lo else 0, self.hosts)
                for _ in range(LINKS_BACK)]
        return out


async def fleet_client(url: str, n: int, site: Site, stop_at: list[float], stats: dict[str, Any],
                       go: asyncio.Event) -> None:
    from scrapy_fleet.frontier.client import AsyncFrontier
    from scrapy_fleet.keys.crawl import CrawlKeys

    try:
        from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
    except ImportError:  # a tree from before issue 20's names (a baseline)
        from scrapy_fleet.frontier.client import FrontierParams  # type: ignore[no-redef]
        from scrapy_fleet.frontier.client import SyncBatch as CallBatch  # type: ignore[no-redef]
        AsyncFrontier.call = AsyncFrontier.sync  # type: ignore[attr-defined]

    try:  # the worker's bound of links per call (pump.PUSH_CHUNK), in the tree under test
        from scrapy_fleet.frontier.pump import PUSH_CHUNK as push_chunk
    except ImportError:
        push_chunk = 100
    params = FrontierParams(host_concurrency=8, queue_max=1_000_000)  # worker defaults
    fr = AsyncFrontier(url, CrawlKeys("fleet", "cap"), f"w{n}", params)
    rng = random.Random(n)
    held: list[Any] = []  # leased and "fetched": acknowledged by the next calls, in order
    calls = 0
    await go.wait()
    try:
        while time.monotonic() < stop_at[0]:
            batch = CallBatch()
            done = 0
            for e in held:
                m = PAGE_RE.search(e.payload)
                i = int(m.group(1)) if m else 0
                parent = url_of(i, site.hosts)
                links = site.links(i, rng)
                # as the worker's pump: at most push_chunk links per call, an acknowledgement
                # never split from its links (the rest go with the next call)
                if done and len(batch.pushes) + len(links) > push_chunk:
                    break
                done += 1
                batch.acks.append((e.entry_id, e.token))
                batch.downloaded.append((e.entry_id, e.token))
                for link in links:
                    key, prio, payload, host = site.fleet_push(link, parent)
                    batch.pushes.append((key, prio, payload, done, host))
            held = held[done:]
            batch.take = 16 - len(held)  # CONCURRENT_REQUESTS = 16 held at most
            calls += 1
            if calls % 20 == 0:
                batch.extends = [(e.entry_id, e.token) for e in held]
            t0 = time.perf_counter()
            r = await fr.call(batch)
            stats["lat"].append(time.perf_counter() - t0)
            stats["links"] += len(batch.pushes)
            stats["pages"] += r.acked
            stats["calls"] += 1
            held += list(r.leased)
            if not held:
                await asyncio.sleep(POLL_INTERVAL)  # as a worker's pump waits when idle
    finally:
        stats["left_out"] += getattr(getattr(fr, "dupes", None), "hits", 0)
        await fr.close()


async def scrapy_redis_client(url: str, n: int, site: Site, stop_at: list[float],
                              stats: dict[str, Any], go: asyncio.Event) -> None:
    import redis.asyncio

    r = redis.asyncio.Redis.from_url(url)
    rng = random.Random(n)
    await go.wait()
    try:
        while time.monotonic() < stop_at[0]:
            t0 = time.perf_counter()
            async with r.pipeline(transaction=True) as pipe:
                pipe.zrange("sr:requests", 0, 0)
                pipe.zremrangebyrank("sr:requests", 0, 0)
                got, _ = await pipe.execute()
            stats["lat"].append(time.perf_counter() - t0)
            stats["calls"] += 1
            if not got:
                await asyncio.sleep(POLL_INTERVAL)
                continue
            d = pickle.loads(got[0])  # our own bench data, written just above
            m = PAGE_RE.search(d["url"].encode())
            i = int(m.group(1)) if m else 0
            parent = url_of(i, site.hosts)
            for link in site.links(i, rng):
                req = site.request(link, parent)
                fp = hashlib.sha1(req.url.encode()).hexdigest()
                t0 = time.perf_counter()
                added = await r.sadd("sr:dupefilter", fp)
                stats["lat"].append(time.perf_counter() - t0)
                stats["calls"] += 1
                if added:
                    data = pickle.dumps(req.to_dict(spider=site.spider), pickle.HIGHEST_PROTOCOL)
                    t0 = time.perf_counter()
                    await r.execute_command("ZADD", "sr:requests", -req.priority, data)
                    stats["lat"].append(time.perf_counter() - t0)
                    stats["calls"] += 1
            stats["pages"] += 1
    finally:
        await r.aclose()


def seed(impl: str, url: str, site: Site) -> None:
    """Push the seed pages 0 .. seeds-1 (the frontier's standing backlog)."""
    if impl == "scrapy-redis":
        import redis

        r = redis.Redis.from_url(url)
        pipe = r.pipeline(transaction=False)
        for i in range(site.seeds):
            req = site.request(url_of(i, site.hosts), None)
            pipe.sadd("sr:dupefilter", hashlib.sha1(req.url.encode()).hexdigest())
            pipe.execute_command("ZADD", "sr:requests", 0,
                                 pickle.dumps(req.to_dict(spider=site.spider), 5))
        pipe.execute()
        return
    from scrapy_fleet.frontier.admin import FrontierAdmin
    from scrapy_fleet.frontier.protocol import FrontierParams

    admin = FrontierAdmin(url, "cap",
                          params=FrontierParams(host_concurrency=8, queue_max=1_000_000))
    chunk: list[tuple[Any, ...]] = []
    for i in range(site.seeds):
        key, prio, payload, host = site.fleet_push(url_of(i, site.hosts), None)
        chunk.append((key, prio, payload, 0, host))
        if len(chunk) >= 500:
            admin.push(chunk)
            chunk = []
    if chunk:
        admin.push(chunk)
    admin.close()


class Recorder:
    """A frontier.lua Script that also writes each call (time, KEYS, ARGV) to a file, as msgpack
    records: what bench_replay.py replays (``BENCH_CAPTURE=FILE``)."""

    def __init__(self, script: Any, out: Any) -> None:
        self.script, self.out = script, out

    def __call__(self, keys: Any = (), args: Any = (), client: Any = None) -> Any:
        import msgpack

        self.out.write(msgpack.packb([time.time(), [str(k) for k in keys], *args]))
        return self.script(keys=keys, args=args, client=client)


def record_calls(path: str) -> None:
    """Make every frontier.lua script that this process loads a Recorder."""
    from scrapy_fleet import lua

    out = open(path, "ab", buffering=1 << 20)  # (open until the process ends)
    load = lua.load

    def recording_load(client: Any, name: str) -> Any:
        script = load(client, name)
        return Recorder(script, out) if name == "frontier.lua" else script

    lua.load = recording_load  # type: ignore[assignment]
    import atexit

    atexit.register(out.close)


def child(args: argparse.Namespace) -> None:
    import scrapy_fleet

    if os.environ.get("BENCH_CAPTURE"):
        record_calls(os.environ["BENCH_CAPTURE"])
    site = Site(args.hosts, max(args.seeds, args.clients * 32))
    seed(args.impl, args.url, site)
    print(json.dumps({"ready": True, "tree": str(Path(scrapy_fleet.__file__).parent.parent)}),
          flush=True)
    sys.stdin.readline()  # GO

    async def main() -> dict[str, Any]:
        stats: dict[str, Any] = {"lat": [], "pages": 0, "calls": 0, "links": 0,
                                 "left_out": 0}
        go = asyncio.Event()
        stop_at = [0.0]
        fn = scrapy_redis_client if args.impl == "scrapy-redis" else fleet_client
        tasks = [asyncio.ensure_future(fn(args.url, n, site, stop_at, stats, go))
                 for n in range(args.clients)]
        await asyncio.sleep(0)
        t0 = time.monotonic()
        stop_at[0] = t0 + args.seconds
        go.set()
        await asyncio.gather(*tasks)
        stats["wall"] = time.monotonic() - t0
        return stats

    stats = asyncio.run(main())
    lat = sorted(stats.pop("lat"))
    stats["p50_ms"] = lat[len(lat) // 2] * 1000 if lat else 0
    stats["p99_ms"] = lat[int(len(lat) * 0.99)] * 1000 if lat else 0
    print(json.dumps(stats), flush=True)


# -- the parent: one redis-server per cell, Redis-side figures ---------------------------------


#: commands the clients send themselves (commands run inside a script are counted again under
#: their own names by INFO commandstats: left out).  A fleet client sends EVALSHA, and HMGET
#: only to fill the payloads of a replayed reply (none here).
CLIENT_COMMANDS = {"new": {"evalsha", "eval"}, "base": {"evalsha", "eval"},
                   "scrapy-redis": {"multi", "exec", "zrange", "zremrangebyrank", "sadd",
                                    "zadd"}}


def commandstats(r: Any) -> dict[str, dict[str, float]]:
    return {k.removeprefix("cmdstat_"): v for k, v in r.info("commandstats").items()}


def longest_call_us(r: Any) -> dict[str, Any]:
    slow = r.slowlog_get(1024)
    top = max((int(e["duration"]) for e in slow), default=0)
    over2 = sum(1 for e in slow if int(e["duration"]) > 2000)
    hist = r.execute_command("LATENCY", "HISTOGRAM", "evalsha")
    bucket = 0
    if hist:  # redis-py: {b'evalsha': {b'calls': n, b'histogram_usec': {bucket: count}}}
        body = next(iter(hist.values()))
        bucket = max((int(b) for b in body.get(b"histogram_usec", {})), default=0)
    return {"slowlog_max_us": top, "calls_over_2ms": over2, "hist_max_bucket_us": bucket}


def run_cell(impl: str, tree: Path, clients: int, hosts: int, seconds: float,
             root: Path, seeds: int) -> dict[str, Any]:
    with h.Redis(root / f"r-{impl}-{clients}-{hosts}") as server:
        r = server.client()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tree)
        proc = subprocess.Popen(
            [h.PYTHON, str(Path(__file__).resolve()), "--child", "--impl", impl, "--url",
             server.url, "--clients", str(clients), "--hosts", str(hosts), "--seconds",
             str(seconds), "--seeds", str(seeds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=h.BENCH_DIR)
        assert proc.stdin and proc.stdout
        ready = json.loads(proc.stdout.readline())
        r.config_set("slowlog-log-slower-than", 1000)
        r.config_set("slowlog-max-len", 1024)
        r.slowlog_reset()
        r.config_resetstat()
        mem0 = r.info("memory")["used_memory"]
        cpu0 = redis_cpu(server.proc.pid)  # type: ignore[union-attr]
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        cpu = redis_cpu(server.proc.pid) - cpu0  # type: ignore[union-attr]
        proc.wait(30)
        cs = commandstats(r)
        usec = sum(v["usec"] for k, v in cs.items() if k in CLIENT_COMMANDS[impl])
        pages = max(out["pages"], 1)
        cell = {
            "impl": impl, "clients": clients, "hosts": hosts, "pages": out["pages"],
            "calls": out["calls"], "wall_pages_s": round(out["pages"] / out["wall"], 1),
            "redis_cpu_s": round(cpu, 3),
            "pages_per_core_s": round(out["pages"] / cpu, 1) if cpu else None,
            "cpu_us_per_page": round(cpu * 1e6 / pages, 1),
            "exec_us_per_page": round(usec / pages, 1),
            "evalsha_usec_per_call": round(cs.get("evalsha", {}).get("usec_per_call", 0), 1),
            "p50_ms": round(out["p50_ms"], 2), "p99_ms": round(out["p99_ms"], 2),
            "used_memory_delta": r.info("memory")["used_memory"] - mem0,
            "tree": ready["tree"],
            "links_left_out": round(out.get("left_out", 0) / max(out.get("links", 0), 1), 3),
        }
        cell.update(longest_call_us(r))
        r.close()
        return cell


def storm(tree: Path, root: Path, n: int = 10_000) -> dict[str, Any]:
    """n leases expire at once; calls of a normal client then reclaim them."""
    code = r'''
import sys, time, json
try:
    from scrapy_fleet.frontier.admin import FrontierAdmin
    from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
except ImportError:  # a tree from before issue 20's names (a baseline)
    from scrapy_fleet.frontier.client import FrontierAdmin, FrontierParams
    from scrapy_fleet.frontier.client import SyncBatch as CallBatch
    FrontierAdmin.call = FrontierAdmin.sync
url, n = sys.argv[1], int(sys.argv[2])
admin = FrontierAdmin(url, "storm", params=FrontierParams(lease_timeout=600.0))
for s in range(0, n, 500):
    admin.push([(("%012d" % i).encode(), 0, b"x" * 60, 0, "h%d.test" % (i % 1000))
                for i in range(s, min(n, s + 500))])
held = 0
while held < n:
    got = admin.call(CallBatch(take=500), worker="holder").leased
    if not got: break
    held += len(got)
# every lease expires at once: as if the holder had died 600 s ago
admin.client.zadd(admin.keys.leases, {m: 1 for m in admin.client.zrange(admin.keys.leases, 0, -1)})
print(json.dumps({"held": held}), flush=True)
sys.stdin.readline()
normal = FrontierAdmin(url, "storm")
calls, reclaimed = 0, 0
while admin.client.zcount(admin.keys.leases, "-inf", 1) > 0 and calls < 100000:
    r = normal.call(CallBatch(), worker="w1")
    calls += 1
    reclaimed += r.reclaimed + r.dead_lettered
import scrapy_fleet
tree = scrapy_fleet.__file__
print(json.dumps({"calls": calls, "reclaimed": reclaimed, "tree": tree}), flush=True)
'''
    with h.Redis(root / "storm") as server:
        r = server.client()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(tree)
        # (cwd: not a checkout, so that the tree on PYTHONPATH is the one imported)
        proc = subprocess.Popen([h.PYTHON, "-c", code, server.url, str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        assert proc.stdin and proc.stdout
        held = json.loads(proc.stdout.readline())
        r.config_set("slowlog-log-slower-than", 1000)
        r.slowlog_reset()
        r.config_resetstat()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        res = json.loads(proc.stdout.readline())
        proc.wait(60)
        cs = commandstats(r)
        out = {"held": held["held"], **res,
               "evalsha_usec_per_call": round(cs.get("evalsha", {}).get("usec_per_call", 0), 1)}
        out.update(longest_call_us(r))
        r.close()
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="new")
    p.add_argument("--url", default="")
    p.add_argument("--baseline", type=Path, default=None,
                   help="root of another tree (e.g. a worktree of main) for the baseline")
    p.add_argument("--impls", default="new,base,scrapy-redis")
    p.add_argument("--clients", default="1,4,16,64,256")
    p.add_argument("--hosts", default="1,100,10000")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--seeds", type=int, default=2000)
    p.add_argument("--quick", action="store_true", help="clients 1,16,64 x hosts 1,100 x 4 s")
    p.add_argument("--storm", action="store_true", help="only the reclaim storm")
    p.add_argument("--skip-storm", action="store_true", help="no reclaim storm")
    args = p.parse_args()
    if args.child:
        args.clients = int(args.clients)
        args.hosts = int(args.hosts)
        child(args)
        return
    if args.quick:
        args.clients, args.hosts, args.seconds = "1,16,64", "1,100", 4.0
    trees = {"new": h.REPO_ROOT, "scrapy-redis": h.REPO_ROOT}
    if args.baseline:
        trees["base"] = args.baseline.resolve()
    impls = [i for i in args.impls.split(",") if i in trees]
    figures: dict[str, Any] = {"machine": h.machine(), "cells": [], "storm": {}}
    with h.workdir("fleet-capacity-") as root:
        if args.storm or not args.skip_storm:
            for impl in [i for i in impls if i != "scrapy-redis"]:
                s = storm(trees[impl], root)
                figures["storm"][impl] = s
                print(f"storm {impl}: {s}", flush=True)
        if not args.storm:
            for hosts in [int(x) for x in args.hosts.split(",")]:
                for clients in [int(x) for x in args.clients.split(",")]:
                    for impl in impls:
                        cell = run_cell(impl, trees[impl], clients, hosts, args.seconds, root,
                                        args.seeds)
                        figures["cells"].append(cell)
                        print(f"{impl:>12} c={clients:<4} h={hosts:<6} "
                              f"pages={cell['pages']:<7} per-core={cell['pages_per_core_s']}/s "
                              f"wall={cell['wall_pages_s']}/s exec={cell['exec_us_per_page']}µs "
                              f"cpu={cell['cpu_us_per_page']}µs/page "
                              f"p50={cell['p50_ms']}ms p99={cell['p99_ms']}ms "
                              f"max={cell['slowlog_max_us']}µs hist<={cell['hist_max_bucket_us']} "
                              f"cached={cell['links_left_out']}",
                              flush=True)
    h.emit_json(figures)


if __name__ == "__main__":
    main()
