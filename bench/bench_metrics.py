"""``/metrics`` of ``scrapy fleet monitor`` with a frontier of 100,000 hosts.

A fresh redis-server gets ``--hosts`` distinct hosts (one URL each, ``http://hN.example/``,
pushed with ``push.push_lines`` as ``scrapy fleet push`` does); the monitor's HTTP server runs
in this process (``server.make_server``, the same code ``scrapy fleet monitor`` serves) and
the bench GETs ``/metrics`` ``--number`` times over HTTP.  Reported: the median and p95 time
of a scrape, the series in it (parsed with prometheus_client.parser), the same with
``--host-metrics 50``; the cost split into ``read_snapshot`` (the data side's reader) and
turning a snapshot into text (``metrics.families`` + ``generate_latest``); the Redis commands
one snapshot runs (``INFO commandstats`` delta / scrapes: calls and server µs per command);
``/api/series`` as the dashboard asks for it.  The baseline is the same run on a frontier of
``--baseline-hosts`` hosts (10): ratio = big / baseline.

Usage: ``.venv/bin/python bench/bench_metrics.py [--hosts 100000] [--number 50]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

import _harness as h
import redis
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scrapy_fleet.commands import push
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.monitoring import metrics, server
from scrapy_fleet.monitoring.snapshot import read_snapshot
from scrapy_fleet.monitoring.source import VIEW_SERIES, FleetSource

CRAWL = "bench"


def fill(url: str, hosts: int) -> float:
    admin = FrontierAdmin(url, CRAWL, params=FrontierParams(queue_max=None))
    started = time.perf_counter()
    report = push.push_lines(admin, ((n, f"http://h{n}.example/") for n in range(hosts)),
                             push.default_fingerprinter(), batch=2000)
    admin.close()
    assert report.pushed == hosts, report
    return time.perf_counter() - started


def timed_get(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    return time.perf_counter() - started, body


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95 + 0.5) - 1)]


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    info = client.info("commandstats")
    return {name[len("cmdstat_"):]: (int(v["calls"]), int(v["usec"]))
            for name, v in info.items()}


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds redis-server used so far (user + sys, main thread and children)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(url: str, hosts: int, number: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    keys = FrontierAdmin(url, CRAWL).keys
    source = FleetSource(client, keys, hosts=50)
    out: dict[str, Any] = {"hosts": hosts}
    for host_metrics in (0, 50):
        state = server.MonitorState(source, CRAWL, host_metrics=host_metrics)
        httpd = server.make_server(state, "127.0.0.1", 0)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        timed_get(base + "/metrics")  # warm-up: connections, scripts
        before = commandstats(client)
        cpu0, rcpu0 = time.process_time(), redis_cpu(client)
        times, body = [], b""
        for _ in range(number):
            t, body = timed_get(base + "/metrics")
            times.append(t)
        cpu1, rcpu1 = time.process_time(), redis_cpu(client)
        after = commandstats(client)
        series = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
        tag = "" if host_metrics == 0 else f"_host_metrics_{host_metrics}"
        out[f"metrics_ms_median{tag}"] = round(statistics.median(times) * 1000, 2)
        out[f"metrics_ms_p95{tag}"] = round(p95(times) * 1000, 2)
        out[f"series{tag}"] = series
        # CPU per scrape: this process (HTTP client + server threads + read_snapshot +
        # exposition) and redis-server; robust to other load on the machine, unlike wall time
        out[f"cpu_ms_per_scrape{tag}"] = round((cpu1 - cpu0) / number * 1000, 2)
        out[f"redis_cpu_ms_per_scrape{tag}"] = round((rcpu1 - rcpu0) / number * 1000, 3)
        out[f"bytes{tag}"] = len(body)
        if host_metrics == 0:
            per = {}
            for name, (calls, usec) in after.items():
                c0, u0 = before.get(name, (0, 0))
                if calls - c0 > 0 and name != "info":
                    per[name] = {"calls": round((calls - c0) / number, 2),
                                 "server_us": round((usec - u0) / number, 1)}
            out["redis_per_scrape"] = dict(sorted(per.items(),
                                                  key=lambda kv: -kv[1]["server_us"]))
            names = ",".join(VIEW_SERIES)
            series_times = [timed_get(f"{base}/api/series?name={names}&tier=10s")[0]
                            for _ in range(max(5, number // 5))]
            out["api_series_ms_median"] = round(statistics.median(series_times) * 1000, 2)
            snap_times = [timed_get(base + "/api/snapshot")[0] for _ in range(max(5, number // 5))]
            out["api_snapshot_ms_median"] = round(statistics.median(snap_times) * 1000, 2)
        httpd.shutdown()
        httpd.server_close()
    # the split: the data side's reader vs the exposition
    reads, renders, read_cpu, render_cpu = [], [], [], []
    for _ in range(number):
        t0, c0 = time.perf_counter(), time.process_time()
        snap = read_snapshot(client, keys, hosts=50)
        t1, c1 = time.perf_counter(), time.process_time()
        reg = metrics.registry(_Fixed(snap))
        generate_latest(reg)
        renders.append(time.perf_counter() - t1)
        render_cpu.append(time.process_time() - c1)
        reads.append(t1 - t0)
        read_cpu.append(c1 - c0)
    out["read_snapshot_ms_median"] = round(statistics.median(reads) * 1000, 2)
    out["read_snapshot_cpu_ms_median"] = round(statistics.median(read_cpu) * 1000, 2)
    out["exposition_ms_median"] = round(statistics.median(renders) * 1000, 3)
    out["exposition_cpu_ms_median"] = round(statistics.median(render_cpu) * 1000, 3)
    client.close()
    return out


class _Fixed:
    def __init__(self, snap: dict[str, Any]) -> None:
        self.snap = snap

    def snapshot(self) -> dict[str, Any]:
        return self.snap

    def series(self, names: Any, tier: str = "10s", since_s: Any = None) -> dict[str, Any]:
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=100_000)
    parser.add_argument("--baseline-hosts", type=int, default=10)
    parser.add_argument("--number", type=int, default=50, help="scrapes timed per run")
    opts = parser.parse_args(argv)
    fig: dict[str, Any] = {"machine": h.machine()}
    for label, hosts in (("baseline", opts.baseline_hosts), ("big", opts.hosts)):
        with h.workdir() as root, h.Redis(root) as redis_server:
            fill_s = fill(redis_server.url, hosts)
            client = redis_server.client()
            used = client.info("memory")["used_memory"]
            client.close()
            result = measure(redis_server.url, hosts, opts.number)
            result["fill_seconds"] = round(fill_s, 1)
            result["redis_used_memory_bytes"] = used
            fig[label] = result
        print(f"{label}: {hosts} hosts: /metrics median {result['metrics_ms_median']} ms, "
              f"p95 {result['metrics_ms_p95']} ms, CPU {result['cpu_ms_per_scrape']} ms + "
              f"redis-server {result['redis_cpu_ms_per_scrape']} ms per scrape, "
              f"{result['series']} series "
              f"({result['series_host_metrics_50']} with --host-metrics 50); read_snapshot "
              f"{result['read_snapshot_ms_median']} ms (CPU {result['read_snapshot_cpu_ms_median']}"
              f" ms), exposition {result['exposition_ms_median']} ms (CPU "
              f"{result['exposition_cpu_ms_median']} ms); /api/series (9 series) "
              f"{result['api_series_ms_median']} ms, /api/snapshot "
              f"{result['api_snapshot_ms_median']} ms", flush=True)
        for name, row in list(result["redis_per_scrape"].items())[:8]:
            print(f"    {name:<16} {row['calls']:>6} calls/scrape {row['server_us']:>9} µs")
    fig["ratio_metrics_big_over_baseline"] = round(
        fig["big"]["metrics_ms_median"] / fig["baseline"]["metrics_ms_median"], 2)
    fig["ratio_cpu_big_over_baseline"] = round(
        fig["big"]["cpu_ms_per_scrape"] / fig["baseline"]["cpu_ms_per_scrape"], 2)
    print(f"ratio /metrics time {opts.hosts} hosts / {opts.baseline_hosts} hosts: "
          f"{fig['ratio_metrics_big_over_baseline']} (CPU: "
          f"{fig['ratio_cpu_big_over_baseline']}); load average at the end "
          f"{os.getloadavg()[0]:.1f}")
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
