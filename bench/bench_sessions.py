"""Cost of session pools per request (issue 32 items 2 and 4): the fleet's cookie jars alone
(``FleetCookiesMiddleware``: ``meta["cookiejar"]`` as in Scrapy) vs the same with a pool of
sessions in front (``FleetSessionsMiddleware``, ``FLEET_SESSION_POOL_SIZE``) without a cap on
a session's requests in flight (``pools``: ``FLEET_SESSION_CONCURRENCY = 0``) and with the
default cap (``slots``: 1, a slot taken and given back per request, issue 32 item 5: the take
folded into the draw call, the give riding on the next request's draw), and the same cap the
way it was first built (``split``: a ``take`` call of its own before the request, a ``give``
call of its own after its answer), in one process, beside each other in one run.

For each side, ``--requests`` requests of one site go through ``process_request`` and
``process_response`` of the middlewares one after the other, on one asyncio loop against a
fresh redis-server of the bench's own; the spider declares a validity check (run on every
answer) and no login.  Figures per side, medians over ``--rounds`` alternating rounds: CPU µs
per request of this process, Redis commands and Redis server µs per request (``INFO
commandstats``, script-internal commands included), and the ratios of each side to jars and
of slots and split to pools.

Usage: ``.venv/bin/python bench/bench_sessions.py [--requests 2000] [--pool 4] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import _harness as h
from bench_cookies import _redis_usage
from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_fleet.sessions.drawing import SLOT_META, FleetSessionsMiddleware
from scrapy_fleet.sessions.middleware import FleetCookiesMiddleware


class _Spider(Spider):
    name = "sessionbench"

    def fleet_session_check(self, response: Any) -> bool:
        return b"login" not in response.body


class _Split(FleetSessionsMiddleware):
    """The slot protocol before the fold: a ``take`` call of its own after the draw, a
    ``give`` call of its own in ``process_response``."""

    def _ask(self, ticket: str) -> None:
        return None

    async def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        slot = request.meta.pop(SLOT_META, None)
        if slot:
            sid, _, ticket = slot.partition("|")
            await self.pools().give(sid, ticket)
        return await super().process_response(request, response)


async def _drive(mws: list[Any], n: int) -> None:
    for i in range(n):
        request = Request(f"http://example.com/p/{i}")
        for mw in mws:
            await mw.process_request(request)
        response = HtmlResponse(request.url, request=request, body=b"<html>page</html>")
        for mw in reversed(mws):
            response = await mw.process_response(request, response)


def _side(kind: str, redis: h.Redis, args: argparse.Namespace) -> dict[str, float]:
    client = redis.client()
    client.flushall()
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis.url,
        "FLEET_SESSION_POOL_SIZE": args.pool if kind != "jars" else 0,
        "FLEET_SESSION_CONCURRENCY": 1 if kind in ("slots", "split") else 0})
    crawler.spider = _Spider()
    crawler.stats.open_spider()
    mws: list[Any] = [FleetCookiesMiddleware.from_crawler(crawler)]
    if kind != "jars":
        mws.insert(0, (_Split if kind == "split" else FleetSessionsMiddleware)
                   .from_crawler(crawler))

    async def main() -> tuple[float, int, float]:
        await _drive(mws, 1)  # connect and load the scripts outside the timed part
        calls0, usec0 = _redis_usage(client)
        cpu0 = time.process_time()
        await _drive(mws, args.requests)
        await asyncio.sleep(0)  # (the last answer's give, sent one turn of the loop later)
        if kind != "jars":
            await mws[0]._gives.flush()
        cpu = time.process_time() - cpu0
        calls1, usec1 = _redis_usage(client)
        await mws[-1].store().client.aclose()
        if kind != "jars":
            await mws[0].pools().client.aclose()
        return cpu, calls1 - calls0, usec1 - usec0

    cpu, calls, usec = asyncio.run(main())
    n = args.requests
    client.close()
    return {"cpu_us": cpu * 1e6 / n, "calls": calls / n, "redis_us": usec / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    kinds = ("jars", "pools", "split", "slots")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with h.workdir() as root, h.Redis(root) as redis:
        for rnd in range(args.rounds):
            for kind in (kinds if rnd % 2 == 0 else kinds[::-1]):
                run = _side(kind, redis, args)
                runs[kind].append(run)
                print(f"  round {rnd + 1} {kind:5}: {run['cpu_us']:.0f} µs CPU/request, "
                      f"{run['calls']:.2f} Redis commands/request, "
                      f"{run['redis_us']:.1f} Redis µs/request", flush=True)
    med = {k: {f: h.median([r[f] for r in v]) for f in v[0]} for k, v in runs.items()}
    print(f"{args.requests} requests of one site, a pool of {args.pool}, a check on every "
          f"answer; medians of {args.rounds} rounds")
    for kind, m in med.items():
        print(f"  {kind:5}: {m['cpu_us']:.0f} µs CPU/request, {m['calls']:.2f} Redis "
              f"commands/request, {m['redis_us']:.1f} Redis server µs/request")
    fields = ("cpu_us", "calls", "redis_us")
    pairs = [("pools", "jars"), ("split", "jars"), ("slots", "jars"), ("split", "pools"),
             ("slots", "pools"), ("slots", "split")]
    ratios = {(a, b): {f: med[a][f] / med[b][f] for f in fields} for a, b in pairs}
    for (a, b), r in ratios.items():
        print(f"  {a} / {b}: CPU {r['cpu_us']:.2f}x, Redis commands {r['calls']:.2f}x, "
              f"Redis time {r['redis_us']:.2f}x")
    ratio, slots = ratios[("pools", "jars")], ratios[("slots", "jars")]
    h.emit_json({"bench": "sessions", **h.machine(), "requests": args.requests,
                 "pool": args.pool, "rounds": args.rounds,
                 **{f"{k}_{f}_per_request": round(v[f], 2) for k, v in med.items() for f in v},
                 **{f"ratio_{f}": round(v, 3) for f, v in ratio.items()},
                 **{f"ratio_slots_{f}": round(v, 3) for f, v in slots.items()},
                 **{f"ratio_{a}_{b}_{f}": round(v, 3) for (a, b), r in ratios.items()
                    for f, v in r.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
