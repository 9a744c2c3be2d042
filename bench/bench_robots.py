"""Cost of waiting on a host whose robots.txt cannot be fetched (issue 9, item 1).

Before the fix, one URL pushed on a closed port with ``ROBOTSTXT_OBEY=True`` made a worker
cycle its request through the frontier ~120 times a second forever (the issue's figures:
``acked`` 238 -> 3663 in 25 s, ``fleet/redis/roundtrips`` 7342).  Now the request waits in
the frontier until one worker tries robots.txt again.  In one run, one ``scrapy crawl docs``
worker (the example project, ``ROBOTSTXT_OBEY=True``) at a time:

* ``idle``: an empty crawl (the baseline: what an idle worker costs anyway);
* ``waiting``: one URL on a closed port, ``FLEET_ROBOTSTXT_HOLD=5``,
  ``FLEET_ROBOTSTXT_MAX_ATTEMPTS=0`` (never give up: the steady waiting state);

each measured over the same window (``--window`` s, from 3 s after the worker joined):
EVALSHA calls per second at the Redis server (``INFO commandstats``: frontier and politeness
scripts together) and the worker's CPU share.  The figure is the ratio waiting / idle.

* ``give_up``: one URL on a closed port, ``FLEET_ROBOTSTXT_HOLD=1``,
  ``FLEET_ROBOTSTXT_MAX_ATTEMPTS=3``, ``FLEET_IDLE_TIMEOUT=3``: seconds from start to the
  worker's exit (it must end by itself), and the dead letters left.

Usage: ``.venv/bin/python bench/bench_robots.py [--window 20]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import _harness as h
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def push_closed_port(redis_url: str, crawl: str) -> str:
    url = f"http://127.0.0.1:{h.free_port()}/page.html"  # nothing listens there
    FrontierAdmin(redis_url, crawl).push([(b"", 0, codec.encode(Request(url)), 0, "127.0.0.1")])
    return url


def window(redis: h.Redis, root: Path, env: dict[str, str], crawl: str,
           settings: dict[str, Any], seconds: float) -> dict[str, float]:
    log = root / f"{crawl}.log"
    proc = h.scrapy(["crawl", "docs", *h.setting_args(
        {"FLEET_REDIS_URL": redis.url, "FLEET_CRAWL_ID": crawl, "ROBOTSTXT_OBEY": True,
         **settings})], env, log)
    try:
        h.wait_for_text(log, "joined crawl", 60, proc)
        time.sleep(3)
        client = redis.client()
        c0, e0, t0 = proc_cpu(proc.pid), evalsha_calls(client), time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        return {"evalsha_per_s": round((evalsha_calls(client) - e0) / dt, 2),
                "worker_cpu": round((proc_cpu(proc.pid) - c0) / dt, 3)}
    finally:
        h.stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=20.0, help="seconds per measurement")
    args = parser.parse_args(argv)
    with h.workdir() as root, h.Redis(root) as redis:
        env = h.worker_env(root)
        idle = window(redis, root, env, "bench-idle", {}, args.window)
        push_closed_port(redis.url, "bench-wait")
        waiting = window(redis, root, env, "bench-wait",
                         {"FLEET_ROBOTSTXT_HOLD": 5, "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 0},
                         args.window)
        push_closed_port(redis.url, "bench-giveup")
        log = root / "giveup.log"
        started = time.monotonic()
        proc = h.scrapy(["crawl", "docs", *h.setting_args(
            {"FLEET_REDIS_URL": redis.url, "FLEET_CRAWL_ID": "bench-giveup",
             "ROBOTSTXT_OBEY": True, "FLEET_ROBOTSTXT_HOLD": 1,
             "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 3, "FLEET_IDLE_TIMEOUT": 3})], env, log)
        code = h.wait(proc, 120, log)
        give_up_s = time.monotonic() - started
        dead = FrontierAdmin(redis.url, "bench-giveup").status()["dead"]
    ratio = waiting["evalsha_per_s"] / idle["evalsha_per_s"] if idle["evalsha_per_s"] else None
    print(f"Redis script calls per second over {args.window:.0f} s, one worker:")
    print(f"  idle (empty crawl)          {idle['evalsha_per_s']:8.2f}/s  cpu "
          f"{idle['worker_cpu']:.3f}")
    print(f"  waiting (robots.txt down)   {waiting['evalsha_per_s']:8.2f}/s  cpu "
          f"{waiting['worker_cpu']:.3f}")
    print(f"  ratio waiting / idle        {ratio:8.2f}" if ratio else "  ratio: n/a")
    print(f"give-up (hold 1 s, 3 attempts): exit {code} after {give_up_s:.1f} s, "
          f"{dead} dead letter(s)")
    h.emit_json({**h.machine(), "window_s": args.window,
                 "idle_evalsha_per_s": idle["evalsha_per_s"],
                 "waiting_evalsha_per_s": waiting["evalsha_per_s"],
                 "idle_worker_cpu": idle["worker_cpu"],
                 "waiting_worker_cpu": waiting["worker_cpu"],
                 "waiting_over_idle": None if ratio is None else round(ratio, 2),
                 "give_up_exit": code, "give_up_s": round(give_up_s, 1), "give_up_dead": dead})
    return 0 if code == 0 and dead == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
