"""Redis CPU per page of a partitioned crawl (issue 21) against the same crawl with P = 1, on
one N-master Redis Cluster without replicas (all on this machine's loopback).

Synthetic clients make the worker's calls through the tree's own frontier client:
``AsyncFrontier`` for P = 1, ``PartitionedFrontier`` for P > 1 (so the foreign links of a
page go through lua/push_lean.lua before its acknowledgement, exactly as a worker sends
them): each call acknowledges the pages "fetched" since the last one with their links
(bench_capacity's site: ~10 links per page, ~90 % duplicates, H hosts), says their downloads
are over, and asks for leases up to 16 held.  Per cell: pages acknowledged, the Redis CPU
(utime + stime of every master, less its idle rate measured just before: `_raw` keeps it) per
page, the busiest master's share of it, the foreign
(lean) calls per page.  Cells of one run are adjacent, so their ratios are what a loaded
machine lets one compare.

P > 1 cells run once per ``--flush`` value (FLEET_PARTITION_FLUSH, seconds: how long a client
buffers its foreign links per destination; 0: pushed at every call).  ``--rounds R`` runs
the whole row of cells R times, so that each P > 1 cell has a P = 1 cell just before it
(the ratio printed is of those two).

``--split``: after each P = 1 cell, N independent P = 1 crawls, one per master, the clients
shared out among them (the crawl split by hand that P > 1 replaces): its CPU per page over
the one-master P = 1 cell is what spreading the same work over N redis-server processes costs
on this machine, whatever the partitions do.

``--instructions``: every master runs under ``valgrind --tool=callgrind`` and each cell also
reports the instructions (Ir) per page summed over the masters (``callgrind_control --zero``
just before the cell's calls, ``--dump`` just after), less each master's idle Ir per second
(serverCron, the cluster bus: measured over 3 s just before) times the cell's span; the
ratio of a P > 1 cell to its P = 1 cell (``ratio_ir_per_page``) does not depend on the
machine's load.  The servers run ~50x slower: use ``--pages`` (a few thousand) to end each
cell at the same number of pages, and a long ``--seconds``; timeouts are lengthened (client
sockets 120 s, cluster-node-timeout 120 s, leases 600 s).  ``--masters 1``: P = 4 as hash
tags on one redis-server.

Each client keeps the worker's cache of known duplicates (``--dupe-cache``, FLEET_DUPEFILTER_
CACHE's default; this bench ran with 0 before 2026-12-02 14:00); ``--lean-cache off,on`` runs
each P > 1 cell without and with the foreign links' share of it (frontier/lean.py).
``--listpack-entries N``: the servers' ``hash-max-listpack-entries`` (a partition's per-host
hashes are listpacks up to it: bench/README.md).  ``BENCH_KEEP_DUMPS=DIR``: each cell's
callgrind dumps kept in DIR/<cell> for ``callgrind_annotate``.

Usage: .venv/bin/python bench/bench_partitions.py [--masters 2] [--parts 1,4]
       [--hosts 100,10000] [--clients 16] [--seconds 8] [--flush 0.5] [--rounds 1] [--split]
       [--instructions --pages 3000 --seconds 900] [--dupe-cache 100000]
       [--lean-cache off,on] [--listpack-entries 128]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h
import bench_capacity as bc

from scrapy_fleet.commands.partitioned import PartitionedPush
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.dupecache import DUPE_CACHE_SIZE
from scrapy_fleet.frontier.partition_count import check_sync
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from testsite.processes import free_port

HELD = 16
PUSH_CHUNK = 100
PARAMS = FrontierParams(host_concurrency=8, queue_max=1_000_000)


def cluster_port() -> int:
    """A free port <= 55535 whose cluster bus port (port + 10000) is free too (a node on a
    port above cannot start: its bus port would pass 65535)."""
    import socket

    for _ in range(1000):
        port = free_port()
        if port > 55535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class Cluster:
    def __init__(self, root: Path, masters: int, counted: bool = False,
                 config: list[str] | None = None) -> None:
        self.root = root
        self.config = config or []  #: more redis-server arguments (``--name value``)
        self.ports = [cluster_port() for _ in range(masters)]
        self.procs: list[subprocess.Popen[Any]] = []
        #: each master under callgrind (--instructions): ~50x slower, so a long
        #: cluster-node-timeout (no failure detected while a node is busy)
        self.counted = counted
        self.dirs: list[Path] = []

    def __enter__(self) -> Cluster:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        """N masters, each with an equal contiguous slot range (as redis-cli --cluster create
        splits them; done by hand: redis-cli wants 3 masters at least)."""
        import redis

        for port in self.ports:
            d = self.root / f"n{port}"
            d.mkdir(parents=True)
            self.dirs.append(d)
            self.procs.append(subprocess.Popen(
                [*(h.callgrind_argv(d) if self.counted else []),
                 "redis-server", "--port", str(port), "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no",
                 *(["--cluster-node-timeout", "120000"] if self.counted else []),
                 "--dir", str(d), *self.config], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        for port in self.ports:  # until each answers
            for _ in range(1200 if self.counted else 200):
                try:
                    if redis.Redis(port=port).ping():
                        break
                except redis.ConnectionError:
                    time.sleep(0.1)
        n = len(self.ports)
        for i, port in enumerate(self.ports):
            node = redis.Redis(port=port)
            node.execute_command("CLUSTER", "ADDSLOTSRANGE", i * 16384 // n,
                                 (i + 1) * 16384 // n - 1)
            for other in self.ports[:i]:
                node.execute_command("CLUSTER", "MEET", "127.0.0.1", other)
            node.close()
        for _ in range(1200 if self.counted else 200):
            states = [redis.Redis(port=p).cluster("info").get("cluster_state")
                      for p in self.ports]
            if all(s == "ok" for s in states):
                time.sleep(1)
                return
            time.sleep(0.1)
        raise RuntimeError("cluster not ok")

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            h.stop(proc)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def cpu(self) -> list[float]:
        return [bc.redis_cpu(p.pid) for p in self.procs]

    def zero(self) -> None:
        """(counted) Zero every master's instruction counters."""
        for proc in self.procs:
            h.callgrind_zero(proc.pid)

    def count(self, keep: Path | None = None) -> list[int]:
        """(counted) Each master's instructions since its last zero or count (its dump moved
        into *keep* when given)."""
        return [h.callgrind_dump(proc.pid, d, keep)
                for proc, d in zip(self.procs, self.dirs, strict=True)]

    def reset_stats(self) -> None:
        for port in self.ports:
            with redis.Redis(port=port) as c:
                c.config_resetstat()

    def command_stats(self) -> dict[str, tuple[int, float]]:
        """command -> (calls, usec) summed over the masters (INFO commandstats; a script's
        usec includes the commands it ran, which are listed too)."""
        out: dict[str, tuple[int, float]] = {}
        for port in self.ports:
            with redis.Redis(port=port) as c:
                for name, row in c.info("commandstats").items():
                    calls, usec = out.get(name, (0, 0.0))
                    out[name] = (calls + int(row["calls"]), usec + float(row["usec"]))
        return out


async def client(url: str, n: int, parts: int, crawl: str, site: bc.Site,
                 stop_at: list[float], st: dict[str, Any], go: asyncio.Event,
                 flush: float) -> None:
    keys = CrawlKeys("fleet", crawl)
    timeout = st["timeout"]
    cache = st["dupe_cache"]
    fr: Any = (PartitionedFrontier(url, keys, f"w{n}", PARAMS, parts, timeout=timeout,
                                   flush_age=flush, dupe_cache=cache)
               if parts > 1
               else AsyncFrontier(url, keys, f"w{n}", PARAMS, timeout=timeout,
                                  dupe_cache=cache))
    if parts > 1 and not st["lean_cache"]:  # (as before 2026-12-02: foreign links always
        for front in fr.fronts:  # sent, each partition's client with 1/P of the cache)
            front.dupes.size = cache // parts
        for dest in fr.lean_dests:
            dest.dupes.size = 0
    rng = random.Random(n)
    held: list[Any] = []
    st_calls = [0, 0]  #: (P = 1) frontier calls, those with a lease request
    done: list[tuple[Any, list[tuple[Any, ...]]]] = []
    if timeout > 10.0:  # (counted) the cluster client's start (slot map, COMMAND) before
        await fr.client.ping()  # the cell's idle window and count: a worker's, not a page's
    st["ready"] += 1
    await go.wait()

    async def one_call(final: bool) -> Any:
        nonlocal held, done
        for e in held:
            m = bc.PAGE_RE.search(e.payload)
            i = int(m.group(1)) if m else 0
            parent = bc.url_of(i, site.hosts)
            done.append((e, [site.fleet_push(link, parent) for link in site.links(i, rng)]))
        batch = CallBatch(downloaded=[(e.entry_id, e.token) for e in held])
        held = []
        k = 0
        for e, links in done:
            if k and len(batch.pushes) + len(links) > PUSH_CHUNK:
                break
            k += 1
            batch.acks.append((e.entry_id, e.token))
            batch.pushes += [(key, prio, pl, k, host) for key, prio, pl, host in links]
        done = done[k:]
        batch.take = 0 if final else max(0, HELD - len(done))
        r = await fr.call(batch)
        st["links"] += len(batch.pushes)
        st["new"] += r.pushed
        st["dup"] += r.duplicates
        st_calls[0] += 1
        st_calls[1] += batch.take > 0
        st["pages"] += r.acked
        st["calls"] += 1
        return r

    try:
        while time.monotonic() < stop_at[0] and st["pages"] < st["max_pages"]:
            r = await one_call(False)
            held = list(r.leased)
            if not held and not done:
                await asyncio.sleep(bc.POLL_INTERVAL)
        # the pages fetched are acknowledged (with what a P > 1 client holds for its
        # buffers: FLEET_PARTITION_FLUSH), as a worker's close does: their Redis work is in
        # the cell's CPU, so they count (a cell that left them out charged P > 1 with ~0.5 s
        # of pages' leases and links it did not count)
        for _ in range(100):
            if hasattr(fr, "flush_now"):
                fr.flush_now()
            if not (held or done or (parts > 1 and fr.held)):
                break
            await one_call(True)
    finally:
        st["foreign"] += getattr(fr, "foreign_calls", 0)
        st["foreign_links"] += getattr(fr, "lean_links", 0)
        st["foreign_dup"] += getattr(fr, "lean_dupes", 0)
        st["foreign_cached"] += sum(d.dupes.hits for d in getattr(fr, "lean_dests", []))
        if parts > 1:
            counts = fr.partition_counts()
            st["frontier_calls"] += counts["calls"]
            st["lease_calls"] += counts["lease_calls"]
            st["held_parts"] += getattr(fr, "held_parts", 0)
        else:
            st["frontier_calls"] += st_calls[0]
            st["lease_calls"] += st_calls[1]
        await fr.close()


def crawl_on(tag: str, k: int, n: int) -> str:
    """A crawl id from *tag* whose hash tag's slot is in the k-th of *n* equal slot ranges
    (master k of the bench's cluster)."""
    from redis.crc import key_slot

    for salt in range(100_000):
        crawl = f"b{tag}-{salt}"
        if k * 16384 // n <= key_slot(f"{{{crawl}}}".encode()) < (k + 1) * 16384 // n:
            return crawl
    raise RuntimeError("no crawl id for that master")


def cell(cluster: Cluster, parts: int, hosts: int, clients: int, seconds: float,
         tag: str, flush: float = 0.0, split: int = 1, pages: int = 0,
         dupe_cache: int = 0, lean_cache: bool = True) -> dict[str, Any]:
    """One cell; *split* > 1 (P = 1 only): that many independent crawls, one per master,
    the clients shared out among them (the crawl split by hand that P > 1 replaces)."""
    crawls = ([crawl_on(tag, k, split) for k in range(split)] if split > 1 else [f"b{tag}"])
    site = bc.Site(hosts, max(2000, clients * 32))
    rows = []
    for i in range(site.seeds):
        key, prio, payload, host = site.fleet_push(bc.url_of(i, hosts), None)
        rows.append((key, prio, payload, 0, host))
    for crawl in crawls:
        admin = FrontierAdmin(cluster.url, crawl, params=PARAMS,
                              timeout=120.0 if cluster.counted else 10.0)
        if parts > 1:
            check_sync(admin.client, admin.keys, parts)
            pusher: Any = PartitionedPush(admin, parts)
        else:
            pusher = admin
        for k in range(0, len(rows), 500):
            pusher.push(rows[k:k + 500])
        admin.close()
    st: dict[str, Any] = {"pages": 0, "calls": 0, "foreign": 0, "frontier_calls": 0,
                          "links": 0, "new": 0, "dup": 0, "foreign_links": 0,
                          "foreign_dup": 0, "foreign_cached": 0,
                          "lease_calls": 0, "held_parts": 0, "ready": 0,
                          "max_pages": pages or 1 << 62, "dupe_cache": dupe_cache,
                          "lean_cache": lean_cache,
                          "timeout": 120.0 if cluster.counted else 10.0}

    async def main() -> None:
        go = asyncio.Event()
        stop_at = [0.0]
        tasks = [asyncio.ensure_future(client(cluster.url, n, parts, crawls[n % len(crawls)],
                                              site, stop_at, st, go, flush))
                 for n in range(clients)]
        while st["ready"] < clients:
            await asyncio.sleep(0.05)
        # the masters' own CPU when nothing is sent (serverCron, the cluster bus): measured
        # over an idle second and taken off the cell's, so that it does not weigh on a cell
        # by its number of pages
        idle0, t0 = cluster.cpu(), time.monotonic()
        if cluster.counted:  # (and the instructions: over 3 s, a node's cron being ~1/s)
            cluster.zero()
            await asyncio.sleep(3.0)
            st["idle_ir"] = [x / (time.monotonic() - t0) for x in cluster.count()]
        else:
            await asyncio.sleep(1.0)
        idle = [(b - a) / (time.monotonic() - t0)
                for a, b in zip(idle0, cluster.cpu(), strict=True)]
        stop_at[0] = time.monotonic() + seconds
        cluster.reset_stats()
        if cluster.counted:
            cluster.zero()
        cpu0, t1 = cluster.cpu(), time.monotonic()
        go.set()
        await asyncio.gather(*tasks)
        span = time.monotonic() - t1
        if cluster.counted:
            keep = os.environ.get("BENCH_KEEP_DUMPS")  # a folder: each cell's dumps there
            st["ir_raw"] = cluster.count(Path(keep) / tag if keep else None)
            st["ir"] = [max(0.0, c - i * span)
                        for c, i in zip(st["ir_raw"], st["idle_ir"], strict=True)]
            st["span"] = span
        st["cpu_raw"] = [b - a for a, b in zip(cpu0, cluster.cpu(), strict=True)]
        st["cpu"] = [max(0.0, c - i * span) for c, i in zip(st["cpu_raw"], idle, strict=True)]
        st["commands"] = cluster.command_stats()

    asyncio.run(main())
    pages = max(st["pages"], 1)
    cpu = st["cpu"]
    counted: dict[str, Any] = {}
    if cluster.counted:
        ir = st["ir"]
        counted = {"ir_per_page": round(sum(ir) / pages),
                   "ir_per_page_raw": round(sum(st["ir_raw"]) / pages),
                   "ir_busiest_share": round(max(ir) / sum(ir), 3) if sum(ir) else None,
                   "idle_ir_per_s": [round(x) for x in st["idle_ir"]],
                   "span_s": round(st["span"], 1)}
    return {"parts": parts, **counted, "flush": flush if parts > 1 else None, "hosts": hosts,
            "dupe_cache": dupe_cache, "lean_cache": lean_cache if parts > 1 else None,
            "split": split,
            "clients": clients, "pages": st["pages"],
            "cpu_us_per_page": round(sum(cpu) * 1e6 / pages, 1),
            "cpu_us_per_page_raw": round(sum(st["cpu_raw"]) * 1e6 / pages, 1),
            "busiest_share": round(max(cpu) / sum(cpu), 3) if sum(cpu) else None,
            "foreign_calls_per_page": round(st["foreign"] / pages, 3),
            # per page: links the pump gave the client, those Redis found new and duplicate
            # (a link a client's cache left out counts as a duplicate), and of them the
            # foreign links sent in lean calls and the duplicates among those (P > 1)
            "links_per_page": round(st["links"] / pages, 2),
            "new_per_page": round(st["new"] / pages, 2),
            "dup_per_page": round(st["dup"] / pages, 2),
            "lean_links_per_page": round(st["foreign_links"] / pages, 2),
            "lean_dup_per_page": round(st["foreign_dup"] / pages, 2),
            "lean_cached_per_page": round(st["foreign_cached"] / pages, 2),
            # the clients' own counts: frontier calls (all partitions), those with a lease
            # request, parts of a pump call held for a partition's next call (P > 1)
            "frontier_calls_per_page": round(st["frontier_calls"] / pages, 3),
            "lease_calls_per_page": round(st["lease_calls"] / pages, 3),
            "held_parts_per_page": round(st["held_parts"] / pages, 3),
            "pages_per_call": round(st["pages"] / max(st["calls"], 1), 2),
            # per page: round trips (every command the clients sent, scripts as one), the
            # scripts' Redis time (INFO commandstats usec, their commands included)
            "roundtrips_per_page": round(sum(
                n for name, (n, _) in st["commands"].items()
                if name in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
                or not _in_script(name)) / pages, 3),
            "script_us_per_page": round(sum(
                u for name, (_, u) in st["commands"].items()
                if name in ("cmdstat_fcall", "cmdstat_evalsha")) / pages, 1),
            "commands_per_page": {name[8:]: [round(n / pages, 3), round(u / pages, 1)]
                                  for name, (n, u) in sorted(st["commands"].items(),
                                                             key=lambda x: -x[1][1])[:14]},
            "script_calls_per_page": round(sum(
                n for name, (n, _) in st["commands"].items()
                if name in ("cmdstat_fcall", "cmdstat_evalsha")) / pages, 3)}


def _in_script(name: str) -> bool:
    """Whether commandstats' *name* is a command the scripts run (not one a client sends)."""
    return name not in ("cmdstat_cluster", "cmdstat_ping", "cmdstat_client", "cmdstat_info",
                        "cmdstat_config", "cmdstat_function", "cmdstat_script",
                        "cmdstat_command", "cmdstat_hello")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--masters", type=int, default=2)
    ap.add_argument("--parts", default="1,4")
    ap.add_argument("--hosts", default="100,10000")
    ap.add_argument("--clients", default="16")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--flush", default="0.5")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pages", type=int, default=0,
                    help="end a cell's calls at that many pages acknowledged (0: --seconds)")
    ap.add_argument("--instructions", action="store_true",
                    help="every master under callgrind: instructions (Ir) per page summed "
                         "over the masters, less each one's idle Ir/s over the cell's span")
    ap.add_argument("--dupe-cache", type=int, default=DUPE_CACHE_SIZE,
                    help="each client's FLEET_DUPEFILTER_CACHE (the worker's default; 0: "
                         "every link goes to Redis, as this bench's runs before 2026-12-02 "
                         "14:00)")
    ap.add_argument("--lean-cache", default="on",
                    help="P > 1 cells once per value: on (the foreign links' known duplicates "
                         "left out of the lean pushes, frontier/lean.py) or off (always sent, "
                         "each partition's client with 1/P of the cache: the tree before)")
    ap.add_argument("--listpack-entries", type=int, default=0,
                    help="the servers' hash-max-listpack-entries (0: redis-server's own "
                         "default, 512 in Redis 7.0 without a config file; its shipped "
                         "redis.conf sets 128)")
    ap.add_argument("--split", action="store_true",
                    help="after each P = 1 cell, one of N independent P = 1 crawls, one per "
                         "master (the clients shared out), as a second baseline")
    a = ap.parse_args()
    if a.instructions:  # (no lease expires while the servers run ~50x slower)
        global PARAMS
        PARAMS = dataclasses.replace(PARAMS, lease_timeout=600.0)
    flushes = [float(x) for x in a.flush.split(",")]
    n = 0
    with h.workdir("parts-bench-") as root, Cluster(
            root, a.masters, a.instructions,
            ["--hash-max-listpack-entries", str(a.listpack_entries)]
            if a.listpack_entries else []) as cluster:
        for hosts in [int(x) for x in a.hosts.split(",")]:
            for clients in [int(x) for x in a.clients.split(",")]:
                for rnd in range(a.rounds):
                    base: dict[str, Any] | None = None
                    for parts in [int(x) for x in a.parts.split(",")]:
                        for flush, lean in ([(f, x == "on") for f in flushes
                                             for x in a.lean_cache.split(",")]
                                            if parts > 1 else [(0.0, True)]):
                            n += 1
                            c = cell(cluster, parts, hosts, clients, a.seconds,
                                     f"{n}-{parts}-{hosts}-{clients}", flush, pages=a.pages,
                                     dupe_cache=a.dupe_cache, lean_cache=lean)
                            c["masters"] = a.masters
                            c["listpack_entries"] = a.listpack_entries or None
                            c["round"] = rnd
                            c["load"] = [round(x, 2) for x in os.getloadavg()]
                            print(json.dumps(c), flush=True)
                            if parts == 1:
                                base = c
                                if a.split and a.masters > 1:
                                    n += 1
                                    sc = cell(cluster, 1, hosts, clients, a.seconds,
                                              f"{n}-s-{hosts}-{clients}", 0.0, a.masters,
                                              pages=a.pages, dupe_cache=a.dupe_cache)
                                    sc.update(masters=a.masters, round=rnd, load=[
                                        round(x, 2) for x in os.getloadavg()])
                                    print(json.dumps(sc), flush=True)
                                    print(json.dumps({
                                        "ratio_split_over_one": round(
                                            sc["cpu_us_per_page"] / c["cpu_us_per_page"], 3),
                                        "hosts": hosts, "clients": clients, "round": rnd}),
                                        flush=True)
                            elif base is not None:
                                print(json.dumps({
                                    "ratio_cpu_per_page": round(
                                        c["cpu_us_per_page"] / base["cpu_us_per_page"], 3),
                                    **({"ratio_ir_per_page": round(
                                        c["ir_per_page"] / base["ir_per_page"], 4)}
                                       if a.instructions else {}),
                                    "parts": parts, "flush": flush, "lean_cache": lean,
                                    "hosts": hosts,
                                    "clients": clients, "round": rnd}), flush=True)


if __name__ == "__main__":
    main()
