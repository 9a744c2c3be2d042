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
total (not the start key's cost).  The start key's own cost is the time of lua/startkey.lua's
EVALSHA calls, told apart from the other scripts a worker runs by EVALSHA (beat.lua every
FLEET_WORKER_DEAD_AFTER / 5 from each worker, politeness.lua...) by the SLOWLOG (every
command logged: ``slowlog-log-slower-than 0``, the script named by its SHA); before session
13 this bench counted every EVALSHA as the start key's.  Prints the per-page figures, the
ratio startkey.lua / push crawl's total, the other EVALSHA scripts' calls, and one JSON line.

    .venv/bin/python bench/bench_scrapy_redis_start.py [--pages 1500]   # ~2 min
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import _harness as h
import redis

from scrapy_fleet import lua
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


#: the scripts a worker may run by EVALSHA, by name (their SHA as lua.load computes it)
EVALSHA_SCRIPTS = ("startkey.lua", "beat.lua", "politeness.lua", "seeding.lua",
                   "bloom_add.lua", "sample.lua", "cookies_read.lua", "cookies_merge.lua",
                   "acl_probe.lua")


def by_script(client: Any) -> dict[str, tuple[int, int]]:
    """script name (or SHA) -> (EVALSHA calls, usec) from the whole SLOWLOG."""
    names = {lua.load(client, name).sha: name for name in EVALSHA_SCRIPTS}
    out: dict[str, tuple[int, int]] = {}
    for entry in client.slowlog_get(-1):
        words = entry["command"].split(b" ")
        if words[0].lower() != b"evalsha" or len(words) < 2:
            continue
        name = names.get(words[1].decode(), words[1].decode())
        calls, usec_ = out.get(name, (0, 0))
        out[name] = (calls + 1, usec_ + int(entry["duration"]))
    return out


def crawl(root: Path, name: str, url: str, spider_args: list[str], cwd: Path,
          pages: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 2_000_000)
    client.slowlog_reset()
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
    out: dict[str, Any] = dict(usec(client))
    scripts = by_script(client)
    client.config_set("slowlog-log-slower-than", 10000)
    client.slowlog_reset()
    return out | {"_scripts": scripts}


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
    keyed.pop("_evalsha_calls")
    base.pop("_evalsha_calls")
    scripts, base_scripts = keyed.pop("_scripts"), base.pop("_scripts")
    base_total = sum(base.values()) / n
    keyed_total = (sum(keyed.values()) - keyed.get("rpush", 0)) / n
    calls, script_usec = scripts.get("startkey.lua", (0, 0))
    feeder = script_usec / n
    print(f"pages: {n} per crawl, 2 workers each")
    print(f"push crawl:      {base_total:7.2f} us of Redis per page")
    print(f"start-key crawl: {keyed_total:7.2f} us of Redis per page (RedisPipeline's RPUSH "
          f"left out)")
    print(f"  of which lua/startkey.lua (EVALSHA): {feeder:6.2f} us per page = "
          f"{feeder / base_total:.1%} of the push crawl's ({calls} calls, "
          f"{script_usec / max(calls, 1):.1f} us each)")
    print("  other EVALSHA scripts (calls, us): start-key crawl "
          + ", ".join(f"{k} {v}" for k, v in sorted(scripts.items()) if k != "startkey.lua")
          + "; push crawl " + ", ".join(f"{k} {v}" for k, v in sorted(base_scripts.items())))
    h.emit_json({"pages": n, "push_us_per_page": round(base_total, 2),
                 "startkey_crawl_us_per_page": round(keyed_total, 2),
                 "startkey_script_us_per_page": round(feeder, 2), "startkey_calls": calls,
                 "startkey_over_push": round(feeder / base_total, 4),
                 "evalsha_scripts": {k: list(v) for k, v in scripts.items()},
                 **h.machine()})


if __name__ == "__main__":
    main()
