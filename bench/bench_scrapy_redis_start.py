"""Redis time per page of a scrapy-redis spider fed from its start key (issue 36,
compat/feeder.py), beside the same pages pushed with the push helper.

Two crawls of --pages one-page entries (``/site/p/<i>.html``, no link followed), 2 workers
each, FLEET_IDLE_TIMEOUT=2, on one private redis-server:

* **push**: ``scrapy-fleet push`` of the URLs, then 2 workers of bench/drain_spider.py (a plain
  spider, one item per page) in example_project;
* **start key**: the URLs LPUSHed into ``myspider:start_urls``, then 2 workers of
  ``myspider_redis`` (scrapy-redis's RedisSpider) in tests/scrapyredis_project.

Redis time is ``INFO commandstats`` (``usec`` summed over every command but FUNCTION LOAD and
SCRIPT LOAD, which happen once; ``CONFIG RESETSTAT`` before the workers start), per page.  The
start-key crawl also runs scrapy-redis's RedisPipeline (one RPUSH per item), left out of its
total (not the start key's cost).  The start key's own cost is the EVALSHA time of
lua/startkey.lua (the one script a RedisSpider worker calls with EVALSHA; the frontier call is
an FCALL).  Prints the per-page figures, the
ratio start-key EVALSHA / push crawl's total, and one JSON line.

    .venv/bin/python bench/bench_scrapy_redis_start.py [--pages 1500]   # ~2 min
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import _harness as h
import redis

from testsite import generate_site

SCRAPY_FLEET = Path(h.PYTHON).with_name("scrapy-fleet")
SR_PROJECT = h.REPO_ROOT / "tests" / "scrapyredis_project"


#: once per Redis or per worker, not per page (the first crawl loads the Functions library)
ONCE = ("function|load", "script|load", "config|resetstat", "info")


def usec(client: Any) -> dict[str, int]:
    """usec per command since the last CONFIG RESETSTAT, loads of code left out (and the
    EVALSHA calls, as "_evalsha_calls")."""
    stats = client.info("commandstats")
    out = {name[len("cmdstat_"):]: int(v["usec"]) for name, v in stats.items()
           if name[len("cmdstat_"):] not in ONCE}
    return out | {"_evalsha_calls": int(stats.get("cmdstat_evalsha", {}).get("calls", 0))}


def crawl(root: Path, name: str, url: str, spider_args: list[str], cwd: Path,
          pages: int) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    env = h.worker_env(root)
    settings = {"FLEET_REDIS_URL": url, "REDIS_URL": url, "FLEET_IDLE_TIMEOUT": 2,
                "LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
                "DOWNLOAD_DELAY": 0, "ROBOTSTXT_OBEY": False}
    procs = [h.scrapy([*spider_args, *h.setting_args(settings)], env,
                      root / f"{name}-{n}.log", cwd=cwd) for n in range(2)]
    for n, proc in enumerate(procs):
        if h.wait(proc, 300, root / f"{name}-{n}.log") != 0:
            raise RuntimeError((root / f"{name}-{n}.log").read_text()[-3000:])
    return usec(client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1500)
    args = parser.parse_args()
    with h.workdir() as root:
        generate_site(root / "www", args.pages, 1)  # (the spiders follow no link)
        server = h.Redis(root)
        server.start()
        try:
            with h.Site(root / "www", root / "site.jsonl") as site:
                urls = [f"{site.url}site/p/{i}.html" for i in range(args.pages)]
                (root / "urls.txt").write_text("\n".join(urls) + "\n")
                pushed = h.subprocess.run(
                    [str(SCRAPY_FLEET), "--redis", server.url, "push", "drain", "-f",
                     str(root / "urls.txt")], capture_output=True, text=True, timeout=120)
                if pushed.returncode != 0:
                    raise RuntimeError(pushed.stdout + pushed.stderr)
                base = crawl(root, "push", server.url,
                             ["runspider", str(h.BENCH_DIR / "drain_spider.py"), "-s",
                              "FLEET_CRAWL_ID=drain"], h.EXAMPLE_PROJECT, args.pages)
                redis.Redis.from_url(server.url).lpush("myspider:start_urls", *urls)
                keyed = crawl(root, "startkey", server.url,
                              ["crawl", "myspider_redis", "-a", "domain=127.0.0.1"],
                              SR_PROJECT, args.pages)
        finally:
            server.stop()
    n = args.pages
    calls = keyed.pop("_evalsha_calls")
    base.pop("_evalsha_calls")
    base_total = sum(base.values()) / n
    keyed_total = (sum(keyed.values()) - keyed.get("rpush", 0)) / n
    feeder = keyed.get("evalsha", 0) / n
    print(f"pages: {n} per crawl, 2 workers each")
    print(f"push crawl:      {base_total:7.2f} us of Redis per page")
    print(f"start-key crawl: {keyed_total:7.2f} us of Redis per page (RedisPipeline's RPUSH "
          f"left out)")
    print(f"  of which lua/startkey.lua (EVALSHA): {feeder:6.2f} us per page = "
          f"{feeder / base_total:.1%} of the push crawl's ({calls} calls, "
          f"{keyed.get('evalsha', 0) / max(calls, 1):.1f} us each)")
    h.emit_json({"pages": n, "push_us_per_page": round(base_total, 2),
                 "startkey_crawl_us_per_page": round(keyed_total, 2),
                 "startkey_script_us_per_page": round(feeder, 2), "startkey_calls": calls,
                 "startkey_over_push": round(feeder / base_total, 4), **h.machine()})


if __name__ == "__main__":
    main()
