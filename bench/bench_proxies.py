"""Cost of the proxy pool per request: Redis calls and Redis time of choice + report.

Part a (the fleet's throughput): one ``scrapy crawl docs`` worker crawls a generated site
(``--pages`` pages x 5 links) twice per round, alternating: *direct* (no proxies: the
frontier alone, the baseline) and *proxied* (``FLEET_PROXIES`` = two real tinyproxy exits,
``Bind 127.0.0.2`` / ``127.0.0.3``).  Per page: EVALSHA calls and their µs
(``INFO commandstats``, reset before each run), the worker's frontier calls
(``fleet/redis/roundtrips``) and proxy calls (``fleet/proxy/roundtrips``), pages/s.

Part b (the script alone): ``--requests`` choose + report cycles from one asyncio client
against pools of ``--exits`` exits (a comma-separated list of sizes) and 20 sites, each
report riding with the next choice as in the middleware; µs of Redis time per request
(``cmdstat_evalsha`` usec), calls and wall µs per request, and the wall µs of a bare PING
(the floor of one round trip).

Usage: ``.venv/bin/python bench/bench_proxies.py [--pages 1000] [--rounds 2]
[--requests 5000] [--exits 2,20,200]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from _harness import (
    EXAMPLE_PROJECT,
    Redis,
    Site,
    emit_json,
    machine,
    median,
    scrapy,
    scrapy_run,
    setting_args,
    wait,
    workdir,
    worker_env,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from proxyfixtures import start_tinyproxy

from scrapy_fleet import redis_client
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.proxies.pool import Choice, ProxyPool, Report
from scrapy_fleet.proxies.settings import proxy_config
from testsite import generate_site

EXT = {"benchext.BenchStats": 0}


def evalsha_stats(client: Any) -> tuple[int, int]:
    stats = client.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    usec = sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return calls, usec


def crawl_once(root: Path, redis: Redis, site_url: str, proxies: list[str], tag: str,
               env: dict[str, str]) -> dict[str, Any]:
    client = redis.client()
    client.flushall()
    push = scrapy_run(["fleet", "push", "docs", site_url, "-s",
                       f"FLEET_REDIS_URL={redis.url}"], env)
    assert push.returncode == 0, push.stderr
    client.config_resetstat()
    stats_path = root / f"stats-{tag}.json"
    settings: dict[str, Any] = {"FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 1,
                                "EXTENSIONS": EXT, "BENCH_STATS_PATH": stats_path,
                                "LOG_LEVEL": "WARNING", "CONCURRENT_REQUESTS": 16}
    if proxies:
        settings["FLEET_PROXIES"] = ",".join(proxies)
    log = root / f"worker-{tag}.log"
    proc = scrapy(["crawl", "docs", *setting_args(settings)], env, log, cwd=EXAMPLE_PROJECT)
    code = wait(proc, 600, log)
    assert code == 0, log.read_text()[-3000:]
    calls, usec = evalsha_stats(client)
    client.close()
    data = json.loads(stats_path.read_text())
    items = data["items"]
    st = data["stats"]
    return {"items": items,
            "pages_per_s": items / max(1e-9, data["last_item"] - data["engine_started"]),
            "evalsha_per_page": calls / items, "evalsha_usec_per_page": usec / items,
            "frontier_calls_per_page": st.get("fleet/redis/roundtrips", 0) / items,
            "proxy_calls_per_page": st.get("fleet/proxy/roundtrips", 0) / items,
            "proxy_chosen": st.get("fleet/proxy/chosen", 0)}


async def script_alone(url: str, requests: int, exits: int) -> dict[str, Any]:
    config = proxy_config({"FLEET_PROXY_POOL": "bench"})
    client = redis_client.make_client(url, is_async=True)
    await client.flushall()
    pool = ProxyPool(client, ProxyPoolKeys("fleet", "bench"), config)
    await pool.seed([f"http://user{n}:pw@127.0.0.1:{3000 + n}" for n in range(exits)])
    await client.config_resetstat()
    pending: list[Report] = []
    t0 = time.perf_counter()
    for n in range(requests):
        site = f"site{n % 20}.example"
        choice = await pool.choose(site, None, pending)
        assert isinstance(choice, Choice)
        pending = [Report(choice.ticket, choice.exit_id, site, "ok", True)]
    await pool.report(pending)
    wall = time.perf_counter() - t0
    stats = await client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    await client.config_resetstat()
    t1 = time.perf_counter()
    for _ in range(requests):
        await client.ping()
    ping_wall = time.perf_counter() - t1
    ping = (await client.info("commandstats")).get("cmdstat_ping", {"usec": 0})
    await client.aclose()
    return {"requests": requests, "exits": exits, "sites": 20,
            "calls_per_request": evalsha["calls"] / requests,
            "redis_usec_per_request": evalsha["usec"] / requests,
            "wall_usec_per_request": 1e6 * wall / requests,
            "ping_redis_usec": ping["usec"] / requests,
            "ping_wall_usec": 1e6 * ping_wall / requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--exits", default="2,20,200")
    opts = parser.parse_args()
    with workdir("fleet-bench-proxies-") as root, Redis(root) as redis:
        generate_site(root / "www", opts.pages, 5, seed=7)
        env = worker_env(root)
        proxies = [start_tinyproxy(root / "proxies", egress) for egress in
                   ("127.0.0.2", "127.0.0.3")]
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "proxied": []}
        try:
            with Site(root / "www", root / "site.jsonl") as site:
                for rnd in range(opts.rounds):
                    order = ("direct", "proxied") if rnd % 2 == 0 else ("proxied", "direct")
                    for kind in order:
                        urls = [p.url() for p in proxies] if kind == "proxied" else []
                        run = crawl_once(root, redis, site.url + "site/", urls,
                                         f"{kind}-{rnd}", env)
                        runs[kind].append(run)
                        print(f"round {rnd} {kind:<8} {run['items']} pages "
                              f"{run['pages_per_s']:.0f}/s  EVALSHA/page "
                              f"{run['evalsha_per_page']:.3f} ({run['evalsha_usec_per_page']:.1f}"
                              f" µs)  frontier {run['frontier_calls_per_page']:.3f}  proxy "
                              f"{run['proxy_calls_per_page']:.3f}", flush=True)
        finally:
            for p in proxies:
                p.kill()
        alone = [asyncio.run(script_alone(redis.url, opts.requests, int(n)))
                 for n in opts.exits.split(",")]

    def med(kind: str, key: str) -> float:
        return median([r[key] for r in runs[kind]])

    figures = {
        "machine": machine(),
        "pages": opts.pages, "rounds": opts.rounds,
        "direct": {k: med("direct", k) for k in runs["direct"][0]},
        "proxied": {k: med("proxied", k) for k in runs["proxied"][0]},
        "proxy_evalsha_per_page": med("proxied", "evalsha_per_page")
        - med("direct", "evalsha_per_page"),
        "proxy_usec_per_page": med("proxied", "evalsha_usec_per_page")
        - med("direct", "evalsha_usec_per_page"),
        "usec_ratio_proxied_over_direct": med("proxied", "evalsha_usec_per_page")
        / med("direct", "evalsha_usec_per_page"),
        "pages_per_s_ratio": med("proxied", "pages_per_s") / med("direct", "pages_per_s"),
        "script_alone": alone,
    }
    print(f"per page, proxy pool: {figures['proxy_evalsha_per_page']:.3f} EVALSHA, "
          f"{figures['proxy_usec_per_page']:.1f} µs of Redis time (frontier alone: "
          f"{figures['direct']['evalsha_per_page']:.3f} EVALSHA, "
          f"{figures['direct']['evalsha_usec_per_page']:.1f} µs); pages/s ratio "
          f"{figures['pages_per_s_ratio']:.2f}")
    for a in alone:
        print(f"script alone ({a['exits']} exits, 20 sites): {a['calls_per_request']:.3f} "
              f"calls and {a['redis_usec_per_request']:.1f} µs of Redis time per request, "
              f"{a['wall_usec_per_request']:.0f} µs wall (a PING: {a['ping_wall_usec']:.0f} µs "
              "wall)")
    emit_json(figures)


if __name__ == "__main__":
    main()
