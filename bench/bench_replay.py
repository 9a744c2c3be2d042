"""Replay recorded frontier calls on a fresh redis-server per tree: Redis time per call and page.

bench_capacity.py measures a live fleet of synthetic clients; on a machine shared with other
work its figures move with the load (±20 % between runs here).  This bench takes the clients
out of the measurement: the same recorded calls run, one after another, against a fresh
``redis-server`` for each tree, in alternating rounds, so two versions of lua/frontier.lua are
compared on identical work (noise ~3 % here).

``record FILE [--clients 16] [--hosts 100] [--seconds 6]``: one cell of bench_capacity.py (its
synthetic clients and seeds, this tree), with every frontier.lua call also written to FILE:
msgpack records ``[time s, KEYS, ARGV[1], ARGV[2]]`` (bench_capacity.Recorder).

``replay FILE --baseline DIR [--rounds 3] [--skip 50]``: per round, this tree then the
baseline's (``lua.source("frontier.lua")`` of each, libraries included), each on a fresh
server.  Two things of a recording are the server's and cannot be replayed as they are:
* fencing tokens come from the server's clock, and which entries a call leases depends on the
  order the calls ran in: a replayed call's acknowledgements, downloads over, extensions,
  releases and dead letters name, in order, the entries that *this replay* leased to the same
  worker (the recorded ids are replaced), so every acknowledgement holds its lease, as it did;
* the Bloom filter's generation id is the server's TIME when it was created: after the first
  call (which creates it) it is set to the one the recording's calls carry, so that their
  links left out as known duplicates are accepted.
The first ``--skip`` calls (seeding, warm-up) run unmeasured.  Reported per tree: EVALSHA
``usec`` per call (INFO commandstats: wall time inside Redis, the commands the script runs
included), min and median over the rounds; redis-server CPU (utime + stime) per call; pages
acknowledged per call (from the replies) and so µs per page; the ratio of the minima to this
tree's; the longest call and the calls over 2 ms (``SLOWLOG`` at >= 1 ms), of the round with
the fewest.

Usage: ``.venv/bin/python bench/bench_replay.py record /tmp/calls-16x100 --clients 16
--hosts 100`` then ``.venv/bin/python bench/bench_replay.py replay /tmp/calls-16x100
--baseline ../base``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import Any

import _harness as h
import bench_capacity as bc
import msgpack

ENTRY_LISTS = (b"a", b"s", b"x", b"r", b"d")  # the call's lists of [entry id, token, ...]


def frontier_source(tree: Path, cwd: Path) -> str:
    """lua.source("frontier.lua") of the scrapy_fleet of tree (a child process imports it)."""
    code = "import sys; from scrapy_fleet import lua; sys.stdout.write(lua.source('frontier.lua'))"
    env = dict(os.environ, PYTHONPATH=str(tree))
    # (cwd: not a checkout, so that the tree on PYTHONPATH is the one imported)
    return subprocess.run([h.PYTHON, "-c", code], env=env, cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def read_calls(path: Path) -> list[list[Any]]:
    with path.open("rb") as f:
        calls = list(msgpack.Unpacker(f, raw=False, strict_map_key=False))
    calls.sort(key=lambda c: c[0])
    return calls


def recorded_generation(calls: list[list[Any]]) -> bytes | None:
    """The Bloom generation id most calls carry (field bg of ARGV[1])."""
    seen: dict[bytes, int] = {}
    for c in calls:
        g = msgpack.unpackb(c[2], raw=True, strict_map_key=False).get(b"bg")
        if g:
            seen[g] = seen.get(g, 0) + 1
    return max(seen, key=lambda g: seen[g]) if seen else None


class Replay:
    """One replay on one server: recorded calls with their entries mapped to this replay's."""

    def __init__(self, r: Any, sha: str, generation: bytes | None) -> None:
        self.r, self.sha, self.generation = r, sha, generation
        self.held: dict[bytes, list[list[Any]]] = {}  # worker -> [[id, token]] leased here
        self.calls = self.errors = self.acked = self.lost = 0
        self.first = True

    def remap(self, arg: bytes) -> tuple[bytes, bytes]:
        req = msgpack.unpackb(arg, raw=True, strict_map_key=False)
        worker = req.get(b"w") or b""
        mine = self.held.setdefault(worker, [])
        mapped: dict[Any, list[Any]] = {}
        for name in ENTRY_LISTS:
            for e in req.get(name) or []:
                if e[0] not in mapped:
                    # a recorded entry with no counterpart keeps its id: a stale entry, as lost
                    mapped[e[0]] = mine[len(mapped)] if len(mapped) < len(mine) else e[:2]
                e[0], e[1] = mapped[e[0]][0], mapped[e[0]][1]
        done = {e[0] for name in (b"a", b"r", b"d") for e in req.get(name) or []}
        self.held[worker] = [e for e in mine if e[0] not in done]
        return msgpack.packb(req, use_bin_type=False), worker

    def call(self, record: list[Any]) -> None:
        _, keys, arg, monitor = record
        arg, worker = self.remap(arg)
        self.calls += 1
        try:
            reply = self.r.evalsha(self.sha, len(keys), *keys, arg, monitor)
        except Exception:  # (counted and reported: a replay that errs is no figure)
            self.errors += 1
            return
        out = msgpack.unpackb(reply, raw=True, strict_map_key=False)
        self.held.setdefault(worker, []).extend([e[0], e[1]] for e in out.get(b"leased") or [])
        self.acked += out.get(b"acked") or 0
        self.lost += len(out.get(b"lost") or [])
        if self.first and self.generation:
            self.r.hset(keys[32], "g", self.generation)  # KEYS[33]: the Bloom filter's meta
        self.first = False


def replay_once(source: str, calls: list[list[Any]], skip: int, generation: bytes | None,
                root: Path) -> dict[str, float]:
    with h.Redis(root) as server:
        r = server.client()
        rp = Replay(r, r.script_load(source), generation)
        for record in calls[:skip]:
            rp.call(record)
        acked0 = rp.acked
        r.config_set("slowlog-log-slower-than", 1000)
        r.config_set("slowlog-max-len", 100000)
        r.slowlog_reset()
        r.config_resetstat()
        cpu0 = bc.redis_cpu(server.proc.pid)  # type: ignore[union-attr]
        for record in calls[skip:]:
            rp.call(record)
        cpu = bc.redis_cpu(server.proc.pid) - cpu0  # type: ignore[union-attr]
        st = r.info("commandstats").get("cmdstat_evalsha", {"usec": 0, "calls": 1})
        n = max(int(st["calls"]), 1)
        pages = max(rp.acked - acked0, 1)
        slow = [int(e["duration"]) for e in r.slowlog_get(100000)]
        r.close()
        return {"usec_per_call": st["usec"] / n, "cpu_us_per_call": cpu * 1e6 / n,
                "pages_per_call": pages / n, "exec_us_per_page": st["usec"] / pages,
                "errors": rp.errors, "lost": rp.lost, "longest_us": max(slow, default=0),
                "over_2ms": sum(1 for d in slow if d > 2000)}


def record(args: argparse.Namespace) -> None:
    path = Path(args.file).resolve()
    path.unlink(missing_ok=True)
    os.environ["BENCH_CAPTURE"] = str(path)
    with h.workdir("fleet-record-") as root:
        cell = bc.run_cell("new", h.REPO_ROOT, args.clients, args.hosts, args.seconds, root,
                           args.seeds)
    print(f"recorded {len(read_calls(path))} calls of c={args.clients} h={args.hosts}: "
          f"{cell['pages']} pages, {cell['exec_us_per_page']} µs/page live", flush=True)


def replay(args: argparse.Namespace) -> None:
    calls = read_calls(Path(args.file))
    generation = recorded_generation(calls)
    trees = {"this": h.REPO_ROOT}
    if args.baseline:
        trees["base"] = args.baseline.resolve()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with h.workdir("fleet-replay-") as root:
        sources = {name: frontier_source(tree, root) for name, tree in trees.items()}
        for k in range(args.rounds):
            for name in trees:
                results[name].append(replay_once(sources[name], calls, args.skip, generation,
                                                 root / f"{name}-{k}"))
    print(f"{len(calls)} calls, {len(calls) - args.skip} measured, {args.rounds} rounds")
    base_min = min(x["usec_per_call"] for x in results["this"])
    figures: dict[str, Any] = {"machine": h.machine(), "calls": len(calls), "trees": {}}
    for name, rows in results.items():
        usec = [x["usec_per_call"] for x in rows]
        row = {"tree": str(trees[name]), "usec_per_call_min": round(min(usec), 1),
               "usec_per_call_median": round(h.median(usec), 1),
               "cpu_us_per_call_median": round(h.median([x["cpu_us_per_call"] for x in rows]), 1),
               "pages_per_call": round(h.median([x["pages_per_call"] for x in rows]), 2),
               "exec_us_per_page_min": round(min(x["exec_us_per_page"] for x in rows), 1),
               "ratio_to_this": round(min(usec) / base_min, 3),
               "errors": max(x["errors"] for x in rows), "lost": max(x["lost"] for x in rows),
               # the longest call and the calls over 2 ms: of the round with the fewest (the
               # other rounds add what the machine's load adds)
               "longest_us": min(x["longest_us"] for x in rows),
               "over_2ms": min(x["over_2ms"] for x in rows)}
        figures["trees"][name] = row
        print(f"{name:>5}: {row['usec_per_call_min']} µs/call (median "
              f"{row['usec_per_call_median']}), CPU {row['cpu_us_per_call_median']} µs/call, "
              f"{row['pages_per_call']} pages/call, {row['exec_us_per_page_min']} µs/page, "
              f"x{row['ratio_to_this']} this tree's, longest {row['longest_us']} µs, "
              f"{row['over_2ms']} over 2 ms, errors {row['errors']}, lost {row['lost']}",
              flush=True)
    h.emit_json(figures)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="record one bench_capacity cell's frontier calls")
    rec.add_argument("file")
    rec.add_argument("--clients", type=int, default=16)
    rec.add_argument("--hosts", type=int, default=100)
    rec.add_argument("--seconds", type=float, default=6.0)
    rec.add_argument("--seeds", type=int, default=2000)
    rep = sub.add_parser("replay", help="replay recorded calls on this tree and a baseline")
    rep.add_argument("file")
    rep.add_argument("--baseline", type=Path, default=None)
    rep.add_argument("--rounds", type=int, default=3)
    rep.add_argument("--skip", type=int, default=50)
    args = p.parse_args()
    if args.action == "record":
        record(args)
    else:
        replay(args)


if __name__ == "__main__":
    main()
