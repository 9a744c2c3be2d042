"""Fetch/parse stages (FLEET_ROLE) against "all" workers, same number of processes.

Scenarios, each on a generated site (``--pages`` pages, 4 links each) crawled by the
``staged`` spider of tests/project (its callback burns ``--burn`` ms of processor time per
page), in one run, one after the other, each with a fresh redis-server:

* ``cpu``: the site answers at once;
* ``slow``: every page is held ``--delay`` s by the site (a slow site), same callback.

For each: ``all``: N workers with FLEET_ROLE=all; ``split``: F fetch workers and N - F parse
workers.  Reported: pages/s (items over the crawl's wall time, from the first worker's start
to the last one's exit), and the ratio split/all.

Then ``memory``: Redis memory per stored response: one fetch worker stores ``--store``
pages of the site with no parse worker (FLEET_RESPONSE_QUEUE_MAX above that), and the
``used_memory`` delta is divided by the stored responses, beside the bytes of the pages.

Usage: ``.venv/bin/python bench/bench_stages.py [--pages 300] [--burn 20] [--delay 0.2]
[--workers 3] [--fetchers 1] [--store 200]``
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import _harness as h

from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

TEST_PROJECT = h.REPO_ROOT / "tests" / "project"
KEYS = CrawlKeys("fleet", "staged")


def crawl(root: Path, site: h.Site, roles: list[str], burn: int) -> dict[str, Any]:
    with h.Redis(root / f"redis-{'-'.join(roles)}") as redis:
        env = h.worker_env(root)
        h.scrapy_run(["fleet", "push", "staged", site.url + "site/",
                      "-s", f"FLEET_REDIS_URL={redis.url}"], env, cwd=TEST_PROJECT)
        outs, procs = [], []
        start = time.monotonic()
        for n, role in enumerate(roles):
            out = root / f"out-{role}-{n}-{time.monotonic_ns()}.jsonl"
            outs.append(out)
            settings = {"FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 3,
                        "FLEET_JSONL_PATH": out, "FLEET_ROLE": role,
                        "CONCURRENT_REQUESTS_PER_DOMAIN": 32, "CONCURRENT_REQUESTS": 32}
            procs.append(h.scrapy(["crawl", "staged", "-a", f"burn={burn}",
                                   *h.setting_args(settings)], env,
                                  root / f"worker-{n}.log", cwd=TEST_PROJECT))
        for proc in procs:
            h.wait(proc, 900)
        # the idle timeout is the same for both: count it out of the wall time
        wall = time.monotonic() - start - 3
        items = sum(len(out.read_text().splitlines()) for out in outs if out.exists())
    return {"items": items, "seconds": round(wall, 2), "pages_per_s": round(items / wall, 1)}


def memory(root: Path, site: h.Site, paths: list[str], store: int) -> dict[str, Any]:
    with h.Redis(root / "redis-memory") as redis:
        client = redis.client()
        env = h.worker_env(root)
        urls = root / "urls.txt"
        urls.write_text("".join(site.url.rstrip("/") + p + "\n" for p in paths[:store]))
        h.scrapy_run(["fleet", "push", "staged", "-f", str(urls),
                      "-s", f"FLEET_REDIS_URL={redis.url}"], env, cwd=TEST_PROJECT)
        queued = int(client.info("memory")["used_memory"])
        settings = {"FLEET_REDIS_URL": redis.url, "FLEET_ROLE": "fetch",
                    "FLEET_RESPONSE_QUEUE_MAX": store + 10, "FLEET_IDLE_TIMEOUT": 60}
        proc = h.scrapy(["crawl", "staged", *h.setting_args(settings)], env,
                        root / "fetch.log", cwd=TEST_PROJECT)
        deadline = time.monotonic() + 300
        stored = 0
        while time.monotonic() < deadline:
            stored = int(client.hget(KEYS.hostq, "~parse") or 0)
            if stored >= len(paths[:store]):
                break
            time.sleep(0.2)
        time.sleep(1)
        h.stop(proc)
        used = int(client.info("memory")["used_memory"])
        stored_bytes = int(client.hget(KEYS.stats, "response_queue_bytes") or 0)
    page_bytes = sum((site.root / p.lstrip("/")).stat().st_size if not p.endswith("/")
                     else (site.root / p.lstrip("/") / "index.html").stat().st_size
                     for p in paths[:store])
    return {"stored": stored, "used_memory_per_stored": round((used - queued) / max(stored, 1)),
            "payload_per_stored": round(stored_bytes / max(stored, 1)),
            "page_bytes_per_page": round(page_bytes / max(stored, 1))}


def configure(site: h.Site, behaviour: dict[str, Any]) -> None:
    """PUT the site server's behaviour (delays; testsite.server)."""
    request = urllib.request.Request(site.url + "_testsite/config", method="PUT",
                                     data=json.dumps(behaviour).encode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--burn", type=int, default=20)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--fetchers", type=int, default=1)
    parser.add_argument("--store", type=int, default=200)
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": h.machine(), "args": vars(args)}
    with h.workdir() as root:
        paths = generate_site(root / "www", args.pages, 4, seed=7)
        split = ["fetch"] * args.fetchers + ["parse"] * (args.workers - args.fetchers)
        for scenario, behaviour in (("cpu", None),
                                    ("slow", {"delays": [{"prefix": "/site/",
                                                          "seconds": args.delay}]})):
            with h.Site(root / "www", root / f"site-{scenario}.log") as site:
                if behaviour:
                    configure(site, behaviour)
                res_all = crawl(root, site, ["all"] * args.workers, args.burn)
                res_split = crawl(root, site, split, args.burn)
            ratio = round(res_split["pages_per_s"] / res_all["pages_per_s"], 2)
            figures[scenario] = {"all": res_all, "split": res_split, "split_over_all": ratio}
            print(f"{scenario}: all {res_all['pages_per_s']} pages/s, split "
                  f"({args.fetchers} fetch + {args.workers - args.fetchers} parse) "
                  f"{res_split['pages_per_s']} pages/s: {ratio}x")
        with h.Site(root / "www", root / "site-memory.log") as site:
            figures["memory"] = mem = memory(root, site, paths, args.store)
        print(f"memory: {mem['used_memory_per_stored']} B of Redis memory per stored response "
              f"({mem['payload_per_stored']} B payload, pages of {mem['page_bytes_per_page']} B)")
    h.emit_json(figures)


if __name__ == "__main__":
    main()
