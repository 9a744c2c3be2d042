"""``scrapy fleet host drop`` of a large host (issue 34: 100,000 queued entries in <= 3 s with
no Redis command over 10 ms by SLOWLOG).

Pushes --entries URLs of one host and 10,000 of 10 others (``push_lines``, the push command's
code), then drops the big host with ``commands/host.py`` ``drop`` (deleted, then, after a
fresh push, into the dead letters), with SLOWLOG logging every command; reports the drop's
wall time, its calls, the slowest command SLOWLOG saw during it, and the cost per entry beside
the baseline measured in the same run: one UNLINK of the same host's bucket (which keeps no
count exact).

    .venv/bin/python bench/bench_host_drop.py            # ~1 min
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import _harness as h
import redis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()

    from scrapy_fleet.commands import host as host_command
    from scrapy_fleet.commands.push import default_fingerprinter, push_lines
    from scrapy_fleet.frontier.admin import FrontierAdmin

    fp = default_fingerprinter()
    figures: dict[str, Any] = {"machine": h.machine(), "entries": args.entries}
    with h.workdir() as root, h.Redis(root) as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("slowlog-max-len", 100000)

        def fill(crawl: str) -> FrontierAdmin:
            admin = FrontierAdmin(server.url, crawl)
            lines = [f"http://big.example.org/p/{i}" for i in range(args.entries)]
            lines += [f"http://o{i % 10}.example.org/p/{i}" for i in range(10_000)]
            report = push_lines(admin, enumerate(lines, 1), fp)
            assert report.pushed == len(lines), report
            return admin

        for mode in ("delete", "dead_letter"):
            admin = fill(f"drop-{mode}")
            calls: list[float] = []
            client.config_set("slowlog-log-slower-than", 0)
            client.slowlog_reset()
            t0 = time.perf_counter()
            n = host_command.drop(client, admin.keys, "big.example.org", mode == "dead_letter",
                                  lambda removed, left, s, into=calls: into.append(s))
            wall = time.perf_counter() - t0
            slow = client.slowlog_get(100000)
            client.config_set("slowlog-log-slower-than", 10000)
            assert n == args.entries, n
            status = admin.status()
            assert status["queued"] == 10_000, status
            worst = max(slow, key=lambda e: e["duration"])
            scripts = sorted(e["duration"] / 1000 for e in slow
                             if e["command"].startswith(b"EVALSHA"))
            figures[mode] = {"wall_s": round(wall, 3), "calls": len(calls),
                             "slowest_call_ms": round(max(calls) * 1000, 2),
                             "slowlog_max_ms": round(worst["duration"] / 1000, 2),
                             "slowlog_script_median_ms": round(scripts[len(scripts) // 2], 2),
                             "slowlog_script_p90_ms": round(scripts[int(len(scripts) * 0.9)], 2),
                             "load_average": os.getloadavg()[0],
                             "slowlog_max_command": worst["command"][:40].decode(errors="replace"),
                             "us_per_entry": round(wall / n * 1e6, 2)}
        admin = fill("drop-baseline")
        bucket = [k for k in client.scan_iter(match=f"{admin.keys.bucket_prefix}big.*")]
        t0 = time.perf_counter()
        client.unlink(*bucket)
        base = time.perf_counter() - t0
        figures["baseline_unlink_us_per_entry"] = round(base / args.entries * 1e6, 3)
        for mode in ("delete", "dead_letter"):
            f = figures[mode]
            print(f"{mode:<12} {args.entries} entries in {f['wall_s']:.2f} s ({f['calls']} calls, "
                  f"slowest {f['slowest_call_ms']} ms as timed here; SLOWLOG max "
                  f"{f['slowlog_max_ms']} ms: {f['slowlog_max_command']!r}; the drop's "
                  f"calls: median {f['slowlog_script_median_ms']} ms, p90 "
                  f"{f['slowlog_script_p90_ms']} ms; load average {f['load_average']}); "
                  f"{f['us_per_entry']} us/entry = "
                  f"{f['us_per_entry'] / max(figures['baseline_unlink_us_per_entry'], 1e-3):.0f}"
                  " x one UNLINK's")
    h.emit_json(figures)


if __name__ == "__main__":
    main()
