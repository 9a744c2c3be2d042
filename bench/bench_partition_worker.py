"""One worker's pages/s on a partitioned crawl (issue 21): P = 1 vs P = --partitions, same run.

bench_throughput.py's runs (the example project's ``docs`` spider, one worker, rate = items /
(last item - engine start) taken inside the worker), four sides per round, the order rotating:

* *plain*: plain Scrapy (memory scheduler), the reference of bench_throughput;
* *fleet*: this tree's worker, ``FLEET_PARTITIONS=1``;
* *part*: this tree's worker, ``FLEET_PARTITIONS=P`` (the crawl created with it by the push);
* *base*: ``--baseline DIR``'s worker (e.g. a worktree of main), ``FLEET_PARTITIONS=1``.

Two site shapes (``--shapes``): ``1`` = one host (127.0.0.1; at P > 1 all the work is in one
partition), ``H`` = H hosts (127.0.0.10, .11, ...: distinct loopback addresses served by one
site server), each with the same generated tree of ``--pages`` / H pages, one start URL per
host (pushed together; plain Scrapy gets them as start_urls).  The *part* side's counts come
from its ``fleet/partitions/*`` stats: frontier calls, lease requests and those that got
nothing, per partition.

Usage: ``.venv/bin/python bench/bench_partition_worker.py --baseline ../base [--partitions 8]
[--shapes 1,24] [--pages 2000] [--rounds 3] [--sides part,fleet] [--part-setting K=V]``
(``--sides``: a scratch run of some sides, no summary; ``--part-setting``: a setting of the
P > 1 side only, e.g. ``FLEET_WORKER_ID``, which names its home partition)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import _harness as h
import bench_throughput as bt

from testsite import generate_site

SIDES = ("plain", "fleet", "part", "base")


def run_shape(root: Path, args: argparse.Namespace, hosts: int) -> dict[str, Any]:
    per_host = max(1, args.pages // hosts)
    www = root / f"www-{hosts}"
    paths = generate_site(www, per_host, args.links, seed=1)
    binds = [f"127.0.0.{10 + i}" for i in range(hosts)] if hosts > 1 else []
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    with h.Redis(root / f"r{hosts}") as redis, \
            h.Site(www, root / f"site-{hosts}.log", binds) as site:
        start = ",".join(u + "site/" for u in site.urls)
        env = h.worker_env(root)
        expected = len(paths) * len(site.urls)
        print(f"shape: {len(site.urls)} host(s) x {len(paths)} pages x {args.links} links; "
              f"P = {args.partitions} for 'part'", flush=True)
        for rnd in range(args.rounds):
            order = list(SIDES[rnd % 4:] + SIDES[:rnd % 4])
            for side in (s for s in order if s in args.sides):
                tag = f"{hosts}-{rnd}"
                if side == "plain":
                    run = bt.run_plain(root, env, redis, site, start, tag)  # type: ignore[arg-type]
                else:
                    extra = {"FLEET_PARTITIONS": str(args.partitions if side == "part" else 1)}
                    if side == "part":
                        extra.update(kv.split("=", 1) for kv in args.part_setting)
                    run = bt.run_fleet(root, env, redis, site, start, f"{side}-{tag}",
                                       extra=extra,
                                       tree=args.baseline.resolve() if side == "base" else None)
                runs[side].append(run)
                st = run["stats"]
                counts = ""
                if side == "part":
                    g = lambda k, st=st: st.get(f"fleet/partitions/{k}")  # noqa: E731
                    counts = (f"; home {g('home')}, calls {g('calls')}, lease calls "
                              f"{g('lease_calls')}, empty {g('empty_lease_calls')} (no work "
                              f"{g('empty_lease_calls_no_work')}, capped "
                              f"{g('empty_lease_calls_capped')}, waiting "
                              f"{g('empty_lease_calls_waiting')}; by partition "
                              f"{g('empty_lease_calls_by_partition')}), held parts "
                              f"{g('held_parts')}, skipped lease requests "
                              f"{g('skipped_lease_requests')}, leased by partition "
                              f"{g('leased_by_partition')}")
                print(f"  round {rnd + 1} {side:5}: {run['items']} items, {run['rate']:.0f} "
                      f"pages/s, crawl CPU {run['crawl_cpu_ms_per_page']:.2f} ms/page, "
                      f"loop blocked {100 * run['blocked']:.0f} %, run queue "
                      f"{100 * run['runq']:.0f} %, roundtrips/page "
                      f"{run.get('worker_roundtrips_per_page', 0):.3f}{counts}", flush=True)
                if run["items"] != expected:
                    print(f"  WARNING: expected {expected} items, got {run['items']}")
    if set(args.sides) != set(SIDES):
        return {}
    return summarize(runs, hosts, expected)


def summarize(runs: dict[str, list[dict[str, Any]]], hosts: int,
              pages: int) -> dict[str, Any]:
    def med(side: str, key: str) -> float:
        return h.median([r[key] for r in runs[side]])

    def paired(a: str, b: str) -> float:
        return round(h.median([x["rate"] / y["rate"]
                               for x, y in zip(runs[a], runs[b], strict=True)]), 3)

    part = runs["part"]
    fig: dict[str, Any] = {"hosts": hosts, "pages": pages}
    for side in SIDES:
        fig[f"{side}_pages_per_s"] = round(med(side, "rate"), 1)
        fig[f"{side}_rates"] = [round(r["rate"], 1) for r in runs[side]]
        fig[f"{side}_blocked"] = round(med(side, "blocked"), 3)
        fig[f"{side}_runq"] = round(med(side, "runq"), 3)
        fig[f"{side}_crawl_cpu_ms_per_page"] = round(med(side, "crawl_cpu_ms_per_page"), 3)
    fig.update({
        "part_vs_fleet": paired("part", "fleet"), "fleet_vs_base": paired("fleet", "base"),
        "part_vs_base": paired("part", "base"), "fleet_vs_plain": paired("fleet", "plain"),
        "part_vs_plain": paired("part", "plain"),
        "part_lease_calls_per_page": round(h.median(
            [r["stats"].get("fleet/partitions/lease_calls", 0) / r["items"] for r in part]), 3),
        "part_empty_lease_calls_per_page": round(h.median(
            [r["stats"].get("fleet/partitions/empty_lease_calls", 0) / r["items"]
             for r in part]), 3),
        "part_calls_per_page": round(h.median(
            [r["stats"].get("fleet/partitions/calls", 0) / r["items"] for r in part]), 3),
        "fleet_roundtrips_per_page": round(med("fleet", "worker_roundtrips_per_page"), 3),
    })
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--links", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--shapes", default="1,24", help="hosts per shape, comma-separated")
    parser.add_argument("--baseline", type=Path, required=True, metavar="DIR")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="sides to run, comma-separated (a scratch run: the summary "
                             "needs all four)")
    parser.add_argument("--part-setting", action="append", default=[], metavar="K=V",
                        help="a setting of the P > 1 side only (e.g. FLEET_WORKER_ID=w0: its "
                             "home partition)")
    args = parser.parse_args(argv)
    args.sides = args.sides.split(",")
    out: dict[str, Any] = {"bench": "partition_worker", **h.machine(),
                           "partitions": args.partitions, "rounds": args.rounds,
                           "baseline": str(args.baseline), "shapes": []}
    with h.workdir() as root:
        for hosts in (int(x) for x in args.shapes.split(",")):
            fig = run_shape(root, args, hosts)
            if not fig:
                continue
            out["shapes"].append(fig)
            print(f"  {hosts} host(s): pages/s plain {fig['plain_pages_per_s']}, fleet P=1 "
                  f"{fig['fleet_pages_per_s']}, P={args.partitions} {fig['part_pages_per_s']}, "
                  f"base P=1 {fig['base_pages_per_s']}; paired P={args.partitions}/P=1 "
                  f"{fig['part_vs_fleet']}, P=1/base {fig['fleet_vs_base']}, "
                  f"P={args.partitions}/base {fig['part_vs_base']}; empty lease calls per "
                  f"page {fig['part_empty_lease_calls_per_page']}, lease calls per page "
                  f"{fig['part_lease_calls_per_page']}; crawl CPU ms/page P=1 "
                  f"{fig['fleet_crawl_cpu_ms_per_page']}, P={args.partitions} "
                  f"{fig['part_crawl_cpu_ms_per_page']}", flush=True)
    h.emit_json(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
