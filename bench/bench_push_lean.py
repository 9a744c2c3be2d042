"""The fixed part of the lean push (lua/push_lean.lua, issue 21: a partitioned crawl's links
for other partitions, and the push helper's batches), beside the full frontier call used as a
push-only call (lua/frontier.lua, take 0), on one partition holding 20,000 entries over 1,000
hosts.

A floor is measured in the same run: EVALSHA of ``return 1`` with the lean call's 28 KEYS.
Per call: Redis's own time for the script (INFO commandstats, usec / calls of FCALL and
EVALSHA: each call is sent as the tree's client sends it, lua.load), for k =
0, 1, 10, 100 new links; the fixed part is the k = 0 figure (its commands: GET op, GET marker,
TIME, GET qn, ZCARD x2 with a bound, SET op).  The issue's bound: <= 40 us per call.  Ratios
lean / full are measured in the same run (adjacent cells), which is what a loaded machine lets
one compare.

``--baseline DIR``: each round runs this tree then DIR's (its scrapy_fleet on PYTHONPATH, this
file's code) in a child process each, on a fresh server each, and prints both trees' figures
and this tree's ratio to the baseline's (medians over the rounds).

Usage: .venv/bin/python bench/bench_push_lean.py [--rounds 3] [--baseline ../base]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h

from scrapy_fleet import lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.lean import lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys

PARAMS = FrontierParams(queue_max=1_000_000, host_concurrency=8)
CALLS = {0: 2000, 1: 2000, 10: 600, 100: 100}


def rows(n: int, base: int) -> list[tuple[bytes, int, bytes, str]]:
    return [(os.urandom(12), 0, b"GET http://h%d.test/p/%d" % (i % 1000, base + i),
             f"h{(base + i) % 1000}.test") for i in range(n)]


def evalsha_usec(client) -> tuple[int, int]:
    """Calls and usec of the scripts since the last CONFIG RESETSTAT (FCALL and EVALSHA)."""
    st = client.info("commandstats")
    ran = [st[name] for name in ("cmdstat_fcall", "cmdstat_evalsha") if name in st]
    return sum(int(x["calls"]) for x in ran), sum(int(x["usec"]) for x in ran)


def against(baseline: Path, rounds: int) -> None:
    """Alternate rounds of this tree and *baseline*, one child process each."""
    got: dict[str, list[dict[str, float]]] = {"this": [], "base": []}
    trees = {"this": h.REPO_ROOT, "base": baseline.resolve()}
    with h.workdir("lean-vs-") as root:
        for _ in range(rounds):
            for name, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=str(tree))
                out = subprocess.run([h.PYTHON, __file__, "--rounds", "1"], env=env, cwd=root,
                                     check=True, capture_output=True, text=True).stdout
                got[name].append(json.loads(out.strip().splitlines()[-1]))
    figures: dict[str, object] = {"load": [round(x, 2) for x in os.getloadavg()]}
    for name, runs in got.items():
        for field in runs[0]:
            if field != "load":
                values = [r[field] for r in runs]
                figures[f"{name}_{field}"] = round(h.median(values), 1)
                figures[f"{name}_{field}_min"] = round(min(values), 1)
    for k in CALLS:
        figures[f"this_over_base_k{k}"] = round(
            figures[f"this_lean_k{k}"] / figures[f"base_lean_k{k}"], 3)  # type: ignore[operator]
    print(f"lean k=0: this {figures['this_lean_k0_min']} µs (median {figures['this_lean_k0']}),"
          f" base {figures['base_lean_k0_min']} µs (median {figures['base_lean_k0']}): "
          f"x{figures['this_over_base_k0']} of the medians", flush=True)
    h.emit_json(figures)


def measure(client, admin: FrontierAdmin, keys: CrawlKeys, kind: str, k: int,
            base: int) -> float:
    script = lua.load(client, "push_lean.lua")
    batches = [rows(k, base + c * k) for c in range(CALLS[k])]
    client.config_resetstat()
    for batch in batches:
        if kind == "lean":
            script(keys=keys.call_keys(PUSH_LEAN_CALL, uuid.uuid4().hex),
                   args=[lean_args(batch, PARAMS, "")])
        else:
            admin.call(CallBatch(pushes=[(b, p, pl, 0, host) for b, p, pl, host in batch]),
                       worker="")
    calls, usec = evalsha_usec(client)
    return usec / max(calls, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None)
    a = ap.parse_args()
    if a.baseline is not None:
        return against(a.baseline, a.rounds)
    with h.workdir("lean-bench-") as root:
        srv = h.Redis(root / "redis")
        srv.start()
        try:
            client = srv.client()
            admin = FrontierAdmin(srv.url, "lean", params=PARAMS)
            keys = CrawlKeys("fleet", "lean")
            for s in range(0, 20_000, 500):  # a frontier of 20,000 entries over 1,000 hosts
                admin.push([(b, p, pl, 0, host) for b, p, pl, host in rows(500, s)])
            # the floor: EVALSHA of `return 1` with the lean call's KEYS (the same run)
            floor = client.register_script("return 1")
            lean_keys = keys.call_keys(PUSH_LEAN_CALL, "floor")
            base = 10_000_000
            figures: dict[str, list[float]] = {}
            for _ in range(a.rounds):
                client.config_resetstat()
                for _ in range(2000):
                    floor(keys=lean_keys)
                calls, usec = evalsha_usec(client)
                figures.setdefault("floor_return1", []).append(usec / calls)
                for k in CALLS:
                    for kind in ("full", "lean"):
                        us = measure(client, admin, keys, kind, k, base)
                        base += CALLS[k] * max(k, 1) + 1
                        figures.setdefault(f"{kind}_k{k}", []).append(us)
            out = {name: round(h.median(v), 1) for name, v in figures.items()}
            for k in CALLS:
                out[f"ratio_k{k}"] = round(out[f"lean_k{k}"] / out[f"full_k{k}"], 3)
            out["lean_k0_above_floor"] = round(out["lean_k0"] - out["floor_return1"], 1)
            out["load"] = [round(x, 2) for x in os.getloadavg()]
            h.emit_json(out)
            admin.close()
            client.close()
        finally:
            h.stop(srv.proc)


if __name__ == "__main__":
    main()
