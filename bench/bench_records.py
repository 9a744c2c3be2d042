"""The worker's Python cost of one frontier call's records: this tree beside a baseline tree.

Per call, what the pump does with its records (frontier/pump.py ``_build_batch``): one
acknowledgement per finished lease (``Lease.ack``), one push per link found
(``frontier.records.links``: Push records; a plain tuple in a tree without records.py), then
``protocol.call_args`` packs the batch (the one place the records become the wire's rows).
No Redis: only the Python side the records change.  Also printed: whether the call's packed
fields (ARGV[1] but its fresh ``mc`` uuid) are the same bytes in both trees, for leases of
every acknowledgement layout (failure, unstorable, revisit records) and links with delays
and lastmods.

``--baseline DIR``: a tree to compare (e.g. ``git archive main | tar -x -C DIR``).  Each tree
runs in its own interpreter (``PYTHONPATH`` = the tree), in alternating rounds; printed per
tree: µs per call (min and median over the rounds) and the ratio of this tree's minimum to
the baseline's.  ``--acks`` / ``--links``: acknowledgements per call and links per
acknowledgement (default 8 and 10, a crawl of link-rich pages: PUSH_CHUNK is 500).

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_records.py --baseline /tmp/base``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

#: run in each tree's interpreter: prints µs per call
CHILD = r"""
import hashlib, json, sys, time
import msgpack
from scrapy_fleet.frontier.leases import Lease
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, call_args
try:
    from scrapy_fleet.frontier.records import links
except ImportError:
    links = None
acks, n_links, calls = (int(x) for x in sys.argv[1:4])
leases = []
for i in range(acks):
    lease = Lease(f"{i}-0", 1_700_000_000_000 + i)
    if i % 4 == 3:
        lease.failure = b"\x81\xa6reason\xa8http_500"
    if i % 4 == 1:
        lease.unstorable = [b"\x81\xa6reason\xa9codec/bad"]
    if i % 4 == 2:
        lease.revisit = [60_000, "h1.test", 0.5, b"p"]
    lease.children = [(f"https://h{j % 7}.test/{i}/{j}", bytes([i, j]) * 6, j % 3,
                       b"x" * 180, f"h{j % 7}.test", 30 * (j % 2), 1_700_000_000 * (j % 3 == 0))
                      for j in range(n_links)]
    leases.append(lease)
params = FrontierParams()

def one():
    batch = CallBatch()
    n = 0
    for lease in leases:
        n += 1
        batch.acks.append(lease.ack())
        if links is None:  # (main before records: frontier/pump.py's tuples)
            batch.pushes += [(key, prio, payload, n, host, delay, lastmod)
                             for _, key, prio, payload, host, delay, lastmod in lease.children]
        else:
            batch.pushes += links(lease.children, n)
    return call_args(batch, "w1", params, "m")

fields = msgpack.unpackb(one(), raw=True)
del fields[b"mc"]  # (a fresh uuid per call)
wire = hashlib.sha256(msgpack.packb(fields, use_bin_type=False)).hexdigest()
for _ in range(200):
    one()
t0 = time.perf_counter()
for _ in range(calls):
    one()
print(json.dumps([(time.perf_counter() - t0) / calls * 1e6, wire]))
"""


def run(tree: Path, acks: int, links: int, calls: int) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(acks), str(links), str(calls)],
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                         cwd=str(tree), capture_output=True, text=True, check=True)
    us, wire = json.loads(out.stdout)
    return float(us), wire


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--acks", type=int, default=8)
    ap.add_argument("--links", type=int, default=10)
    args = ap.parse_args()
    trees = {"this": HERE, "baseline": Path(args.baseline).resolve()}
    times: dict[str, list[float]] = {name: [] for name in trees}
    wires: dict[str, set[str]] = {name: set() for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            us, wire = run(trees[name], args.acks, args.links, args.calls)
            times[name].append(us)
            wires[name].add(wire)
    for name, ts in times.items():
        print(f"{name:>8}: {min(ts):8.1f} µs per call (median {statistics.median(ts):.1f}) "
              f"over {args.rounds} rounds of {args.calls} calls, {args.acks} acks x "
              f"{args.links} links")
    same = len(wires["this"] | wires["baseline"]) == 1
    print(f"the call's packed fields (but its fresh uuid): {'identical' if same else 'DIFFER'}"
          f" in both trees ({', '.join(sorted(w[:12] for w in wires['this']))})")
    this, base = times["this"], times["baseline"]
    print(f"ratio this / baseline (minima): {min(this) / min(base):.3f}; medians: "
          f"{statistics.median(this) / statistics.median(base):.3f}")


if __name__ == "__main__":
    main()
