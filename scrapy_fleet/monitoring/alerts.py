"""Alerts worded for an operator, from a snapshot (monitoring/snapshot.py).

Each alert says what is wrong, where, since when (unix seconds, or None when unknown) and the
next command to run::

    {"id": "no_worker", "severity": "critical", "what": "...", "where": "crawl docs",
     "since": 1764581900.0, "next": "scrapy crawl <spider> (or scale the workers up)"}

Ids: ``no_worker``, ``fleet_stalled``, ``proxy_no_exit``, ``depth_growing``,
``host_blocked``, ``dead_letters_growing``, ``requests_unstorable``, ``items_failed``,
``redis_memory``, ``worker_dead``, ``worker_stalled`` (docs/monitoring.md).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from scrapy_fleet.monitoring.series import Sample
from scrapy_fleet.monitoring.settings import MonitoringConfig

#: every id :func:`evaluate` gives (module docstring)
ALERT_IDS = ("no_worker", "fleet_stalled", "proxy_no_exit", "depth_growing", "host_blocked",
             "dead_letters_growing", "requests_unstorable", "items_failed", "redis_memory",
             "worker_dead", "worker_stalled")


@dataclass(frozen=True)
class AlertConfig:
    """Thresholds of the alerts and of worker health.  Times in seconds.

    From settings: :meth:`from_config` (FLEET_WORKER_DEAD_AFTER, FLEET_STALL_AFTER,
    FLEET_ALERT_DEPTH_MINUTES, FLEET_ALERT_BLOCK_RATE, FLEET_ALERT_BLOCK_MIN_PAGES,
    FLEET_ALERT_MEMORY_RATIO).
    """

    dead_after: float = 6.0  #: a worker silent this long is dead
    stall_after: float = 120.0  #: alive, holding leases, no acknowledgement this long: stalled
    depth_minutes: int = 10  #: depth grew at every 1 min sample for this many minutes
    block_rate: float = 0.2  #: a host's bans / responses above this
    block_min_pages: int = 20  #: ... over at least this many responses
    memory_ratio: float = 0.9  #: used_memory / maxmemory above this
    dead_minutes: int = 10  #: dead letters grew within this many minutes

    @classmethod
    def from_config(cls, config: MonitoringConfig) -> AlertConfig:
        """From the monitoring settings (``FleetConfig.monitoring``)."""
        return cls(dead_after=config.worker_dead_after, stall_after=config.stall_after,
                   depth_minutes=config.alert_depth_minutes, block_rate=config.alert_block_rate,
                   block_min_pages=config.alert_block_min_pages,
                   memory_ratio=config.alert_memory_ratio)


def _alert(id_: str, severity: str, what: str, where: str, since: float | None,
           next_: str) -> dict[str, Any]:
    return {"id": id_, "severity": severity, "what": what, "where": where,
            "since": None if since is None else round(since, 3), "next": next_}


def host_alerts(banned_hosts: list[dict[str, Any]], crawl: str,
                cfg: AlertConfig) -> list[dict[str, Any]]:
    """The ``host_blocked`` alerts of host rows *banned_hosts* ({host, pages, bans,
    block_rate, first_ban}): one per host whose block rate is above ``cfg.block_rate`` over at
    least ``cfg.block_min_pages`` pages.  A partitioned crawl calls it on rows summed over
    the partitions (monitoring/merge.py)."""
    where = f"crawl {crawl}"
    out: list[dict[str, Any]] = []
    for row in banned_hosts:
        rate = row.get("block_rate")
        if rate is not None and row["pages"] >= cfg.block_min_pages and rate > cfg.block_rate:
            out.append(_alert(
                "host_blocked", "warning",
                f"{row['bans']} of {row['pages']} responses from {row['host']} were bans "
                f"(block rate {rate:.0%}, threshold {cfg.block_rate:.0%})",
                f"host {row['host']}, {where}", row.get("first_ban"),
                "slow it down: -s 'FLEET_HOST_OVERRIDES={\"" + row["host"]
                + "\": {\"rate\": 0.5}}' (or change egress: proxies); scrapy fleet status "
                f"{crawl} --hosts"))
    return out


def evaluate(snap: dict[str, Any], samples1m: list[Sample], banned_hosts: list[dict[str, Any]],
             cfg: AlertConfig) -> list[dict[str, Any]]:
    """The alerts of snapshot *snap* (critical first).  *samples1m*: the 1 min tier's
    samples, oldest first; *banned_hosts*: host rows of the most banned hosts."""
    crawl = snap["crawl"]
    where = f"crawl {crawl}"
    now = snap["at"]
    fr = snap["frontier"]
    out: list[dict[str, Any]] = []
    work = fr["due"] + fr["deferred"] + fr["leased"] + fr["parked"]
    alive = [w for w in snap["workers"] if w["health"] != "dead"]
    if work and not alive:
        since = snap.get("last_worker_at")
        out.append(_alert(
            "no_worker", "critical",
            f"no worker is alive while {work} request(s) wait ({fr['due']} due, "
            f"{fr['leased']} leased)", where, since,
            "start workers: scrapy crawl <spider> (or scale the worker deployment up)"))
    no_exit = [w for w in alive if w.get("state") == "no_exit"]
    if no_exit:
        # the worker's heartbeat state: requests of it wait for an exit of the proxy pool
        # and lua/proxies.lua found none that may carry them (dead, drained, or none)
        out.append(_alert(
            "proxy_no_exit", "critical",
            f"{len(no_exit)} worker(s) hold requests waiting for a proxy exit, and the proxy "
            "pool has no live exit (every exit dead or drained, or none): nothing is fetched "
            "(a request never goes without a proxy)", where,
            min((w["last_ack"] for w in no_exit if w.get("last_ack")), default=None),
            f"scrapy fleet proxies list {crawl}; add exits: scrapy fleet proxies add {crawl} "
            f"URL; re-check the dead ones now: scrapy fleet proxies reset {crawl}"))
    last_ack = snap.get("last_ack_at")
    if alive and (fr["due"] or fr["leased"]):
        ref = last_ack or snap.get("started_at")
        if ref is not None and now - ref > cfg.stall_after:
            out.append(_alert(
                "fleet_stalled", "critical",
                f"{len(alive)} worker(s) alive and {fr['due'] + fr['leased']} request(s) due "
                f"or leased, but no request acknowledged for {now - ref:.0f} s", where, ref,
                f"scrapy fleet status {crawl} --hosts (hosts on hold or capped?) and the "
                "workers' logs"))
    # depth growing at every 1 min sample for depth_minutes
    recent = [s for s in samples1m if s.t >= now - 60 * (cfg.depth_minutes + 1)]
    if len(recent) >= cfg.depth_minutes + 1:
        depths = [s.due + s.deferred + s.leased + s.parked for s in recent]
        if all(b > a for a, b in itertools.pairwise(depths)):
            out.append(_alert(
                "depth_growing", "warning",
                f"the frontier grew from {depths[0]} to {depths[-1]} requests in the last "
                f"{len(depths) - 1} min: the fleet falls behind", where, recent[0].t,
                f"add workers (runnable_now={snap['runnable_now']}), or check caps: "
                f"scrapy fleet status {crawl} --hosts"))
    out += host_alerts(banned_hosts, crawl, cfg)
    window = [s for s in samples1m if s.t >= now - 60 * cfg.dead_minutes]
    if window and fr["dead"] > window[0].dead:
        since = next((s.t for s in window if s.dead > window[0].dead), window[0].t)
        out.append(_alert(
            "dead_letters_growing", "warning",
            f"{fr['dead'] - window[0].dead} new dead letter(s) in the last "
            f"{cfg.dead_minutes} min ({fr['dead']} in all)", where, since,
            f"scrapy fleet dead {crawl}"))
    # failed requests kept (scrapy fleet failed) whose reason says something was lost: they
    # clear once retried (or purged)
    kept = snap.get("failed_by") or {}
    unstorable = sum(n for r, n in kept.items() if r.startswith("codec/"))
    if unstorable:
        out.append(_alert(
            "requests_unstorable", "warning",
            f"{unstorable} request(s) the spider yielded could not be stored (a callback or "
            "meta value the fleet's codec cannot encode, e.g. a lambda): not crawled from "
            "there (a URL may still be crawled through another link)",
            where, None,
            f"scrapy fleet failed {crawl} (reasons codec/...); fix the spider, then "
            f"scrapy fleet retry {crawl} --reason codec/<error> (docs/failures.md)"))
    items_failed = sum(n for r, n in kept.items() if r.startswith("item/"))
    if items_failed:
        out.append(_alert(
            "items_failed", "warning",
            f"{items_failed} request(s) failed because an item pipeline could not write one of "
            "their items (it raised)", where, None,
            f"scrapy fleet failed {crawl} (reasons item/...); fix the spider or the sink, "
            f"then scrapy fleet retry {crawl} --reason item/<error>"))
    out += memory_alerts(snap["redis"], cfg)
    out += worker_alerts(snap["workers"], fr["leased"], where, now)
    out.sort(key=lambda a: a["severity"] != "critical")
    return out


def memory_alerts(mem: dict[str, Any], cfg: AlertConfig, node: str = "") -> list[dict[str, Any]]:
    """The ``redis_memory`` alert of one server's *mem* ({used_memory, maxmemory} of
    ``INFO memory``), where ``redis`` (``redis <node>`` for a master of a cluster)."""
    if not (mem["maxmemory"] and mem["used_memory"] > cfg.memory_ratio * mem["maxmemory"]):
        return []
    return [_alert(
        "redis_memory", "critical",
        f"Redis uses {mem['used_memory'] / 2**20:.1f} MiB of its maxmemory "
        f"{mem['maxmemory'] / 2**20:.1f} MiB ({mem['used_memory'] / mem['maxmemory']:.0%})",
        f"redis {node}" if node else "redis", None,
        "raise maxmemory (redis-cli CONFIG SET maxmemory ...) or lower FLEET_QUEUE_MAX; "
        "old crawls: scrapy fleet purge <spider>")]


def worker_alerts(workers: list[dict[str, Any]], leased: int, where: str,
                  now: float) -> list[dict[str, Any]]:
    """``worker_dead`` and ``worker_stalled`` alerts of the snapshot's *workers* rows
    (*leased*: entries leased crawl-wide now; *where*: ``crawl <id>``; *now*: epoch s)."""
    out: list[dict[str, Any]] = []
    for w in workers:
        if w["health"] == "dead":
            # its lease count is the one of its last call: once nothing is leased fleet-wide,
            # those leases have expired and gone back (or were acknowledged in the meantime)
            if not w["leases"]:
                leases = "it held no lease"
            elif not leased:
                leases = (f"the {w['leases']} lease(s) it held at its last call have gone "
                          "back to the queue (none is leased now)")
            else:
                leases = (f"the {w['leases']} lease(s) it held at its last call go back to "
                          "the queue when they expire")
            out.append(_alert(
                "worker_dead", "warning",
                f"worker {w['id']} stopped calling the frontier; {leases}",
                f"worker {w['id']}, {where}",
                w["last_seen"], f"check the process on {w['host']} (pid {w['pid']})"))
        elif w["health"] == "stalled":
            out.append(_alert(
                "worker_stalled", "warning",
                f"worker {w['id']} holds {w['leases']} lease(s) and acknowledged none for "
                f"{now - (w['last_ack'] or now):.0f} s", f"worker {w['id']}, {where}",
                w["last_ack"], f"check its log on {w['host']} (pid {w['pid']}); a stuck "
                "callback or pipeline?"))
    return out
