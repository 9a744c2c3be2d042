"""Prometheus metrics of a whole fleet, read from one snapshot per scrape.

:class:`FleetCollector` is a prometheus-client custom collector: each ``collect()`` reads ONE
snapshot (``Source.snapshot()``: a bounded number of pipelined Redis round trips, cost
independent of the frontier's size) and turns it into metric families.  No metric is kept in
this process between scrapes, so one ``scrapy fleet monitor`` serves the whole fleet and no
multiprocess mode is needed.  Naming follows https://prometheus.io/docs/practices/naming/:
prefix ``scrapy_fleet_``, base units (seconds, bytes, ratios 0..1), ``_total`` counters (the
exact fleet-wide counters of the crawl), labels for states.

Series are bounded: no label takes a URL, a worker id or a host unless asked for; per-host
series are opt-in (``host_metrics=N``, at most :data:`HOST_METRICS_MAX` hosts, the top N by
queued entries), so the default exposition has a fixed number of series whatever the crawl's
size (see :func:`series_count` and docs/monitoring.md for the list).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from scrapy_fleet.monitoring.source import READ_ERRORS, Source

PREFIX = "scrapy_fleet_"
#: the most hosts ``--host-metrics`` may export (each adds :data:`SERIES_PER_HOST` series)
HOST_METRICS_MAX = 50
SERIES_PER_HOST = 10

FRONTIER_STATES = ("due", "deferred", "leased", "parked", "dead", "failed", "stored")
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
ERROR_KINDS = ("timeout", "dns", "connection", "tls", "other")
REQUEST_EVENTS = ("pushed", "duplicate", "leased", "acked", "reclaimed", "dead_lettered",
                  "released", "parked", "deferred", "refused")
HEALTHS = ("alive", "stalled", "dead")
WORKER_STATES = ("fetching", "parsing", "no_exit", "idle", "draining", "closing")
SEVERITIES = ("critical", "warning")


def _num(value: Any) -> float:
    """A snapshot number as float; missing/None/garbage -> 0 (the contract says missing
    data is 0 or null)."""
    try:
        return float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def _get(mapping: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(name)
    return mapping


def _labelled(family: Any, label_values: tuple[str, ...], source: Any) -> Any:
    for value in label_values:
        family.add_metric([value], _num(_get(source, value)))
    return family


def families(snap: Mapping[str, Any], host_metrics: int = 0) -> list[Metric]:
    """Metric families of one snapshot (shape: ``snapshot.read_snapshot``).

    *host_metrics*: per-host series for the top N hosts of the snapshot (0: none; capped at
    :data:`HOST_METRICS_MAX`).  A null rate, ratio or ETA has no sample (absent, not 0)."""
    p = PREFIX
    out: list[Metric] = []
    frontier = snap.get("frontier") or {}
    counters = snap.get("counters") or {}
    rates = snap.get("rates") or {}

    out.append(_labelled(GaugeMetricFamily(
        p + "frontier_requests", "Requests in the frontier by state: due (may be fetched now), "
        "deferred (waiting for a later time: back pressure, a delay), leased (being "
        "fetched), parked (outside the bound), "
        "dead (dead letters), failed (kept failed requests), stored (responses of fetch "
        "workers for parse workers, a part of due and leased)", labels=["state"]),
        FRONTIER_STATES, frontier))
    out.append(GaugeMetricFamily(p + "dupefilter_fingerprints",
                                 "Fingerprints the fleet's Bloom dupefilter has seen",
                                 value=_num(frontier.get("seen"))))
    out.append(GaugeMetricFamily(
        p + "runnable_requests", "Requests that can run now under the fleet's politeness caps "
        "(autoscaling signal: scale workers on this; never 0 while leases are in flight)",
        value=_num(snap.get("runnable_now"))))

    out.append(_labelled(CounterMetricFamily(
        p + "responses", "Responses received by the fleet, by HTTP status class",
        labels=["status_class"]), STATUS_CLASSES, counters.get("responses")))
    out.append(CounterMetricFamily(p + "pages", "Responses received by the fleet, all statuses",
                                   value=_num(counters.get("pages"))))
    items = CounterMetricFamily(p + "items", "Items by outcome: scraped (passed the item "
                                "pipelines), dropped (DropItem) or failed (a pipeline raised: "
                                "not written)", labels=["outcome"])
    items.add_metric(["scraped"], _num(counters.get("items_scraped")))
    items.add_metric(["dropped"], _num(counters.get("items_dropped")))
    items.add_metric(["failed"], _num(counters.get("items_failed")))
    out.append(items)
    out.append(_labelled(CounterMetricFamily(
        p + "download_errors", "Downloads that failed without a response, by kind",
        labels=["kind"]), ERROR_KINDS, counters.get("download_errors")))
    out.append(_labelled(CounterMetricFamily(
        p + "requests", "Frontier events: pushed (new), duplicate (filtered), leased, acked, "
        "reclaimed (lease expired), dead_lettered, released (lease given back), parked, "
        "deferred, refused (frontier full)", labels=["event"]),
        REQUEST_EVENTS, counters.get("requests")))
    for name, key, doc in (
            ("bans", "bans", "Responses whose status is in FLEET_BAN_STATUSES (default 403)"),
            ("proxy_bans", "proxy_bans", "Ban verdicts of the proxy pool"),
            ("rate_limited", "rate_limited", "Responses 429 Too Many Requests"),
            ("robots_denied", "robots_denied", "Requests refused by robots.txt"),
            ("offsite_filtered", "offsite_filtered",
             "Requests filtered by Scrapy's OffsiteMiddleware (allowed_domains)"),
            ("response_bytes", "response_bytes", "Bytes of response bodies received")):
        out.append(CounterMetricFamily(p + name, doc, value=_num(counters.get(key))))

    out.extend(_recrawl_families(snap.get("recrawl") or {}))
    out.extend(_budget_families(snap.get("budget") or {}))
    out.extend(_session_families(snap.get("sessions") or {}))
    for name, key, scale, doc in (
            ("pages_per_second", "pages_per_min", 1 / 60,
             "Responses per second over the last 60 s"),
            ("items_per_second", "items_per_min", 1 / 60,
             "Items scraped per second over the last 60 s"),
            ("block_ratio", "block_rate", 1.0,
             "Bans / responses over the last 5 min (0..1; absent when no response)")):
        family = GaugeMetricFamily(p + name, doc)
        if rates.get(key) is not None:
            family.add_metric([], _num(rates.get(key)) * scale)
        out.append(family)
    eta = GaugeMetricFamily(p + "eta_seconds", "Seconds until the frontier is drained at the "
                            "current rate (absent while the depth is not falling)")
    if snap.get("eta_seconds") is not None:
        eta.add_metric([], _num(snap.get("eta_seconds")))
    out.append(eta)

    workers = [w for w in snap.get("workers") or [] if isinstance(w, Mapping)]
    by_health = GaugeMetricFamily(p + "workers", "Workers listed by their heartbeats, by "
                                  "health (alive, stalled: leases but no ack for a while, "
                                  "dead: heartbeats stopped)", labels=["health"])
    for health in HEALTHS:
        by_health.add_metric([health], sum(1 for w in workers if w.get("health") == health))
    out.append(by_health)
    by_state = GaugeMetricFamily(p + "workers_by_state", "Workers not dead, by state",
                                 labels=["state"])
    for state in WORKER_STATES:
        by_state.add_metric([state], sum(1 for w in workers if w.get("state") == state
                                         and w.get("health") != "dead"))
    out.append(by_state)
    out.append(GaugeMetricFamily(p + "downloads_active", "Downloads in progress, fleet-wide "
                                 "(sum over workers not dead)",
                                 value=sum(_num(w.get("downloads")) for w in workers
                                           if w.get("health") != "dead")))

    alerts = GaugeMetricFamily(p + "alerts", "Alerts firing, by alert id and severity (ids: "
                               "docs/monitoring.md)", labels=["alert", "severity"])
    counts: dict[tuple[str, str], int] = {}
    for alert in snap.get("alerts") or []:
        if isinstance(alert, Mapping):
            pair = (str(alert.get("id", "unknown")), str(alert.get("severity", "warning")))
            counts[pair] = counts.get(pair, 0) + 1
    for (alert_id, severity), n in sorted(counts.items()):
        alerts.add_metric([alert_id, severity], n)
    out.append(alerts)

    redis_info = snap.get("redis") or {}
    out.append(GaugeMetricFamily(p + "redis_used_memory_bytes", "Redis used_memory",
                                 value=_num(redis_info.get("used_memory"))))
    out.append(GaugeMetricFamily(p + "redis_maxmemory_bytes", "Redis maxmemory (0: no limit)",
                                 value=_num(redis_info.get("maxmemory"))))
    out.append(GaugeMetricFamily(p + "hosts", "Hosts with entries in the frontier",
                                 value=_num(snap.get("hosts_total"))))
    out.append(GaugeMetricFamily(p + "hosts_ready", "Hosts that may be fetched now "
                                 "(politeness allows a request)",
                                 value=_num(snap.get("hosts_ready"))))
    last_ack = GaugeMetricFamily(p + "last_ack_timestamp_seconds", "When a request was last "
                                 "acknowledged, fleet-wide (unix seconds; absent before the "
                                 "first)")
    if snap.get("last_ack_at") is not None:
        last_ack.add_metric([], _num(snap.get("last_ack_at")))
    out.append(last_ack)
    out.append(GaugeMetricFamily(p + "snapshot_timestamp_seconds", "Redis server time of "
                                 "the snapshot (unix seconds)", value=_num(snap.get("at"))))

    if snap.get("per_partition"):  # a partitioned crawl (docs/partitions.md)
        out.append(GaugeMetricFamily(p + "partitions", "Partitions of the crawl's frontier "
                                     "(FLEET_PARTITIONS)", value=_num(snap.get("partitions"))))
        part = GaugeMetricFamily(
            p + "partition_requests", "Requests in one partition of the frontier by state "
            "(queued: due), with the master holding it", labels=["partition", "node", "state"])
        for row in snap["per_partition"]:
            for state in ("queued", "leased", "deferred", "parked", "dead"):
                part.add_metric([str(row.get("partition")), str(row.get("node") or "local"),
                                 state], _num(row.get(state)))
        out.append(part)
        out.append(GaugeMetricFamily(p + "partition_skew", "The fullest partition's queued "
                                     "requests over the mean (1: even)",
                                     value=_num(snap.get("skew"))))

    control = snap.get("control") or {}  # crawl control (issue 34, docs/control.md)
    out.append(GaugeMetricFamily(p + "paused", "1 while the crawl is paused (scrapy fleet "
                                 "pause), else 0", value=1.0 if control.get("paused") else 0.0))
    out.append(GaugeMetricFamily(p + "paused_hosts", "Hosts paused or blocked now (scrapy "
                                 "fleet pause --host, host block)",
                                 value=float(len(control.get("hosts") or {}))))
    n = max(0, min(int(host_metrics), HOST_METRICS_MAX))
    if n:
        out.extend(_host_families([h for h in snap.get("hosts") or []
                                   if isinstance(h, Mapping)][:n]))
    return out


def _budget_families(b: Mapping[str, Any]) -> list[Metric]:
    """budgets (issue 34, docs/control.md): the crawl's page and time budgets (absent when
    none), pages charged, hosts out of their page budget."""
    p = PREFIX
    out: list[Metric] = [
        GaugeMetricFamily(p + "budget_charged_pages", "Pages charged to the crawl's budget at "
                          "lease time (counted while a budget is set)",
                          value=_num(b.get("charged"))),
        GaugeMetricFamily(p + "budget_hosts_out", "Hosts out of their page budget (their "
                          "queue kept, not served)", value=_num(b.get("hosts_out")))]
    if b.get("pages"):
        out.append(GaugeMetricFamily(p + "budget_pages", "The crawl's page budget "
                                     "(FLEET_BUDGET_PAGES or scrapy fleet budget)",
                                     value=_num(b["pages"])))
        out.append(GaugeMetricFamily(p + "budget_left_pages", "Pages left in the crawl's "
                                     "budget", value=_num(b.get("left"))))
    if b.get("left_seconds") is not None:
        out.append(GaugeMetricFamily(p + "budget_left_seconds", "Seconds of Redis's clock "
                                     "left in the crawl's time budget",
                                     value=_num(b["left_seconds"])))
    return out


def _session_families(pools: Mapping[str, Any]) -> list[Metric]:
    """session pools (issue 32, docs/sessions.md): sessions by state, logins, retirements by
    reason and failed validity checks, per pool (no series without pools)."""
    p = PREFIX
    sessions = GaugeMetricFamily(p + "sessions", "Sessions of a pool: active (logged in, or "
                                 "needing no login) and drawable (not retired)",
                                 labels=["pool", "state"])
    logins = CounterMetricFamily(p + "session_logins", "Session logins that succeeded",
                                 labels=["pool"])
    retired = CounterMetricFamily(p + "session_retirements", "Sessions retired, by reason",
                                  labels=["pool", "reason"])
    checks = CounterMetricFamily(p + "session_check_failures", "Failed validity checks "
                                 "(fleet_session_check) that asked a login", labels=["pool"])
    for pool, row in sorted(pools.items()):
        for state in ("active", "drawable"):
            sessions.add_metric([pool, state], _num(row.get(state)))
        logins.add_metric([pool], _num(row.get("logins")))
        checks.add_metric([pool], _num(row.get("check_failed")))
        for reason, n in sorted((row.get("retired") or {}).items()):
            retired.add_metric([pool, reason], _num(n))
    return [sessions, logins, retired, checks]


def _recrawl_families(rv: Mapping[str, Any]) -> list[Metric]:
    """recrawl (issue 22, docs/recrawl.md): the schedule, the revisits' outcomes, the model's
    change rates and freshness."""
    p = PREFIX
    out: list[Metric] = [GaugeMetricFamily(
        p + "recrawl_tracked_urls", "URLs tracked for revisits (FLEET_RECRAWL)",
        value=_num(rv.get("tracked")))]
    revisits = GaugeMetricFamily(
        p + "recrawl_revisits", "Revisits in the schedule: scheduled (all), due (may go to the "
        "frontier now), overdue (due for over a minute)", labels=["state"])
    for state in ("scheduled", "due", "overdue"):
        revisits.add_metric([state], _num(rv.get(state)))
    out.append(revisits)
    outcomes = CounterMetricFamily(
        p + "recrawl_outcomes", "Revisits by outcome: not_modified (304), unchanged (same "
        "signature), changed, gone (dropped after 404/410)", labels=["outcome"])
    for name, value in (rv.get("outcomes") or {}).items():
        outcomes.add_metric([name], _num(value))
    out.append(outcomes)
    rates = GaugeMetricFamily(
        p + "recrawl_change_rate_pages", "Sampled tracked pages by estimated change rate",
        labels=["rate"])
    for name, value in (rv.get("change_rates") or {}).items():
        rates.add_metric([name], _num(value))
    out.append(rates)
    lastmod = CounterMetricFamily(
        p + "recrawl_lastmod", "Known URLs pushed with a sitemap <lastmod>: due (newer than "
        "the last fetch: made due at once), older (nothing done), unknown (not in the "
        "schedule)", labels=["result"])
    for name, value in (rv.get("lastmod") or {}).items():
        lastmod.add_metric([name], _num(value))
    out.append(lastmod)
    fresh = GaugeMetricFamily(p + "recrawl_freshness_ratio",
                              "Freshness the change model expects of the sampled tracked "
                              "pages at their intervals (0..1; absent with no sample)")
    if rv.get("freshness_estimate") is not None:
        fresh.add_metric([], _num(rv["freshness_estimate"]))
    out.append(fresh)
    return out


def _host_families(hosts: list[Mapping[str, Any]]) -> list[Metric]:
    p = PREFIX
    requests = GaugeMetricFamily(p + "host_requests", "Requests of a host in the frontier "
                                 "(top hosts by queued, --host-metrics)",
                                 labels=["host", "state"])
    pages = CounterMetricFamily(p + "host_pages", "Responses from a host", labels=["host"])
    bans = CounterMetricFamily(p + "host_bans", "Bans from a host", labels=["host"])
    ratio = GaugeMetricFamily(p + "host_block_ratio", "Bans / responses of a host since the "
                              "crawl began", labels=["host"])
    for row in hosts:
        host = str(row.get("host", ""))
        requests.add_metric([host, "queued"], _num(row.get("queued")))
        requests.add_metric([host, "leased"], _num(row.get("leased")))
        pages.add_metric([host], _num(row.get("pages")))
        bans.add_metric([host], _num(row.get("bans")))
        if row.get("block_rate") is not None:
            ratio.add_metric([host], _num(row.get("block_rate")))
    return [requests, pages, bans, ratio, *_adaptive_families(hosts)]


def _adaptive_families(hosts: list[Mapping[str, Any]]) -> list[Metric]:
    """Adaptive politeness (issue 35, docs/politeness.md): each host's controller as the
    snapshot's rows hold it (``politeness.adaptive_view.adaptive_fields``, the reader of
    ``status --hosts``); a null figure has no sample.  The last decrease's reason is a label
    of one series per host (its time the value), so the label set stays bounded."""
    p = PREFIX
    rate = GaugeMetricFamily(p + "host_rate_requests_per_second", "Requests per second the "
                             "fleet allows a host now: its adaptive rate under the ceiling "
                             "(the ceiling while the host never complained)", labels=["host"])
    ceiling = GaugeMetricFamily(p + "host_rate_ceiling_requests_per_second", "A host's "
                                "configured rate (FLEET_HOST_RATE, FLEET_HOST_DELAY, its "
                                "override or Crawl-delay)", labels=["host"])
    capacity = GaugeMetricFamily(p + "host_learned_capacity_requests_per_second", "The rate "
                                 "at which a host last was overloaded (kept across crawls)",
                                 labels=["host"])
    decreases = CounterMetricFamily(p + "host_rate_decreases", "Decreases of a host's "
                                    "adaptive rate (one per overload event)", labels=["host"])
    last = GaugeMetricFamily(p + "host_last_rate_decrease_timestamp_seconds", "When a host's "
                             "rate last came down (unix seconds, Redis's clock), by its "
                             "reason: the status (429, 503), timeout, error or latency",
                             labels=["host", "reason"])
    for row in hosts:
        host = str(row.get("host", ""))
        for family, name in ((rate, "adaptive_rate"), (ceiling, "ceiling"),
                             (capacity, "capacity")):
            if row.get(name) is not None:
                family.add_metric([host], _num(row.get(name)))
        decreases.add_metric([host], _num(row.get("decreases")))
        if row.get("last_decrease_at") is not None:
            last.add_metric([host, str(row.get("last_decrease") or "unknown")],
                            _num(row.get("last_decrease_at")))
    return [rate, ceiling, capacity, decreases, last]


def series_count(metric_families: list[Metric]) -> int:
    """Samples (= series) an exposition of *metric_families* holds."""
    return sum(len(family.samples) for family in metric_families)


class FleetCollector(Collector):
    """A custom collector reading one snapshot per ``collect()`` (one Prometheus scrape).

    While Redis cannot be read, a scrape answers ``scrapy_fleet_up 0`` (and the error
    counter) instead of failing, so the monitor keeps serving and alerting rules can fire on
    ``up == 0``.  ``scrapy_fleet_scrape_duration_seconds``: time of the snapshot read."""

    def __init__(self, source: Source, host_metrics: int = 0) -> None:
        self.source = source
        self.host_metrics = max(0, min(int(host_metrics), HOST_METRICS_MAX))
        self.errors = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            snap = self.source.snapshot()
        except READ_ERRORS:
            with self._lock:
                self.errors += 1
            snap = None
        up = GaugeMetricFamily(PREFIX + "up", "1 when the last scrape read the crawl's data "
                               "from Redis, 0 when Redis could not be read")
        up.add_metric([], 0.0 if snap is None else 1.0)
        yield up
        yield CounterMetricFamily(PREFIX + "scrape_errors", "Scrapes of this monitor that "
                                  "could not read Redis", value=self.errors)
        yield GaugeMetricFamily(PREFIX + "scrape_duration_seconds", "Seconds the last scrape "
                                "took to read the snapshot",
                                value=time.perf_counter() - started)
        if snap is not None:
            yield from families(snap, self.host_metrics)


def registry(source: Source, host_metrics: int = 0) -> CollectorRegistry:
    """A registry with only the fleet's collector (no process metrics of the monitor)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(source, host_metrics))
    return reg
