"""Redis time per page of the frontier call with and without budgets (issue 34), in one run.

Two crawls on one fresh ``redis-server``: ``plain`` (no budget) and ``budget``
(FLEET_BUDGET_PAGES and FLEET_HOST_BUDGET_PAGES, both far above what the run leases, so both
budgets are charged at every lease but never refuse one).  Each is pushed the same --pages
URLs over --hosts hosts; then rounds alternate (plain, budget / budget, plain ...): in each,
--clients clients each make calls that acknowledge their previous leases and ask for --take
more, until the round has leased --per-round pages.  Redis time is ``usec`` of ``INFO
commandstats`` (FCALL and EVALSHA: the frontier call), read before and after each crawl's
part of a round, divided by the pages leased in it; the figure is the median over rounds, and
the ratio budget / plain.

Usage: ``.venv/bin/python bench/bench_budget.py [--pages 20000] [--hosts 100] [--rounds 8]``
"""

from __future__ import annotations

import argparse
from typing import Any

import _harness as h
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def redis_usec(client: Any) -> float:
    stats = client.info("commandstats")
    return sum(float(stats.get(f"cmdstat_{c}", {}).get("usec", 0))
               for c in ("fcall", "evalsha", "eval"))


def push_all(admin: FrontierAdmin, pages: int, hosts: int) -> None:
    batch = []
    for i in range(pages):
        host = f"h{i % hosts:04d}.example"
        url = f"http://{host}/p/{i}"
        batch.append((bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, host))
        if len(batch) == 500:
            admin.push(batch)
            batch = []
    if batch:
        admin.push(batch)


def run_round(admin: FrontierAdmin, held: dict[str, list[Any]], clients: int, take: int,
              per_round: int) -> tuple[float, int]:
    """(Redis µs, pages leased) of one round of *admin*'s clients."""
    before, leased = redis_usec(admin.client), 0
    while leased < per_round:
        for n in range(clients):
            worker = f"w{n}"
            acks = [(e.entry_id, e.token) for e in held.get(worker, [])]
            result = admin.call(CallBatch(acks=acks, take=take), worker=worker)
            held[worker] = result.leased
            leased += len(result.leased)
    return redis_usec(admin.client) - before, leased


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--take", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    per_round = args.pages // (args.rounds + 1)
    with h.workdir() as root, h.Redis(root) as server:
        params = {"plain": FrontierParams(),
                  "budget": FrontierParams(budget_pages=10 * args.pages,
                                           host_budget_pages=10 * args.pages)}
        admins = {name: FrontierAdmin(server.url, name, params=p) for name, p in params.items()}
        for admin in admins.values():
            push_all(admin, args.pages, args.hosts)
        held: dict[str, dict[str, list[Any]]] = {name: {} for name in admins}
        for name, admin in admins.items():  # warm-up (library loaded, first hosts leased)
            run_round(admin, held[name], args.clients, args.take, per_round // 4)
        per_page: dict[str, list[float]] = {name: [] for name in admins}
        for r in range(args.rounds):
            order = ["plain", "budget"] if r % 2 == 0 else ["budget", "plain"]
            for name in order:
                usec, leased = run_round(admins[name], held[name], args.clients, args.take,
                                         per_round)
                per_page[name].append(usec / max(leased, 1))
        charged = int(admins["budget"].client.hget(admins["budget"].keys.budget, "charged"))
    plain, budget = h.median(per_page["plain"]), h.median(per_page["budget"])
    # each round's two parts ran back to back: their ratio is the less noisy figure
    paired = h.median([b / p for p, b in zip(per_page["plain"], per_page["budget"],
                                             strict=True)])
    print(f"Redis µs per page leased and acknowledged ({args.clients} clients, take "
          f"{args.take}, {args.hosts} hosts, {args.rounds} rounds of {per_round} pages):")
    print(f"  plain   {plain:7.2f}   rounds {h.fmt_list(per_page['plain'], 2)}")
    print(f"  budget  {budget:7.2f}   rounds {h.fmt_list(per_page['budget'], 2)}")
    print(f"  ratio budget / plain {budget / plain:.3f}, median of the rounds' ratios "
          f"{paired:.3f}  (pages charged {charged})")
    h.emit_json({"plain_us_per_page": round(plain, 2), "budget_us_per_page": round(budget, 2),
                 "ratio": round(budget / plain, 3), "paired_ratio": round(paired, 3),
                 "charged": charged, **vars(args),
                 **h.machine()})


if __name__ == "__main__":
    main()
