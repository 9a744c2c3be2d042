"""The snapshot of a partitioned crawl (FLEET_PARTITIONS > 1, docs/partitions.md): the
schema-2 snapshot of each partition (:func:`~scrapy_fleet.monitoring.snapshot.read_snapshot`
on its keys) merged into one of the same shape, plus the partitions' table.

Each partition is a complete frontier with its own counters, series, heartbeats and failed
records; a worker's monitoring goes with its calls to its home partition.  So:

* counts, counters, rates (pages/items per minute), ``runnable_now``, hosts' totals and
  ``failed_by`` are **sums** over the partitions (the gauges of one sweep, partition after
  partition: not an atomic snapshot);
* ``workers``: one row per worker, the one of its latest call (its home's);
* ``hosts``: the union (a host's entries live in one partition), busiest first, cut to the
  limit; its ``pages``, ``bans``, ``block_rate`` and ``first_ban`` from its counters summed
  over every partition (a worker records them with its call to its home partition, wherever
  the host's entries are: :func:`host_totals`);
* ``idle_seconds``: the least (null while one partition is busy); ``eta_seconds``: the
  largest (null when a partition with work left has none); ``started_at`` the earliest,
  ``last_ack_at``/``last_worker_at`` the latest;
* ``redis``: summed over the distinct masters holding the partitions;
* ``alerts``: each partition's, once each (same id, where and what);
* added: ``partitions`` (P), ``per_partition`` (a row per partition: node, queued, leased,
  deferred, parked, bound, idle) and ``skew`` (the fullest partition's queued entries over
  the mean).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scrapy_fleet import redis_client
from scrapy_fleet.keys import CrawlKeys

#: fields of a per-partition row (``per_partition[]``, docs/monitoring.md)
ROW_FIELDS = ("partition", "tag", "slot", "node", "queued", "leased", "deferred", "parked",
              "dead", "seen", "bound", "idle_seconds", "acked")


def _sum(values: list[Any]) -> Any:
    """Sum of numbers, of dicts key by key (recursively); the first value otherwise."""
    if all(isinstance(v, dict) for v in values):
        keys = list(dict.fromkeys(k for v in values for k in v))
        return {k: _sum([v[k] for v in values if k in v]) for k in keys}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values)
    return values[0]


def _opt(values: list[Any], pick: Any) -> Any:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def skew(queued: list[int]) -> float:
    """The largest of *queued* over their mean (1.0: even; 0.0 when all are 0)."""
    mean = sum(queued) / len(queued) if queued else 0
    return round(max(queued) / mean, 2) if mean else 0.0


def merge(snaps: list[dict[str, Any]], rows: list[dict[str, Any]],
          hosts: int = 10) -> dict[str, Any]:
    """One schema-2 snapshot of the partitions' *snaps* (in partition order), with
    ``partitions``, ``per_partition`` (*rows*: one per partition, :data:`ROW_FIELDS`) and
    ``skew`` (module docstring).  *hosts*: how many hosts to list.

    Raises:
        ValueError: *snaps* is empty, or *rows* is not one per snapshot.
    """
    if not snaps or len(rows) != len(snaps):
        raise ValueError("one snapshot and one row per partition are needed")
    first = snaps[0]
    out: dict[str, Any] = {"schema": first["schema"], "crawl": first["crawl"],
                           "at": max(s["at"] for s in snaps)}
    out["frontier"] = _sum([s["frontier"] for s in snaps])
    out["counters"] = _sum([s["counters"] for s in snaps])
    rates = [s["rates"] for s in snaps]
    ppm = [r["pages_per_min"] for r in rates]
    out["rates"] = {
        "pages_per_min": _opt(ppm, sum),
        "items_per_min": _opt([r["items_per_min"] for r in rates], sum),
        "window_s": _opt([r["window_s"] for r in rates], max),
        # the partitions' block rates weighed by their pages
        "block_rate": _weighted([(r["block_rate"], p or 0) for r, p in zip(rates, ppm,
                                                                           strict=True)]),
    }
    etas = [s["eta_seconds"] for s in snaps]
    pending = [s["frontier"]["depth"] > 0 for s in snaps]
    out["eta_seconds"] = (None if any(e is None and p for e, p in zip(etas, pending,
                                                                     strict=True))
                          else _opt(etas, max))
    out["runnable_now"] = sum(s["runnable_now"] for s in snaps)
    latest: dict[str, dict[str, Any]] = {}
    for s in snaps:
        for w in s["workers"]:
            have = latest.get(w["id"])
            if have is None or w["last_seen"] > have["last_seen"]:
                latest[w["id"]] = w
    out["workers"] = sorted(latest.values(), key=lambda r: (r["health"] == "dead", r["id"]))
    out["workers_alive"] = sum(1 for r in out["workers"] if r["health"] != "dead")
    all_hosts = [h for s in snaps for h in s["hosts"]]
    out["hosts"] = sorted(all_hosts, key=lambda h: (-h["queued"], h["host"]))[:max(hosts, 0)]
    out["hosts_total"] = sum(s["hosts_total"] for s in snaps)
    out["hosts_sampled"] = any(s["hosts_sampled"] for s in snaps)
    out["hosts_ready"] = sum(s["hosts_ready"] for s in snaps)
    seen_alerts: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in snaps:
        for a in s["alerts"]:
            seen_alerts.setdefault((a["id"], a["where"], a["what"]), a)
    out["alerts"] = list(seen_alerts.values())
    out["failed_by"] = _sum([s["failed_by"] for s in snaps])
    by_node: dict[str, dict[str, Any]] = {}
    for s, r in zip(snaps, rows, strict=True):
        by_node.setdefault(str(r["node"]), s["redis"])
    out["redis"] = _sum(list(by_node.values()))
    out["started_at"] = _opt([s["started_at"] for s in snaps], min)
    out["last_ack_at"] = _opt([s["last_ack_at"] for s in snaps], max)
    out["last_worker_at"] = _opt([s["last_worker_at"] for s in snaps], max)
    idles = [s["idle_seconds"] for s in snaps]
    out["idle_seconds"] = None if any(i is None for i in idles) else min(idles)
    states = [s["start_requests"] for s in snaps]
    done = [st for st in states if st["state"] == "done"]
    going = [st for st in states if st["state"] == "in progress"]
    out["start_requests"] = (done or going or [{"state": None, "seeded_by": None}])[0]
    out["recrawl"] = merge_recrawl([s["recrawl"] for s in snaps])
    out["partitions"] = len(snaps)
    out["per_partition"] = [{k: r[k] for k in ROW_FIELDS} for r in rows]
    out["skew"] = skew([r["queued"] for r in rows])
    return out


def merge_recrawl(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The partitions' recrawl blocks (recrawl/status.py, ``read_recrawl``) as one: counts
    summed, the next revisit the soonest, the shares recomputed from the summed outcomes,
    the estimated freshness weighed by the URLs each partition sampled."""
    out: dict[str, Any] = {}
    for name in ("tracked", "scheduled", "due", "overdue", "dropped", "untracked",
                 "tracked_total", "revisits_queued", "sampled"):
        out[name] = sum(b[name] for b in blocks)
    out["outcomes"] = _sum([b["outcomes"] for b in blocks])
    out["change_rates"] = _sum([b["change_rates"] for b in blocks])
    out["next_due_in"] = _opt([b["next_due_in"] for b in blocks], min)
    revisits = sum(out["outcomes"].values())
    for share, outcome in (("not_modified_share", "not_modified"),
                           ("unchanged_share", "unchanged")):
        out[share] = round(out["outcomes"][outcome] / revisits, 3) if revisits else None
    fresh = _weighted([(b["freshness_estimate"], b["sampled"]) for b in blocks])
    out["freshness_estimate"] = None if fresh is None else round(fresh, 3)
    return out


def _weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    known = [(v, w) for v, w in pairs if v is not None]
    if not known:
        return None
    total = sum(w for _, w in known)
    if not total:
        return max(v for v, _ in known)
    return round(sum(v * w for v, w in known) / total, 6)


def slot_of(key: str) -> int:
    """The Redis Cluster slot of *key* (of its hash tag)."""
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


def node_of(client: Any, key: str) -> str:
    """host:port of the master serving *key* ("" on one server)."""
    if not redis_client.is_cluster(client):
        return ""
    node = client.get_node_from_key(key)
    return f"{node.host}:{node.port}"


def read_merged(client: Any, keys: CrawlKeys, parts: int, hosts: int = 10,
                alerts_config: Any = None, bound: int | None = None) -> dict[str, Any]:
    """The merged snapshot of crawl *keys* in *parts* partitions (:func:`merge`): every
    partition's ``read_snapshot``, one after the other; *bound*: each partition's share of
    FLEET_QUEUE_MAX (None: unbounded).

    Raises:
        redis.RedisError: a partition cannot be read.
    """
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    snaps, rows = [], []
    for k in keys.all_partitions(parts):
        snap = read_snapshot(client, k, hosts=hosts, alerts_config=alerts_config)
        fr = snap["frontier"]
        snaps.append(snap)
        rows.append({"partition": k.part, "tag": k.base, "slot": slot_of(k.base),
                     "node": node_of(client, k.stats), "queued": fr["due"],
                     "leased": fr["leased"], "deferred": fr["deferred"],
                     "parked": fr["parked"], "dead": fr["dead"], "seen": fr["seen"],
                     "bound": bound, "idle_seconds": snap["idle_seconds"],
                     "acked": snap["counters"]["requests"]["acked"]})
    out = merge(snaps, rows, hosts)
    names = [h["host"] for h in out["hosts"]]
    per_part = []
    for k in keys.all_partitions(parts) if names else []:
        with client.pipeline(transaction=False) as pipe:
            for h in names:
                pipe.hmget(k.hoststats, f"p|{h}", f"b|{h}", f"f|{h}")
            per_part.append(pipe.execute())
    if names:
        out["hosts"] = host_totals(out["hosts"], per_part)
    return out


def host_totals(hosts: list[dict[str, Any]], per_part: list[list[Any]]) -> list[dict[str, Any]]:
    """*hosts* (merged rows) with ``pages``, ``bans``, ``block_rate`` (bans / pages, None
    without pages) and ``first_ban`` (epoch seconds, the earliest; None: never banned) from
    every partition's counters: *per_part* holds, per partition, one ``[pages, bans,
    first ban ms]`` reply (HMGET of ``p|h``, ``b|h``, ``f|h`` in ``hoststats``; None or bytes
    values) per row of *hosts*, in order.

    Raises:
        ValueError: a partition's replies are not one per host row.
    """
    out = []
    for i, row in enumerate(hosts):
        pages = bans = 0
        firsts = []
        for replies in per_part:
            if len(replies) != len(hosts):
                raise ValueError("one hoststats reply per host row is needed")
            p, b, f = (int(v or 0) for v in replies[i])
            pages, bans = pages + p, bans + b
            if f:
                firsts.append(f)
        out.append({**row, "pages": pages, "bans": bans,
                    "block_rate": round(bans / pages, 6) if pages else None,
                    "first_ban": min(firsts) / 1000 if firsts else None})
    return out


def merge_points(series: Iterable[list[tuple[float, float | None]]]
                 ) -> list[tuple[float, float | None]]:
    """The partitions' points of one series summed step by step (a step none of them has a
    value for stays None)."""
    sums: dict[float, float | None] = {}
    for points in series:
        for t, v in points:
            have = sums.get(t)
            sums[t] = v if have is None else (have if v is None else have + v)
    return sorted(sums.items())
