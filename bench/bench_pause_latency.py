"""How long ``pause`` waits for the workers' confirmation (issue 34: <= 2 s), with the rule
before this branch (every worker that called in the last 15 s reports the new control
generation) and now (only those that also hold a lease), measured side by side in one run.

One redis-server and a local site whose pages answer after --delay s; two ``docs`` workers
(FLEET_IDLE_TIMEOUT None) in each of two cases:

* ``idle``: the crawl's one page fetched, the workers hold nothing and only poll;
* ``busy``: many slow pages, FLEET_PREFETCH=2 and CONCURRENT_REQUESTS=2: each worker's
  prefetch full, its downloads in flight (its calls come with its downloads' ends and its
  heartbeat).

Per round the pause is written (commands/control.py ``write``) and both rules are polled
every 10 ms until they hold; then the crawl is resumed.  Prints each case's median and
maximum seconds per rule, then one JSON line.

    .venv/bin/python bench/bench_pause_latency.py [--rounds 6] [--delay 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import _harness as h

from scrapy_fleet.commands import control
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site


def old_rule(admin: FrontierAdmin, gen: int) -> list[str]:
    """The workers the command waited for before: live and not holding *gen*."""
    now = admin.server_ms()
    live = {w.decode() for w in admin.client.zrangebyscore(admin.keys.workers,
                                                           now - control.LIVE_MS, "+inf")}
    seen = {w.decode(): int(g) for w, g in admin.client.hgetall(admin.keys.ctlseen).items()}
    return sorted(w for w in live if seen.get(w, 0) < gen)


def measure(admin: FrontierAdmin, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"before": [], "now": []}
    for _ in range(rounds):
        gen = control.write(admin, 1, "pause", [], 0, "bench")
        t0 = time.monotonic()
        done: dict[str, float] = {}
        while len(done) < 2 and time.monotonic() - t0 < 30:
            if "now" not in done and not control.unconfirmed(admin, 1, gen):
                done["now"] = time.monotonic() - t0
            if "before" not in done and not old_rule(admin, gen):
                done["before"] = time.monotonic() - t0
            time.sleep(0.01)
        for k in out:
            out[k].append(round(done.get(k, 30.0), 3))
        control.write(admin, 1, "resume", [], 0, "")
        time.sleep(1.0)
    return out


def run_case(root: Any, name: str, pages: int, settings: dict[str, Any],
             rounds: int, delay: float) -> dict[str, list[float]]:
    site_dir = root / f"site-{name}"
    generate_site(site_dir, max(pages, 2), 2, seed=2)
    with h.Redis(root / f"redis-{name}") as server, h.Site(
            site_dir, root / f"site-{name}.jsonl") as site:
        env = h.worker_env(root)
        urls = "".join(f"{site.url}site/p/{i}.html\n" for i in range(pages))
        (root / f"u-{name}.txt").write_text(urls)
        pushed = h.scrapy_run(["fleet", "push", "docs", "-f", str(root / f"u-{name}.txt"),
                               "-s", f"FLEET_REDIS_URL={server.url}"], env)
        assert pushed.returncode == 0, pushed.stderr
        if delay:
            import json
            import urllib.request
            body = json.dumps({"delays": [{"prefix": "/site/p/", "seconds": delay}]})
            urllib.request.urlopen(urllib.request.Request(
                f"{site.url}_testsite/config", body.encode(), method="PUT"))
        workers = [h.scrapy(["crawl", "docs", *h.setting_args({
            "FLEET_REDIS_URL": server.url, "FLEET_IDLE_TIMEOUT": "None", **settings})],
            env, root / f"w-{name}-{i}.log") for i in range(2)]
        try:
            admin = FrontierAdmin(server.url, "docs")
            deadline = time.monotonic() + 60
            while admin.client.zcard(admin.keys.workers) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(4.0)  # (idle: the page done; busy: prefetch and downloads full)
            return measure(admin, rounds)
        finally:
            for w in workers:
                h.stop(w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--delay", type=float, default=3.0)
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": h.machine(), "rounds": args.rounds}
    with h.workdir() as root:
        figures["idle"] = run_case(root, "idle", 1, {}, args.rounds, 0.0)
        figures["busy"] = run_case(root, "busy", 400, {"FLEET_PREFETCH": 2,
                                                       "CONCURRENT_REQUESTS": 2},
                                   args.rounds, args.delay)
    for case in ("idle", "busy"):
        for rule in ("before", "now"):
            v = figures[case][rule]
            print(f"{case:<5} {rule:<6} median {statistics.median(v):6.3f} s  max "
                  f"{max(v):6.3f} s  ({h.fmt_list(v, 2)})")
    h.emit_json(figures)


if __name__ == "__main__":
    main()
