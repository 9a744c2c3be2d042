"""The fixed part of the lean push (lua/push_lean.lua, issue 21: a partitioned crawl's links
for other partitions, and the push helper's batches), beside the full frontier call used as a
push-only call (lua/frontier.lua, take 0), on one partition holding 20,000 entries over 1,000
hosts.

A floor is measured in the same run: EVALSHA of ``return 1`` with the lean call's 28 KEYS.
Per call: Redis's own time for the script (INFO commandstats, EVALSHA usec / calls), for k =
0, 1, 10, 100 new links; the fixed part is the k = 0 figure (its commands: GET op, GET marker,
TIME, GET qn, ZCARD x2 with a bound, SET op).  The issue's bound: <= 40 us per call.  Ratios
lean / full are measured in the same run (adjacent cells), which is what a loaded machine lets
one compare.

Usage: .venv/bin/python bench/bench_push_lean.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _harness as h

from scrapy_fleet import lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.lean import lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys import PUSH_LEAN_CALL, CrawlKeys

PARAMS = FrontierParams(queue_max=1_000_000, host_concurrency=8)
CALLS = {0: 2000, 1: 2000, 10: 600, 100: 100}


def rows(n: int, base: int) -> list[tuple[bytes, int, bytes, str]]:
    return [(os.urandom(12), 0, b"GET http://h%d.test/p/%d" % (i % 1000, base + i),
             f"h{(base + i) % 1000}.test") for i in range(n)]


def evalsha_usec(client) -> tuple[int, int]:
    cs = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(cs.get("calls", 0)), int(cs.get("usec", 0))


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
    a = ap.parse_args()
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
