"""The ``top`` and ``monitor`` actions of ``scrapy fleet`` and ``scrapy-fleet``.

    top CRAWL_ID [--interval S] [--once] [--limit N]
    monitor CRAWL_ID --port P [--host H] [--interval S] [--host-metrics N]

Both read the crawl through :class:`~scrapy_fleet.monitoring.source.FleetSource`.  Exit
statuses: 0 (Ctrl-C or SIGTERM stop them cleanly), 2 usage error, Redis unreachable at start
(one line, from commands/cli.py's ping) or the monitor's address cannot be bound, 4 (``top``)
Redis holds no state of the crawl.  ``monitor`` starts anyway (it may be deployed before
its crawl begins), with one warning line; neither writes a key of a crawl without state.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from typing import Any

from scrapy_fleet.monitoring.metrics import HOST_METRICS_MAX

ACTIONS = ("top", "monitor")
EXIT_USAGE = 2
#: seconds a view waits for Redis per call: short, so that a scrape answers
#: ``scrapy_fleet_up 0`` within Prometheus's scrape timeout (10 s by default) when Redis hangs
READ_TIMEOUT = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="top, monitor: seconds between refreshes of the view / the "
                             "dashboard (default %(default)s)")
    parser.add_argument("--once", action="store_true",
                        help="top: print one frame and exit")
    parser.add_argument("--port", type=int, default=None,
                        help="monitor: TCP port to serve the dashboard and /metrics on")
    parser.add_argument("--host", action="append", default=None, metavar="H",
                        help="monitor: address to listen on (default 127.0.0.1; 0.0.0.0 "
                             "for every interface; the last one given); urls: the host whose "
                             "URLs are listed; budget: the host whose budget is set; pause, "
                             "resume: a host to pause or resume (repeatable)")
    parser.add_argument("--host-metrics", type=int, default=0, metavar="N",
                        help="monitor: also export per-host series for the top N hosts "
                             f"(default 0; at most {HOST_METRICS_MAX})")


def _sigterm_stops(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(action: str, admin: Any, opts: Any, alerts_config: Any = None,
        forget_after: float | None = None, parts: int = 1) -> int:
    """Run ``top`` or ``monitor`` for the crawl of *admin* (a FrontierAdmin already pinged);
    *alerts_config*: the alerts' thresholds (monitoring.alerts.AlertConfig; default ones
    when None).  Both keep the series sampled while no worker runs (source.Sampling), which
    also forgets workers silent for *forget_after* s (FLEET_WORKER_FORGET_AFTER; None: the
    default, 120 s).  *parts* > 1: a partitioned crawl (its partitions' snapshots merged,
    their series summed, each partition sampled)."""
    from scrapy_fleet import redis_client
    from scrapy_fleet.frontier.routing import partition_params
    from scrapy_fleet.monitoring.source import FleetSource, Sampling

    def make_source(hosts: int) -> FleetSource:
        return FleetSource(client, admin.keys, hosts, alerts_config, parts,
                           partition_params(admin.params, parts).queue_max)

    def samplings() -> list[Sampling]:
        return [Sampling(client, k, dead_after, forget).start()
                for k in admin.keys.all_partitions(parts)]

    interval = opts.interval
    dead_after = float(getattr(alerts_config, "dead_after", 6.0))
    forget = max(dead_after, 120.0 if forget_after is None else float(forget_after))
    if not (isinstance(interval, int | float) and math.isfinite(interval) and interval > 0):
        print("error: --interval must be a number of seconds > 0", file=sys.stderr)
        return EXIT_USAGE
    if not 0 <= opts.host_metrics <= HOST_METRICS_MAX:
        print(f"error: --host-metrics must be between 0 and {HOST_METRICS_MAX}",
              file=sys.stderr)
        return EXIT_USAGE
    if action == "monitor" and (opts.port is None or not 0 <= opts.port <= 65535):
        print("error: monitor needs --port P (0 to 65535; 0: any free port)", file=sys.stderr)
        return EXIT_USAGE
    client = redis_client.make_client(admin.url, READ_TIMEOUT)
    try:
        if action == "top":
            from scrapy_fleet.monitoring.top import run_top

            hosts = max(1, min(opts.limit, 50))
            source = make_source(hosts)
            if opts.once:
                return run_top(source, once=True, hosts=hosts)
            # SIGTERM ends it as Ctrl-C does: the terminal restored, status 0
            previous = signal.signal(signal.SIGTERM, _sigterm_stops)
            sampling = samplings()
            try:
                return run_top(source, interval=interval, hosts=hosts)
            finally:
                for one in sampling:
                    one.stop()
                signal.signal(signal.SIGTERM, previous)
        from scrapy_fleet.monitoring.server import run_monitor

        if not admin.has_state():  # a monitor may be deployed before its crawl begins
            print(f"warning: {admin.no_record()}; the views show nothing until a push or "
                  "a worker begins it", file=sys.stderr)

        source = make_source(max(10, opts.host_metrics))
        previous = signal.signal(signal.SIGTERM, _sigterm_stops)
        sampling = samplings()
        try:
            listen = (opts.host or ["127.0.0.1"])[-1]
            return run_monitor(source, admin.keys.crawl_id, listen, opts.port, interval,
                               opts.host_metrics)
        finally:
            for one in sampling:
                one.stop()
            signal.signal(signal.SIGTERM, previous)
    finally:
        client.close()
