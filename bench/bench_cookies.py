"""Cost of the fleet's cookie jars per request (issue 32): ``FleetCookiesMiddleware`` vs
Scrapy's own ``CookiesMiddleware``, in one process, beside each other in one run.

For each side, ``--requests`` requests go through ``process_request`` and
``process_response`` one after the other (the answer of every ``--set-every``-th sets a new
value of its cookie ``token``; the session's jar holds ``--cookies`` cookies from the start),
on one asyncio loop against a fresh redis-server of the bench's own.  Figures per side, medians over
``--rounds`` alternating rounds: CPU µs per request of this process (``time.process_time``:
the middleware, Scrapy's cookie matching, redis-py), Redis commands per request and Redis
server µs per request (``INFO commandstats``: every command, script-internal included: a
jar read is 3, EVALSHA, TIME and HGETALL), and
the ratios fleet / Scrapy.  Scrapy's side makes no Redis call: its Redis figures are 0.

Usage: ``.venv/bin/python bench/bench_cookies.py [--requests 2000] [--cookies 3]
[--set-every 10] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import time
from typing import Any

import _harness as h
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_fleet.sessions.middleware import FleetCookiesMiddleware


class _Spider(Spider):
    name = "cookiebench"


def _redis_usage(client: Any) -> tuple[int, float]:
    stats = client.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    usec = sum(v["usec"] for k, v in stats.items() if k != "cmdstat_info")
    return calls, usec


async def _call(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def _drive(mw: Any, args: argparse.Namespace) -> None:
    base = "http://example.com/"
    seed = [f"s{n}=v{n}; Path=/" for n in range(args.cookies)]
    first = Request(base)
    await _call(mw.process_request(first))
    await _call(mw.process_response(first, HtmlResponse(base, request=first, body=b"",
                                                        headers={"Set-Cookie": seed})))
    for n in range(args.requests):
        request = Request(f"{base}p/{n}")
        await _call(mw.process_request(request))
        headers = {"Set-Cookie": f"token={n}; Path=/"} if n % args.set_every == 0 else {}
        await _call(mw.process_response(request, HtmlResponse(request.url, request=request,
                                                               body=b"", headers=headers)))


def _side(kind: str, redis: h.Redis, args: argparse.Namespace) -> dict[str, float]:
    client = redis.client()
    client.flushall()
    crawler = get_crawler(_Spider, settings_dict={"FLEET_REDIS_URL": redis.url})
    crawler.spider = _Spider()
    mw: Any = (FleetCookiesMiddleware.from_crawler(crawler) if kind == "fleet"
               else CookiesMiddleware.from_crawler(crawler))

    async def main() -> float:
        if kind == "fleet":  # connect and load the scripts outside the timed part
            await _drive(mw, argparse.Namespace(**{**vars(args), "requests": 1}))
            client.flushall()
        calls0, usec0 = _redis_usage(client)
        cpu0 = time.process_time()
        await _drive(mw, args)
        cpu = time.process_time() - cpu0
        calls1, usec1 = _redis_usage(client)
        if kind == "fleet":
            await mw.store().client.aclose()
        return cpu, calls1 - calls0, usec1 - usec0

    cpu, calls, usec = asyncio.run(main())
    n = args.requests
    client.close()
    return {"cpu_us": cpu * 1e6 / n, "calls": calls / n if kind == "fleet" else 0.0,
            "redis_us": usec / n if kind == "fleet" else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cookies", type=int, default=3)
    parser.add_argument("--set-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"scrapy": [], "fleet": []}
    with h.workdir() as root, h.Redis(root) as redis:
        for rnd in range(args.rounds):
            for kind in (("scrapy", "fleet") if rnd % 2 == 0 else ("fleet", "scrapy")):
                run = _side(kind, redis, args)
                runs[kind].append(run)
                print(f"  round {rnd + 1} {kind:6}: {run['cpu_us']:.0f} µs CPU/request, "
                      f"{run['calls']:.2f} Redis commands/request, "
                      f"{run['redis_us']:.1f} Redis µs/request", flush=True)
    med = {k: {f: h.median([r[f] for r in v]) for f in v[0]} for k, v in runs.items()}
    print(f"{args.requests} requests, jar of {args.cookies} cookies, a Set-Cookie every "
          f"{args.set_every} answers; medians of {args.rounds} rounds")
    for kind, m in med.items():
        print(f"  {kind:6}: {m['cpu_us']:.0f} µs CPU/request, {m['calls']:.2f} Redis "
              f"commands/request, {m['redis_us']:.1f} Redis server µs/request")
    fleet, scrapy = med["fleet"]["cpu_us"], med["scrapy"]["cpu_us"]
    print(f"  fleet / scrapy CPU per request: {fleet / scrapy:.2f}x (+{fleet - scrapy:.0f} µs)")
    h.emit_json({"bench": "cookies", **h.machine(), "requests": args.requests,
                 "cookies": args.cookies, "set_every": args.set_every, "rounds": args.rounds,
                 "scrapy_cpu_us_per_request": round(scrapy, 1),
                 "fleet_cpu_us_per_request": round(fleet, 1),
                 "fleet_redis_commands_per_request": round(med["fleet"]["calls"], 3),
                 "fleet_redis_us_per_request": round(med["fleet"]["redis_us"], 1),
                 "cpu_ratio": round(fleet / scrapy, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
