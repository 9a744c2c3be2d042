"""Crawl control (issue 34): the frontier call's Redis time per page without and with control.

One fresh ``redis-server``; per round, three crawls of HOSTS hosts x PER_HOST pages, each
crawled to the end by one client that acknowledges the leases of its previous call and asks
for TAKE more (the worker's loop, through FrontierAdmin.call):

* ``off``: control never used (no ``ctl`` key: the path of main @4040c2b, whose only change
  here is one more key in the call's first MGET);
* ``on``: a paused host present (its own queue of PER_HOST pages, never leased) and every
  call reporting the generation it holds (one HSET), the crawl running;
* ``on_blocked``: as ``on`` with the paused host blocked instead (until unblocked).

Redis time is ``INFO commandstats`` (``cmdstat_fcall`` usec, wall time inside Redis) over the
crawl, divided by the pages leased; the median of --rounds rounds, the three kinds
interleaved in each round, each first in turn.
Prints the per-page costs and the ratios to ``off``, then one JSON line.

Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_control.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import _harness as h
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.commands import control
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch

HOSTS = 20
PER_HOST = 100
TAKE = 16


def entry(url: str) -> tuple[bytes, int, bytes, int, str]:
    """A push of *url* (CallBatch.pushes), counted for its host."""
    return bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, url.split("/")[2]


def fcall_usec(admin: FrontierAdmin) -> int:
    stats = admin.client.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("usec", 0))


def crawl(url: str, crawl_id: str, kind: str) -> float:
    """Redis usec per page leased of one crawl to its end (see the module docstring)."""
    admin = FrontierAdmin(url, crawl_id)
    for i in range(HOSTS):
        admin.push([entry(f"http://h{i}.test/{j}") for j in range(PER_HOST)])
    gen = 0
    if kind != "off":
        admin.push([entry(f"http://paused.test/{j}") for j in range(PER_HOST)])
        op = "block" if kind == "on_blocked" else "hpause"
        gen = control.write(admin, 1, op, ["paused.test"], 0, "bench")
    before, pages, held = fcall_usec(admin), 0, []
    while True:
        res = admin.call(CallBatch(acks=held, take=TAKE, control_gen=gen), worker="w")
        held = [(e.entry_id, e.token) for e in res.leased]
        pages += len(held)
        if not held and res.queued <= (PER_HOST if kind != "off" else 0):
            break
    spent = fcall_usec(admin) - before
    admin.close()
    return spent / max(1, pages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    kinds = ("off", "on", "on_blocked")
    per: dict[str, list[float]] = {k: [] for k in kinds}
    with h.workdir("fleet-bench-control-") as root, h.Redis(root) as redis:
        for r in range(args.rounds):
            for k in kinds[r % 3:] + kinds[:r % 3]:  # (each kind first in turn)
                per[k].append(crawl(redis.url, f"ctl{r}{k.replace('_', '')}", k))
    out: dict[str, Any] = {"hosts": HOSTS, "per_host": PER_HOST, "take": TAKE,
                           "rounds": args.rounds, "machine": h.machine()}
    base = statistics.median(per["off"])
    for k in kinds:
        med = statistics.median(per[k])
        out[f"usec_per_page_{k}"] = round(med, 2)
        out[f"ratio_{k}"] = round(med / base, 3)
        print(f"{k:11s} {med:7.2f} usec/page  x{med / base:.3f}")
    h.emit_json(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
