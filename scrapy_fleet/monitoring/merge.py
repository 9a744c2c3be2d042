"""The snapshot of a partitioned crawl (FLEET_PARTITIONS > 1, docs/partitions.md): the
schema-2 snapshot of each partition (:func:`~scrapy_fleet.monitoring.snapshot.read_snapshot`
on its keys) merged into one of the same shape, plus the partitions' table.

Each partition is a complete frontier with its own counters, series, heartbeats and failed
records; a worker's monitoring goes with its calls to its home partition.  So:

* counts, counters, ``runnable_now``, hosts' totals and ``failed_by`` are **sums** over the
  partitions; rates (pages/items per minute, block rate) are taken from the summed counters
  over one window for every partition (:func:`merged_rates`) (the gauges of one sweep,
  partition after partition: not an atomic snapshot);
* ``workers``: one row per worker: its home's record (state, leases, counts), seen at its
  latest call anywhere, its ``last_ack`` the latest of every partition (its acknowledgements
  land in the partitions its pages came from, mostly not its home), its health from those;
* ``hosts``: the union (a host's entries live in one partition), busiest first, cut to the
  limit; its ``pages``, ``bans``, ``block_rate`` and ``first_ban`` from its counters summed
  over every partition (a worker records them with its call to its home partition, wherever
  the host's entries are: :func:`host_totals`);
* ``idle_seconds``: the least (null while one partition is busy); ``eta_seconds``: the
  largest (null when a partition with work left has none); ``started_at`` the earliest,
  ``last_ack_at``/``last_worker_at`` the latest;
* ``redis``: summed over the distinct masters holding the partitions;
* ``alerts``: evaluated once on the merged snapshot (``alerts.evaluate``), as on one
  partition: the frontier's counts summed, the merged worker rows, the crawl's last
  acknowledgement, the 1 min samples summed step by step (:func:`merge_samples`), the failed
  records summed, a host's counters summed over the partitions (:func:`read_merged`);
  ``redis_memory`` once per server; an alert of another id (none today) each partition's,
  once;
* added: ``partitions`` (P), ``per_partition`` (a row per partition: node, queued, leased,
  deferred, parked, bound, idle) and ``skew`` (the fullest partition's queued entries over
  the mean).
"""

from __future__ import annotations

import itertools
from typing import Any

from scrapy_fleet import redis_client
from scrapy_fleet.frontier import budgets
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import alerts as alerts_mod
from scrapy_fleet.monitoring.alerts import AlertConfig
from scrapy_fleet.monitoring.series import Sample
from scrapy_fleet.sessions.pool import pools_summary

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


def top_hosts(snaps: list[dict[str, Any]], hosts: int) -> list[dict[str, Any]]:
    """The *hosts* rows of the partitions' *snaps* with most queued entries (a host's
    entries live in one partition)."""
    rows = [h for s in snaps for h in s["hosts"]]
    return sorted(rows, key=lambda h: (-h["queued"], h["host"]))[:max(hosts, 0)]


def merge(snaps: list[dict[str, Any]], rows: list[dict[str, Any]],
          hosts: int = 10, *, cfg: AlertConfig | None = None,
          samples1m: list[Sample] | None = None,
          banned: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One schema-2 snapshot of the partitions' *snaps* (in partition order), with
    ``partitions``, ``per_partition`` (*rows*: one per partition, :data:`ROW_FIELDS`) and
    ``skew`` (module docstring).  *hosts*: how many hosts to list.  The alerts are the
    crawl's (thresholds *cfg*): *samples1m*, the 1 min samples summed over the partitions
    (:func:`merge_samples`); *banned*, host rows of the most banned hosts, their counters
    summed over the partitions.

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
    cfg = cfg or AlertConfig()
    out["workers"] = merge_workers([w for s in snaps for w in s["workers"]], out["at"],
                                   cfg.stall_after)
    out["workers_alive"] = sum(1 for r in out["workers"] if r["health"] != "dead")
    out["hosts"] = top_hosts(snaps, hosts)
    out["hosts_total"] = sum(s["hosts_total"] for s in snaps)
    out["hosts_sampled"] = any(s["hosts_sampled"] for s in snaps)
    out["hosts_ready"] = sum(s["hosts_ready"] for s in snaps)
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
    # crawl control (issue 34): every partition holds all of it (commands/control.py)
    out["control"] = snaps[0].get("control") if snaps else None
    out["partitions"] = len(snaps)
    out["per_partition"] = [{k: r[k] for k in ROW_FIELDS} for r in rows]
    out["skew"] = skew([r["queued"] for r in rows])
    out["alerts"] = merged_alerts(out, snaps, by_node, cfg, samples1m or [], banned or [])
    return out


def merged_alerts(out: dict[str, Any], snaps: list[dict[str, Any]],
                  memory: dict[str, dict[str, Any]], cfg: AlertConfig,
                  samples1m: list[Sample], banned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alerts of the merged snapshot *out*, critical first: ``alerts.evaluate`` on it
    (each partition's own evaluation counted its own requests, workers and acknowledgements:
    ``no_worker`` said "1 request waits" with 2 due, ``fleet_stalled`` fired for a partition
    while the crawl acknowledged pages), ``redis_memory`` once per server (*memory*: node ->
    its ``redis``), and the partitions' alerts of any other id, once each."""
    found = [a for a in alerts_mod.evaluate(out, samples1m, banned, cfg)
             if a["id"] != "redis_memory"]
    for node, mem in memory.items():
        found += alerts_mod.memory_alerts(mem, cfg, node)
    others: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in snaps:
        for a in s["alerts"]:
            if a["id"] not in alerts_mod.ALERT_IDS:
                others.setdefault((a["id"], a["where"], a["what"]), a)
    found += others.values()
    found.sort(key=lambda a: a["severity"] != "critical")
    return found


def merge_samples(per_part: list[list[Sample]], step: float = 60.0) -> list[Sample]:
    """The partitions' samples of one tier (*step* seconds; each partition's oldest first)
    as the crawl's: one per step any partition has a sample of, each field summed over the
    partitions, a partition without a sample in that step counted with its latest earlier
    one (a partition is sampled only when called: one nobody called has not changed), 0
    before its first; ``workers_alive`` the most of any partition (a worker calls several);
    ``t`` the earliest sample of the step."""
    slots = sorted({int(x.t // step) for samples in per_part for x in samples})
    at = [0] * len(per_part)  # per partition: its samples up to this step
    out = []
    for slot in slots:
        latest: list[Sample] = []
        times = []
        for i, samples in enumerate(per_part):
            while at[i] < len(samples) and int(samples[at[i]].t // step) <= slot:
                at[i] += 1
            if at[i]:
                last = samples[at[i] - 1]
                latest.append(last)
                if int(last.t // step) == slot:
                    times.append(last.t)
        out.append(Sample(t=min(times), due=sum(x.due for x in latest),
                          deferred=sum(x.deferred for x in latest),
                          leased=sum(x.leased for x in latest),
                          parked=sum(x.parked for x in latest),
                          dead=sum(x.dead for x in latest),
                          pages=sum(x.pages for x in latest),
                          items=sum(x.items for x in latest),
                          bans=sum(x.bans for x in latest),
                          workers_alive=max(x.workers_alive for x in latest)))
    return out


def merge_workers(rows: list[dict[str, Any]], now: float | None = None,
                  stall_after: float = AlertConfig.stall_after) -> list[dict[str, Any]]:
    """One row per worker from its rows in every partition (snapshot ``workers[]``): a
    worker's heartbeat record (state, counts, host, pid) is written with its calls to its
    home partition, while its calls to the others only mark it seen (and the time of their
    acknowledgements, its pages' partitions'); the merged row is the latest row with a state
    (else the latest row), seen at the latest of them all, its ``last_ack`` the latest of
    them all, and alive when any partition saw it alive; *now* given, an alive worker is
    ``stalled`` as on one partition (holds leases, acknowledged none for *stall_after*
    seconds) on that latest acknowledgement.  Dead workers last, then by id."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for w in rows:
        by_id.setdefault(w["id"], []).append(w)
    merged = []
    for group in by_id.values():
        latest = max(group, key=lambda r: r["last_seen"])
        full = [r for r in group if r.get("state", "unknown") != "unknown"]
        row = dict(max(full, key=lambda r: r["last_seen"]) if full else latest)
        row["last_seen"] = latest["last_seen"]
        acks = [r["last_ack"] for r in group if r.get("last_ack") is not None]
        row["last_ack"] = max(acks) if acks else None
        if row["health"] == "dead" and latest["health"] != "dead":
            row["health"] = latest["health"]
        if now is not None and row["health"] != "dead":
            stalled = (row.get("leases", 0) > 0 and row["last_ack"] is not None
                       and now - row["last_ack"] > stall_after)
            row["health"] = "stalled" if stalled else "alive"
        merged.append(row)
    return sorted(merged, key=lambda r: (r["health"] == "dead", r["id"]))


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
    out["lastmod"] = _sum([b["lastmod"] for b in blocks])
    out["next_due_in"] = _opt([b["next_due_in"] for b in blocks], min)
    revisits = sum(out["outcomes"].values())
    for share, outcome in (("not_modified_share", "not_modified"),
                           ("unchanged_share", "unchanged"), ("changed_share", "changed")):
        out[share] = round(out["outcomes"][outcome] / revisits, 3) if revisits else None
    out["revisits_per_min"] = None  # (filled by the views' source: monitoring/source.py)
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
    """The snapshot of crawl *keys* in *parts* partitions, the one reader of ``status``,
    ``top``, the dashboard and ``/metrics`` (monitoring/source.py): every partition's
    ``read_snapshot``, one after the other, merged (:func:`merge`).  The merge of one
    snapshot is that snapshot: with *parts* = 1 the crawl's own, as it was read (no
    ``partitions``, ``per_partition`` or ``skew``).  *bound*: each partition's share of
    FLEET_QUEUE_MAX (None: unbounded).

    Raises:
        redis.RedisError: a partition cannot be read.
    """
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    snaps: list[dict[str, Any]] = []
    series: list[dict[str, list[Sample]]] = []  # per partition: its samples, by tier
    for k in keys.all_partitions(parts):
        series.append({})
        snaps.append(read_snapshot(client, k, hosts=hosts, alerts_config=alerts_config,
                                   samples=series[-1], config_key=keys.config))
    if parts == 1:
        return snaps[0]
    return _merged_read(client, keys, snaps, series, hosts, alerts_config, bound)


def _merged_read(client: Any, keys: CrawlKeys, snaps: list[dict[str, Any]],
                 series: list[dict[str, list[Sample]]], hosts: int, alerts_config: Any,
                 bound: int | None) -> dict[str, Any]:
    """:func:`read_merged` of P > 1 partitions: their *snaps* and samples (*series*, by
    tier) merged, each host's counters summed over the partitions (one pipeline each)."""
    parts = len(snaps)
    rows = []
    for k, snap in zip(keys.all_partitions(parts), snaps, strict=True):
        fr = snap["frontier"]
        rows.append({"partition": k.part, "tag": k.base, "slot": slot_of(k.base),
                     "node": node_of(client, k.stats), "queued": fr["due"],
                     "leased": fr["leased"], "deferred": fr["deferred"],
                     "parked": fr["parked"], "dead": fr["dead"], "seen": fr["seen"],
                     "bound": bound, "idle_seconds": snap["idle_seconds"],
                     "acked": snap["counters"]["requests"]["acked"]})
    banned = most_banned(client, keys, parts, max(hosts, 10))
    top = top_hosts(snaps, hosts)
    listed = [h["host"] for h in top]
    names = list(dict.fromkeys(listed + banned))
    per_part = []
    for k in keys.all_partitions(parts) if names else []:
        with client.pipeline(transaction=False) as pipe:
            for h in names:
                pipe.hmget(k.hoststats, f"p|{h}", f"b|{h}", f"f|{h}")
            per_part.append(pipe.execute())
    by_host = {h: {"host": h} for h in names}
    by_host.update((h["host"], h) for h in top)
    totals = {r["host"]: r for r in host_totals([by_host[h] for h in names], per_part)}
    # (a host's bans are recorded in its workers' home partitions: its alert is the sum's)
    out = merge(snaps, rows, hosts, cfg=alerts_config,
                samples1m=merge_samples([one["1m"] for one in series]),
                banned=[totals[h] for h in banned])
    out["hosts"] = [totals[h] for h in listed]
    out["budget"] = budgets.budget_status(client, keys, parts, hosts=False)  # issue 34
    out["sessions"] = pools_summary(client, keys)  # issue 32: under the crawl's own tag
    out["rates"] = merged_rates(
        [(one["10s"], s["counters"], s["started_at"])
         for one, s in zip(series, snaps, strict=True)], out["at"])
    return out


def _value_at(samples: list[Any], now_value: tuple[float, float, float], now: float,
              started: float | None, t: float) -> tuple[float, float, float]:
    """(pages, items, bans) of one partition at time *t*: interpolated between its 10 s
    samples and *now_value* (its counters at *now*); 0 before the partition began (*started*);
    its earliest sample's when *t* is earlier (the ring holds an hour); its counters now
    when it has no sample (no call for an hour: they have not moved)."""
    points = [(x.t, (x.pages, x.items, x.bans)) for x in samples] + [(now, now_value)]
    if t >= now or len(points) == 1:
        return now_value
    if t < points[0][0]:
        return (0.0, 0.0, 0.0) if started is not None and t < started else points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
            return tuple(a + (b - a) * f for a, b in zip(v0, v1, strict=True))  # type: ignore[return-value]
    return now_value


def merged_rates(parts: list[tuple[list[Any], dict[str, Any], float | None]],
                 now: float) -> dict[str, float | None]:
    """The rates of a partitioned crawl over **one** window for every partition (as for one
    partition, docs/monitoring.md ``rates``): pages and items per minute over the last
    60 s, or over the crawl's age while it is younger (from its earliest sample in any
    partition), block rate over the last 5 min (or the age).  *parts*: per partition, its
    10 s samples (series.decode), its snapshot's ``counters`` and ``started_at``; each
    partition's counters at the window's start are read from its samples, interpolated
    between the two around it (a partition nobody called is sampled only when called, so
    the partitions' samples are not at the same times: summing each partition's own rate
    mixed windows, and once the crawl ended the window grew past a minute).  None until the
    window is 1 s long."""
    out: dict[str, float | None] = {"pages_per_min": None, "items_per_min": None,
                                    "block_rate": None, "window_s": None}
    firsts = [samples[0].t for samples, _, _ in parts if samples]
    if not firsts:
        return out
    first = min(firsts)
    nows = [(float(c["pages"]), float(c["items_scraped"]), float(c["bans"]))
            for _, c, _ in parts]

    def total(t: float) -> tuple[float, float, float]:
        vals = [_value_at(samples, v, now, started, t)
                for (samples, _, started), v in zip(parts, nows, strict=True)]
        return (sum(v[0] for v in vals), sum(v[1] for v in vals), sum(v[2] for v in vals))

    pages, items, bans = (sum(v[i] for v in nows) for i in range(3))
    start = max(now - 60, first)
    if now - start >= 1.0:
        p0, i0, _ = total(start)
        span = now - start
        out["pages_per_min"] = round(max(0.0, pages - p0) * 60 / span, 3)
        out["items_per_min"] = round(max(0.0, items - i0) * 60 / span, 3)
        out["window_s"] = round(span, 1)
    p5, _, b5 = total(max(now - 300, first))
    if pages > p5:
        out["block_rate"] = round(max(0.0, bans - b5) / (pages - p5), 6)
    return out


def most_banned(client: Any, keys: CrawlKeys, parts: int, n: int) -> list[str]:
    """The *n* hosts with the most bans summed over the partitions (each partition's
    ``hostbans`` ZSET counts the bans its workers recorded there), most banned first."""
    bans: dict[str, float] = {}
    for k in keys.all_partitions(parts):
        for host, score in client.zrevrange(k.hostbans, 0, n - 1, withscores=True):
            name = host.decode(errors="replace") if isinstance(host, bytes) else str(host)
            bans[name] = bans.get(name, 0) + score
    return [h for h, _ in sorted(bans.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


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


def read_merged_series(client: Any, keys: CrawlKeys, parts: int, names: list[str],
                       tier: str = "10s", since_s: float | None = None
                       ) -> dict[str, list[tuple[float, float | None]]]:
    """Series *names* (``snapshot.SERIES``) of tier *tier* of a crawl in *parts*
    partitions (the one reader of the views' series; one partition's as ``read_series``
    gives them): one ``(step start, value or None)`` per step
    from *since_s* (default: the tier's span) to now, taken from the partitions' samples
    merged step by step (:func:`merge_samples`: a depth is the crawl's, a rate or the block
    rate the summed counters', ``workers_alive`` the most of any partition).  It was each
    partition's series summed: a block rate read the sum of the partitions' ratios, a depth
    dipped at a step a partition was not sampled in.  One round trip (and TIME).

    Raises:
        redis.RedisError: a partition cannot be read.
    """
    from scrapy_fleet.monitoring import series as series_mod
    from scrapy_fleet.monitoring.snapshot import pipe_results

    step, points = series_mod.TIERS[tier]
    srv = client.time(**redis_client.node_of(client, keys.stats))
    now = float(srv[0]) + float(srv[1]) / 1e6
    with client.pipeline(transaction=False) as pipe:
        for k in keys.all_partitions(parts):
            pipe.get(k.series(tier))
        raws = pipe_results(pipe, [None] * parts)  # (a key of another type reads as none)
    per_part = [series_mod.decode(raw, tier, now) for raw in raws]
    # (the merge of one partition's samples is those samples)
    merged = per_part[0] if parts == 1 else merge_samples(per_part, step)
    earliest = now - step * (points - 1)
    since = earliest if since_s is None else max(float(since_s), earliest)
    return {name: series_mod.fill_steps(series_mod.points_of(merged, name), tier, since, now)
            for name in names}

