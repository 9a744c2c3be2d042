"""A crawl with one worker SIGKILLed mid-crawl vs plain Scrapy, on the real docs.python.org
mirror (issue 30: recovery in seconds).

Both sides run the example project's ``docs`` parse code against ``../shared/sites/
docs.python.org`` (start ``/3/``: 516 URLs answer 200, its 515 HTML files with ``index.html``
also as ``/3/``) served by ``python -m testsite`` on 127.0.0.1:

* plain: ``scrapy runspider bench/plain_docs.py -a start=URL`` with ``ADDONS={}``, Scrapy's
  in-memory scheduler and ``RFPDupeFilter``;
* fleet: ``scrapy fleet push docs URL``, then 3 ``scrapy crawl docs`` workers with the
  default settings (``FLEET_IDLE_TIMEOUT=1`` so they close); worker ``w0`` is SIGKILLed
  ``--kill-after`` seconds (default 3) after the crawl's first page was fetched;
* nokill: the same fleet, no kill (what the kill costs).

Both write items with the fleet's JsonLinesPipeline (``FLEET_JSONL_PATH``).  Figures, per
side: *crawl* seconds = the site's access log, first request to last request of that run
(start-up, imports and the fleet's idle wait at the end excluded on both sides); *wall* =
first process started to last process ended.  The ratio is fleet / plain of the crawl
times (target <= 1.5).  Kill to re-fetch: the killed worker's leases (its ``held`` index in
Redis, read right after the kill: what it had in flight or prefetched) and the first request
for one of their paths after the kill in the site's log.  Every page must be itemised by
the fleet (checked).

Usage: ``.venv/bin/python bench/bench_recovery.py [--rounds 1] [--kill-after 3]
[--site DIR]`` (default: ``$FLEET_PYDOCS_DIR`` or ``../shared/sites/docs.python.org``); the
last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
import msgpack

from scrapy_fleet.keys.crawl import CrawlKeys

PIPELINE = {"scrapy_fleet.pipelines.jsonlines.JsonLinesPipeline": 800}
#: as the tests find it (tests/support.py PYDOCS_DIR): FLEET_PYDOCS_DIR, else ../shared/sites/
DEFAULT_SITE = Path(os.environ.get("FLEET_PYDOCS_DIR")
                    or h.REPO_ROOT.parent / "shared" / "sites" / "docs.python.org")
WORKERS = 3


def pages_of(site: h.Site, since: float) -> list[dict[str, Any]]:
    return [r for r in site.records() if r["t"] >= since]


def run_plain(root: Path, env: dict[str, str], site: h.Site, start: str,
              n: int) -> dict[str, Any]:
    out, log = root / f"plain-{n}.jsonl", root / f"plain-{n}.log"
    settings = {"ADDONS": {}, "SCHEDULER": "scrapy.core.scheduler.Scheduler",
                "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
                "ITEM_PIPELINES": PIPELINE, "FLEET_JSONL_PATH": out}
    t0 = time.time()
    proc = h.scrapy(["runspider", str(h.BENCH_DIR / "plain_docs.py"), "-a", f"start={start}",
                     *h.setting_args(settings)], env, log)
    if h.wait(proc, 300, log) != 0:
        raise RuntimeError(f"plain run failed:\n{log.read_text()[-3000:]}")
    wall = time.time() - t0
    reqs = pages_of(site, t0)
    items = len({json.loads(line)["url"] for line in out.read_text().splitlines()
                 if line.strip()})
    return {"mode": "plain", "wall": wall, "crawl": reqs[-1]["t"] - reqs[0]["t"],
            "requests": len(reqs), "items": items}


def held_paths(client: Any, keys: CrawlKeys, worker: str, base: str) -> set[str]:
    """Paths of the leases *worker* holds (its ``held`` index)."""
    members = client.zrangebylex(keys.held, f"[{worker}\t", f"[{worker}\t\xff")
    ids = [m.split(b"\t", 1)[1] for m in members]
    paths = set()
    for payload in client.hmget(keys.data, ids) if ids else []:
        if payload:
            paths.add(msgpack.unpackb(payload[1:], raw=False)["u"][len(base):])
    return paths


def run_fleet(root: Path, env: dict[str, str], redis: h.Redis, site: h.Site, start: str,
              n: int, kill_after: float | None) -> dict[str, Any]:
    """One fleet run of WORKERS workers; ``w0`` SIGKILLed *kill_after* s after the first
    request (None: no kill)."""
    client = redis.client()
    client.flushall()
    push = h.scrapy_run(["fleet", "push", "docs", start, "-s", f"FLEET_REDIS_URL={redis.url}"],
                        env)
    if push.returncode != 0:
        raise RuntimeError(f"push failed: {push.stdout}{push.stderr}")
    tag = "fleet" if kill_after is not None else "nokill"
    outs = [root / f"{tag}-{n}-{k}.jsonl" for k in range(WORKERS)]
    logs = [root / f"{tag}-{n}-{k}.log" for k in range(WORKERS)]
    t0 = time.time()
    procs = [h.scrapy(["crawl", "docs", *h.setting_args({
        "FLEET_REDIS_URL": redis.url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": outs[k],
        "ITEM_PIPELINES": PIPELINE, "FLEET_WORKER_ID": f"w{k}"})], env, logs[k])
        for k in range(WORKERS)]
    keys = CrawlKeys("fleet", "docs")
    first = None
    while kill_after is not None and (first is None or time.time() < first + kill_after):
        reqs = pages_of(site, t0)
        first = first or (reqs[0]["t"] if reqs else None)
        if time.time() - t0 > 120:
            raise RuntimeError("the fleet did not start crawling")
        time.sleep(0.02)
    killed_at, victim = time.time(), set()
    if kill_after is not None:
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        victim = held_paths(client, keys, "w0", site.url.rstrip("/"))
    for k in range(1 if kill_after is not None else 0, WORKERS):
        if h.wait(procs[k], 300, logs[k]) != 0:
            raise RuntimeError(f"worker {k} failed:\n{logs[k].read_text()[-3000:]}")
    wall = time.time() - t0
    reqs = pages_of(site, t0)
    refetch = [r["t"] for r in reqs if r["t"] > killed_at and r["path"] in victim]
    urls = {json.loads(line)["url"] for out in outs if out.exists()
            for line in out.read_text().splitlines() if line.strip()}
    stats = client.hgetall(keys.stats)
    return {"mode": tag, "wall": wall, "crawl": reqs[-1]["t"] - reqs[0]["t"],
            "requests": len(reqs), "items": len(urls), "victim_leases": len(victim),
            "kill_at": killed_at - reqs[0]["t"],
            "kill_to_refetch": (min(refetch) - killed_at) if refetch else None,
            "recovered": int(stats.get(b"recovered", 0))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--kill-after", type=float, default=3.0)
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE)
    args = parser.parse_args(argv)
    if not (args.site / "3" / "index.html").is_file():
        print(f"no docs.python.org mirror at {args.site}", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    with h.workdir() as root, h.Redis(root) as redis, \
            h.Site(args.site, root / "site.log") as site:
        env = h.worker_env(root)
        start = site.url + "3/"
        for n in range(args.rounds):  # alternate the order
            modes = ("plain", "fleet", "nokill")
            for mode in modes if n % 2 == 0 else modes[::-1]:
                runs.append(run_plain(root, env, site, start, n) if mode == "plain" else
                            run_fleet(root, env, redis, site, start, n,
                                      args.kill_after if mode == "fleet" else None))
                print(runs[-1], flush=True)
    plain = [r for r in runs if r["mode"] == "plain"]
    fleet = [r for r in runs if r["mode"] == "fleet"]
    nokill = [r for r in runs if r["mode"] == "nokill"]
    figures = {
        **h.machine(), "rounds": args.rounds, "workers": WORKERS, "kill_after": args.kill_after,
        "plain_crawl_s": h.median([r["crawl"] for r in plain]),
        "fleet_crawl_s": h.median([r["crawl"] for r in fleet]),
        "plain_wall_s": h.median([r["wall"] for r in plain]),
        "fleet_wall_s": h.median([r["wall"] for r in fleet]),
        "nokill_crawl_s": h.median([r["crawl"] for r in nokill]),
        "kill_to_refetch_s": h.median([r["kill_to_refetch"] for r in fleet
                                       if r["kill_to_refetch"] is not None] or [float("nan")]),
        "items_plain": plain[0]["items"], "items_fleet": [r["items"] for r in fleet],
        "victim_leases": [r["victim_leases"] for r in fleet],
    }
    figures["ratio_crawl"] = figures["fleet_crawl_s"] / figures["plain_crawl_s"]
    figures["ratio_wall"] = figures["fleet_wall_s"] / figures["plain_wall_s"]
    print(f"plain {figures['plain_crawl_s']:.1f} s, fleet with one SIGKILL "
          f"{figures['fleet_crawl_s']:.1f} s: {figures['ratio_crawl']:.2f}x "
          f"(wall {figures['ratio_wall']:.2f}x; the same fleet without a kill "
          f"{figures['nokill_crawl_s']:.1f} s); kill to first re-fetch "
          f"{figures['kill_to_refetch_s']:.1f} s")
    h.emit_json(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
