"""CPU per link of the scheduler's enqueue step: FleetScheduler vs Scrapy's own scheduler.

One process, no crawl: the links the example project's ``docs`` spider yields on a site of
``--pages`` pages x ``--links`` links (``response.follow(url, meta={"scope": ...})`` with a
``Referer`` header and ``meta["depth"]``, as the spider middlewares leave them), page after
page: each page links to ``--links`` pages drawn at random (seeded; ~90 % of the links are
duplicates, most of them known to the worker's cache by then), and every ``--calls-every``
pages the fleet makes one frontier call (``pump.call``: acknowledgements are left out,
only the pushes), as a worker does (bench_throughput: ~15 pages per call).

* *plain*: ``scrapy.core.scheduler.Scheduler`` with ``RFPDupeFilter`` and its memory queue
  (``ScrapyPriorityQueue``: the default ``DownloaderAwarePriorityQueue`` needs a running
  engine), ``enqueue_request`` of every link;
* *fleet*: ``FleetScheduler.enqueue_request`` of every link (its frontier client against the
  bench's own ``redis-server``), the frontier calls timed apart;
* *base* (``--baseline DIR``): the same as *fleet* in a child process with DIR's
  ``scrapy_fleet`` first on ``PYTHONPATH``.

Each side runs ``--repeats`` times (alternating, fresh Redis data each time); figures are
the medians of ``time.process_time()`` per link (µs) of the enqueue calls only, and of the
frontier calls per page.  Ratios are of the same run.

Usage: ``.venv/bin/python bench/bench_enqueue.py [--pages 2000] [--links 10]
[--repeats 5] [--baseline DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h


def links_of(pages: int, links: int, base: str) -> list[tuple[str, list[str]]]:
    """(page url, its link urls) in crawl order: each page links to *links* pages drawn at
    random (seeded), as ``testsite.generate_site`` does."""
    rnd = random.Random(1)
    url = lambda i: f"{base}p/{i}.html"  # noqa: E731
    return [(url(i), [url(rnd.randrange(pages)) for _ in range(links)]) for i in range(pages)]


def _requests(page: str, urls: list[str], scope: str) -> list[Any]:
    from scrapy import Request

    return [Request(u, meta={"scope": scope, "depth": 1}, headers={"Referer": page})
            for u in urls]


def _enqueue_timed(sched: Any, page: str, urls: list[str], scope: str) -> tuple[float, int]:
    """CPU seconds *sched*'s ``enqueue_request`` takes for the links of one page, and their
    number (the Requests are built outside the timing)."""
    reqs = _requests(page, urls, scope)
    t0 = time.process_time()
    for r in reqs:
        sched.enqueue_request(r)
    return time.process_time() - t0, len(reqs)


def run_plain(site: list[tuple[str, list[str]]], scope: str) -> dict[str, float]:
    from scrapy import Spider
    from scrapy.core.scheduler import Scheduler
    from scrapy.utils.test import get_crawler

    class DocsLike(Spider):
        name = "docs"

    crawler = get_crawler(DocsLike, settings_dict={
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter", "LOG_LEVEL": "WARNING",
        # (the default DownloaderAwarePriorityQueue needs a running engine)
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"})
    crawler.spider = DocsLike.from_crawler(crawler)
    crawler.stats.open_spider()
    sched = Scheduler.from_crawler(crawler)
    sched.open(crawler.spider)
    spent = 0.0
    n = 0
    for page, urls in site:
        took, links = _enqueue_timed(sched, page, urls, scope)
        spent += took
        n += links
        while sched.next_request() is not None:  # the engine takes them (not timed)
            pass
    return {"enqueue_us_per_link": 1e6 * spent / n, "links": n}


def run_fleet(site: list[tuple[str, list[str]]], scope: str, redis_url: str,
              calls_every: int, crawl: str) -> dict[str, float]:
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_fleet.frontier.client import AsyncFrontier
    from scrapy_fleet.frontier.scheduler import FleetScheduler
    from scrapy_fleet.keys.crawl import CrawlKeys

    class DocsLike(Spider):
        name = "docs"

    crawler = get_crawler(DocsLike, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": crawl, "LOG_LEVEL": "WARNING",
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    crawler.stats.open_spider()
    sched = FleetScheduler.from_crawler(crawler)
    sched.book.spider = DocsLike.from_crawler(crawler)
    sched.pump.frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", crawl), "w1",
                                        sched.config.frontier_params())

    async def run() -> tuple[float, float, int, int]:
        assert sched.pump.frontier is not None
        spent = called = 0.0
        n = calls = 0
        try:
            for i, (page, urls) in enumerate(site):
                took, links = _enqueue_timed(sched, page, urls, scope)
                spent += took
                n += links
                if (i + 1) % calls_every == 0 or i == len(site) - 1:
                    t0 = time.process_time()
                    await sched.pump.call(final=True)  # pushes only: leases nothing
                    called += time.process_time() - t0
                    calls += 1
        finally:
            await sched.pump.frontier.close()
        return spent, called, n, calls

    spent, called, n, calls = asyncio.run(run())
    stats = crawler.stats.get_stats()
    return {"enqueue_us_per_link": 1e6 * spent / n, "links": n,
            "call_us_per_page": 1e6 * called / len(site), "calls": calls,
            "pushed": stats.get("fleet/frontier/pushed", 0),
            "cached": stats.get("fleet/dupefilter/cached", 0)}


def child(args: argparse.Namespace) -> None:
    site = links_of(args.pages, args.links, "http://127.0.0.1:1/site/")
    if args.child == "plain":
        out = run_plain(site, "http://127.0.0.1:1/site/")
    else:
        out = run_fleet(site, "http://127.0.0.1:1/site/", args.redis_url, args.calls_every,
                        args.crawl)
    import scrapy_fleet

    out["tree"] = str(Path(scrapy_fleet.__file__).resolve().parent.parent)
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=2000)
    p.add_argument("--links", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls-every", type=int, default=15)
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR")
    p.add_argument("--child", choices=["plain", "fleet"], help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--crawl", default="enq", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    sides = ["plain", "fleet"] + (["base"] if args.baseline else [])
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    with h.workdir("fleet-enqueue-") as root, h.Redis(root) as redis:
        env = h.worker_env(root)
        for rep in range(args.repeats):
            order = sides[rep % len(sides):] + sides[:rep % len(sides)]
            for side in order:
                redis.client().flushall()
                run_env = dict(env)
                if side == "base":
                    run_env["PYTHONPATH"] = os.pathsep.join(
                        [str(args.baseline.resolve()), env["PYTHONPATH"]])
                cmd = [h.PYTHON, str(Path(__file__).resolve()), "--child",
                       "plain" if side == "plain" else "fleet", "--redis-url", redis.url,
                       "--pages", str(args.pages), "--links", str(args.links),
                       "--calls-every", str(args.calls_every)]
                done = subprocess.run(cmd, env=run_env, capture_output=True, text=True,
                                      timeout=300, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"{side} failed:\n{done.stderr[-3000:]}")
                out = json.loads(done.stdout.strip().splitlines()[-1])
                tree = out.pop("tree")
                if side == "base" and Path(tree) != args.baseline.resolve():
                    raise RuntimeError(f"base side imported scrapy_fleet from {tree}")
                runs[side].append(out)
                print(f"  {rep + 1} {side:5}: {json.dumps(out)}", flush=True)

    def med(side: str, key: str) -> float:
        return h.median([r[key] for r in runs[side]])

    fig: dict[str, Any] = {"bench": "enqueue", **h.machine(), "pages": args.pages,
                           "links": args.links, "repeats": args.repeats,
                           "calls_every": args.calls_every}
    for side in sides:
        fig[f"{side}_enqueue_us_per_link"] = round(med(side, "enqueue_us_per_link"), 2)
        if side != "plain":
            fig[f"{side}_call_us_per_page"] = round(med(side, "call_us_per_page"), 1)
    fig["fleet_vs_plain"] = round(fig["fleet_enqueue_us_per_link"]
                                  / fig["plain_enqueue_us_per_link"], 3)
    if args.baseline:
        fig["base_vs_plain"] = round(fig["base_enqueue_us_per_link"]
                                     / fig["plain_enqueue_us_per_link"], 3)
        fig["fleet_vs_base"] = round(fig["fleet_enqueue_us_per_link"]
                                     / fig["base_enqueue_us_per_link"], 3)
    print()
    print(f"enqueue CPU per link (µs, median of {args.repeats}): " + ", ".join(
        f"{s} {fig[f'{s}_enqueue_us_per_link']:.2f}" for s in sides))
    print("frontier call CPU per page (µs, worker side): " + ", ".join(
        f"{s} {fig[f'{s}_call_us_per_page']:.1f}" for s in sides if s != "plain"))
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
