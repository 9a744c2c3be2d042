"""Redis time and round trips per page of a crawl page budget at P = 3 partitions (issue 34
item 3: chunks reserved at the home, frontier/budgetchunks.py), beside the same crawl without
a budget, in one run.

Two crawls of three partitions on one fresh ``redis-server``: ``plain`` (no budget) and
``chunked`` (FLEET_BUDGET_PAGES far above what the run leases: every lease charged to its
partition's chunk, a chunk of 64 reserved at the home whenever one runs out, none refused).
Each partition is pushed the same pages over --hosts hosts of its own; rounds alternate the
two crawls; in each, --clients clients call every partition in turn, acknowledging their
previous leases there and asking for --take more (the chunked crawl's clients reserve a chunk
first where theirs is spent, as a worker's partitioned client does).  Redis time is ``usec``
of ``INFO commandstats`` (FCALL, EVALSHA, EVAL: the frontier calls and the budget scripts)
per page leased; round trips are the calls the clients made per page leased.

Usage: ``.venv/bin/python bench/bench_budget_chunks.py [--pages 6000] [--rounds 8]``
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import _harness as h
from bench_budget import redis_usec
from scrapy import Request

from scrapy_fleet import codec, redis_client
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.budgetchunks import ChunkBudget
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of

PARTS = 3


def hosts_of(p: int, n: int) -> list[str]:
    found = (f"h{i:05d}.example" for i in range(100_000))
    return [x for x in found if partition_of(x, PARTS) == p][:n]


def push_all(admin: FrontierAdmin, hosts: list[str], pages: int) -> None:
    batch = []
    for i in range(pages):
        url = f"http://{hosts[i % len(hosts)]}/p/{i}"
        batch.append((bloom_key(url.encode()), 0, codec.encode(Request(url)), 0,
                      hosts[i % len(hosts)]))
        if len(batch) == 500:
            admin.push(batch)
            batch = []
    if batch:
        admin.push(batch)


class Crawl:
    """One crawl's three partitions and its clients' leases (and its ChunkBudget)."""

    def __init__(self, url: str, name: str, chunked: bool, pages: int) -> None:
        own = CrawlKeys("fleet", name)
        params = FrontierParams(budget_chunked=chunked)
        self.admins = [FrontierAdmin(url, name, params=params, keys=own.partition(p, PARTS))
                       for p in range(PARTS)]
        self.client = redis_client.make_client(url, is_async=True)
        self.budget = (ChunkBudget(self.client, own, own.all_partitions(PARTS), pages)
                       if chunked else None)
        self.held: dict[tuple[str, int], list[Any]] = {}
        self.calls = 0

    async def round(self, clients: int, take: int, per_round: int) -> tuple[float, int, int]:
        """(Redis µs, pages leased, round trips) of one round."""
        before, leased, calls = redis_usec(self.admins[0].client), 0, 0
        while leased < per_round:
            for n in range(clients):
                for p, admin in enumerate(self.admins):
                    if self.budget is not None:
                        made = self.budget.reservations + self.budget.errors
                        await self.budget.reserve({p: take})
                        calls += 2 * (self.budget.reservations + self.budget.errors - made)
                    held = self.held.get((f"w{n}", p), [])
                    result = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in held],
                                                  take=take), worker=f"w{n}")
                    calls += 1
                    if self.budget is not None:
                        self.budget.note(p, result.budget_left)
                    self.held[(f"w{n}", p)] = result.leased
                    leased += len(result.leased)
        return redis_usec(self.admins[0].client) - before, leased, calls


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    per_round = args.pages * PARTS // (args.rounds + 1)
    crawls = {"plain": Crawl(url, "plain", False, 0),
              "chunked": Crawl(url, "chunked", True, 10 * args.pages * PARTS)}
    for crawl in crawls.values():
        for p, admin in enumerate(crawl.admins):
            push_all(admin, hosts_of(p, args.hosts), args.pages)
        await crawl.round(args.clients, args.take, per_round // 4)  # warm-up
    usec: dict[str, list[float]] = {name: [] for name in crawls}
    trips: dict[str, list[float]] = {name: [] for name in crawls}
    for r in range(args.rounds):
        for name in (["plain", "chunked"] if r % 2 == 0 else ["chunked", "plain"]):
            us, leased, calls = await crawls[name].round(args.clients, args.take, per_round)
            usec[name].append(us / max(leased, 1))
            trips[name].append(calls / max(leased, 1))
    for crawl in crawls.values():
        await crawl.client.aclose()
    paired = h.median([c / p for p, c in zip(usec["plain"], usec["chunked"], strict=True)])
    return {"usec": usec, "trips": trips, "paired": paired, "per_round": per_round}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pages", type=int, default=6000, help="pages per partition")
    parser.add_argument("--hosts", type=int, default=30, help="hosts per partition")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--take", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with h.workdir() as root, h.Redis(root) as server:
        got = asyncio.run(run(args, server.url))
    plain, chunked = h.median(got["usec"]["plain"]), h.median(got["usec"]["chunked"])
    tp, tc = h.median(got["trips"]["plain"]), h.median(got["trips"]["chunked"])
    print(f"P = {PARTS}, {args.clients} clients, take {args.take}, {args.hosts} hosts per "
          f"partition, {args.rounds} rounds of {got['per_round']} pages:")
    print(f"  plain    {plain:7.2f} µs/page  {tp:.4f} round trips/page   rounds "
          f"{h.fmt_list(got['usec']['plain'], 2)}")
    print(f"  chunked  {chunked:7.2f} µs/page  {tc:.4f} round trips/page   rounds "
          f"{h.fmt_list(got['usec']['chunked'], 2)}")
    print(f"  ratio chunked / plain {chunked / plain:.3f}, median of the rounds' ratios "
          f"{got['paired']:.3f}; round trips {tc / tp:.3f}")
    h.emit_json({"plain_us_per_page": round(plain, 2), "chunked_us_per_page": round(chunked, 2),
                 "ratio": round(chunked / plain, 3), "paired_ratio": round(got["paired"], 3),
                 "plain_trips_per_page": round(tp, 4), "chunked_trips_per_page": round(tc, 4),
                 **vars(args), **h.machine()})


if __name__ == "__main__":
    main()
