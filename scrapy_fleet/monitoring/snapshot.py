"""The one reader of the crawl's state: :func:`read_snapshot`, :func:`read_counts` (the
frontier's counts alone: ``FrontierAdmin.status``) and :func:`read_series`.

All are blocking (a sync redis-py client), take a bounded number of pipelined round trips
(3 for a snapshot, plus the recrawl's one (two with a recrawl: its listed hosts' figures) and
the listed hosts' adaptive controllers' two;
2 for a series) and cost the same whatever the frontier's size: no scan of
entries; hosts are read from the per-host counts, at most ``HOST_SAMPLE`` of them (an exact
top list up to that many hosts in the frontier, a sample beyond, flagged ``hosts_sampled``).
The snapshot's shape is the JSON of ``scrapy fleet status SPIDER --json`` and of the
monitor's ``/api/snapshot``, version :data:`SCHEMA` (docs/monitoring.md documents each field,
its type and unit; tests/e2e/test_status_schema.py checks a real crawl's against it): missing
data reads 0 or None, never absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis

from scrapy_fleet import redis_client
from scrapy_fleet.failures.admin import failed_counts_of
from scrapy_fleet.frontier import budgets
from scrapy_fleet.frontier.protocol import frontier_size
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.monitoring import alerts as alerts_mod
from scrapy_fleet.monitoring import series as series_mod
from scrapy_fleet.monitoring.alerts import AlertConfig
from scrapy_fleet.monitoring.heartbeat import OFFSITE_FIELD
from scrapy_fleet.monitoring.series import SERIES, TIERS
from scrapy_fleet.politeness.adaptive_view import NEVER_ADAPTED, read_adaptive
from scrapy_fleet.sessions.pool import pools_summary

__all__ = ["SCHEMA", "SERIES", "TIERS", "AlertConfig", "read_counts", "read_series",
           "read_snapshot"]

#: the version of the snapshot's shape (``schema``), documented field by field in
#: docs/monitoring.md; raised when a field is renamed or removed
SCHEMA = 2
#: hosts read at most per snapshot (per-host counts, ready hosts for runnable_now)
HOST_SAMPLE = 2000
READY_SAMPLE = 1000
FAR_MS = 9e15  # lua/hosts.lua: a host waiting for a free slot is re-marked at FAR
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
ERROR_KINDS = ("timeout", "dns", "connection", "tls", "other")


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _i(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return default


def _opt_i(value: Any) -> int | None:
    """*value* as an int, None when absent or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _f(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def pipe_results(pipe: Any, defaults: list[Any]) -> list[Any]:
    """Run *pipe*; a reply that is an error (a key of another type, not written by the
    fleet) reads as its default, so that one such key does not stop the snapshot.  Connection
    errors still raise, and so does a refused permission (NOPERM: the Redis user lacks a
    read of the monitor role, docs/deployment.md), which would otherwise read as zeros."""
    replies = pipe.execute(raise_on_error=False)
    for r in replies:
        if isinstance(r, redis.exceptions.NoPermissionError):
            raise r
    return [d if isinstance(r, redis.ResponseError) else r
            for r, d in zip(replies, defaults, strict=True)]


def _now(srv: Any) -> float:
    return float(srv[0]) + float(srv[1]) / 1e6


def counters_of(stats: dict[str, int]) -> dict[str, Any]:
    """The ``counters`` section from the fleet's stats hash (field -> int)."""
    responses = dict.fromkeys(STATUS_CLASSES, 0)
    by_status: dict[str, int] = {}
    for name, n in stats.items():
        if name.startswith("resp/") and len(name) == 8 and name[5:].isdigit():
            by_status[name[5:]] = n
            cls = name[5] + "xx"
            if cls in responses:
                responses[cls] += n
    errors = dict.fromkeys(ERROR_KINDS, 0)
    for name, n in stats.items():
        if name.startswith("errors/") and name != OFFSITE_FIELD:
            kind = name[len("errors/"):]
            errors[kind if kind in errors else "other"] += n
    return {
        "responses": responses,
        "responses_by_status": dict(sorted(by_status.items())),
        "pages": stats.get("pages", 0),
        "items_scraped": stats.get("items_scraped", 0),
        "items_dropped": stats.get("items_dropped", 0),
        "items_failed": stats.get("items_failed", 0),
        "download_errors": errors,
        "requests": {
            "pushed": stats.get("pushed", 0), "duplicate": stats.get("duplicates", 0),
            "leased": stats.get("leased", 0), "acked": stats.get("acked", 0),
            "reclaimed": stats.get("reclaimed", 0),
            "recovered": stats.get("recovered", 0),  # (of reclaimed: dead workers' leases)
            "dead_lettered": stats.get("dead_lettered", 0),
            "dropped": stats.get("dropped", 0),  # deleted by `host drop` (docs/control.md)
            "released": stats.get("released", 0), "parked": stats.get("parked", 0),
            "deferred": stats.get("deferred", 0), "resumed": stats.get("resumed", 0),
            "refused": stats.get("refused", 0), "unstorable": stats.get("unstorable", 0),
            "stale_acks": stats.get("stale_acks", 0), "failed": stats.get("failed", 0),
            "failed_trimmed": stats.get("failed_trimmed", 0),
            "retried": stats.get("retried", 0),
            "bad_queue_members": stats.get("bad_queue_members", 0),
        },
        "bans": stats.get("bans", 0), "rate_limited": stats.get("rate_limited", 0),
        "proxy_bans": stats.get("proxy_bans", 0),
        "robots_denied": stats.get("robots_denied", 0),
        # requests OffsiteMiddleware filtered (a decision, not a download error)
        "offsite_filtered": stats.get(OFFSITE_FIELD, 0),
        "response_bytes": stats.get("response_bytes", 0),
    }


def _before(samples: list[series_mod.Sample], t: float) -> series_mod.Sample | None:
    """The latest sample taken at or before *t*, else the earliest one (None: no sample)."""
    best = None
    for s in samples:
        if s.t <= t:
            best = s
    return best or (samples[0] if samples else None)


def _rates(samples: list[series_mod.Sample], now: float, pages: int, items: int,
           bans: int) -> dict[str, float | None]:
    """Pages and items per minute over the last minute, or over the whole crawl while it is
    younger (``window_s``: the seconds the rates are taken over), block rate over the last
    5 min, from the counters now and the 10 s sample nearest before the window's start.

    A rate is what came since that sample divided by the time since it, per minute: a crawl
    30 s old that fetched 1000 pages reads 2000 pages/min, not 1000 (issue 19: a trailing
    count over 60 s halved the rate of a young crawl).  None until a sample is 1 s old."""
    out: dict[str, float | None] = {"pages_per_min": None, "items_per_min": None,
                                    "block_rate": None, "window_s": None}
    minute = _before(samples, now - 60)
    if minute is not None and now - minute.t >= 1.0:
        span = now - minute.t
        out["pages_per_min"] = round(max(0, pages - minute.pages) * 60 / span, 3)
        out["items_per_min"] = round(max(0, items - minute.items) * 60 / span, 3)
        out["window_s"] = round(span, 1)
    five = _before(samples, now - 300)
    if five is not None and pages > five.pages:
        out["block_rate"] = round(max(0, bans - five.bans) / (pages - five.pages), 6)
    return out


def _eta(samples: list[series_mod.Sample], now: float, depth: int) -> float | None:
    """Seconds until the frontier is empty at the rate its depth fell since its highest point
    of the last 5 min (None while it does not fall, or fell for less than 10 s); 0 when it is
    empty.  From the highest point, not from the sample 5 min ago: a queue that grew (a push,
    the first pages' links) then fell has an ETA as soon as it falls."""
    if depth == 0:
        return 0.0
    window = [s for s in samples if now - 300 <= s.t <= now - 10]
    if not window:
        return None
    peak = max(window, key=lambda s: (s.due + s.deferred + s.leased + s.parked, s.t))
    before = peak.due + peak.deferred + peak.leased + peak.parked
    if before <= depth:
        return None
    return round(depth * (now - peak.t) / (before - depth), 1)


def _worker_row(worker_id: str, seen_ms: float, info: dict[str, str], now: float,
                cfg: AlertConfig) -> dict[str, Any]:
    parts = worker_id.rsplit(":", 2)
    host = info.get("h") or (parts[0] if len(parts) == 3 else worker_id)
    pid = _i(info.get("pid"), _i(parts[1]) if len(parts) == 3 else 0)
    started = _f(info.get("sa")) or (_f(parts[2]) if len(parts) == 3 else None)
    last_seen = max(seen_ms, _i(info.get("seen"))) / 1000
    leases = _i(info.get("l"))
    last_ack = _i(info.get("la")) / 1000 or None
    if now - last_seen > cfg.dead_after:
        health = "dead"
    elif leases > 0 and last_ack is not None and now - last_ack > cfg.stall_after:
        health = "stalled"
    else:
        health = "alive"
    return {
        "id": worker_id, "host": host, "pid": pid, "started_at": started,
        "state": info.get("st") or "unknown", "health": health, "leases": leases,
        "downloads": _i(info.get("dl")), "pages": _i(info.get("pg")),
        "items": _i(info.get("it")), "errors": _i(info.get("er")),
        "scrapy_version": info.get("sv"), "fleet_version": info.get("fv"),
        "role": info.get("ro") or "all",  # FLEET_ROLE: all, fetch or parse (stages)
        "last_seen": round(last_seen, 3),
        "last_ack": None if last_ack is None else round(last_ack, 3),
    }


def _host_cap(conf: Any, default: int) -> int:
    """Concurrency cap of a host from its ``hostconf`` value "T|burst|cap" (0: none)."""
    if conf:
        parts = _s(conf).split("|")
        if len(parts) >= 3 and parts[2] not in ("", "-"):
            return _i(parts[2], default)
    return default


def read_snapshot(client: redis.Redis, keys: CrawlKeys, *, hosts: int = 10,
                  alerts_config: AlertConfig | None = None,
                  samples: dict[str, list[series_mod.Sample]] | None = None,
                  config_key: str | None = None) -> dict[str, Any]:
    """The crawl's state now, as a JSON-safe dict (module docstring; docs/monitoring.md).

    *hosts*: how many hosts to list (busiest by queued entries first).  *samples*: a dict
    to receive the samples read, by tier (``10s``, ``1m``: what a partitioned crawl's
    merge needs of each partition, monitoring/merge.py).  *config_key*: the hash of the
    fleet's per-host defaults (the listed hosts' adaptive ceilings): *keys*' ``config``
    unless given (a partition's are its crawl's control ``config``).

    Raises:
        redis.RedisError: when Redis cannot be read (connection, authentication...).
    """
    snap = _read(client, keys, hosts, alerts_config, samples, config_key)
    # budgets (issue 34): a partition's figures are replaced by the crawl's (merge.py)
    snap["budget"] = budgets.budget_status(client, keys, hosts=False)
    # session pools (issue 32): under the crawl's own tag; a partition's replaced (merge.py)
    snap["sessions"] = pools_summary(client, keys)
    return snap


def read_counts(client: redis.Redis, keys: CrawlKeys) -> dict[str, Any]:
    """The frontier's counts alone (``FrontierAdmin.status``), one pipelined round trip and
    the server's clock, with the snapshot's own reads: ``crawl_id``; ``queued``, ``deferred``,
    ``leased``, ``parked``, ``dead`` entries; ``size`` (queued + deferred + leased: what
    FLEET_QUEUE_MAX bounds); ``seen`` (Bloom fingerprints), ``bloom_slices``; ``counters``
    (the crawl's stats hash as read: field -> int, 0 for a value that is not a number);
    ``workers`` (worker id -> seconds since its last call); ``idle_seconds`` (None: busy);
    ``seeded_by``, ``start_requests`` ("done", "in progress" or None); ``stored_responses``,
    ``stored_bytes`` (stages).

    Raises:
        redis.RedisError: when Redis cannot be read (connection, authentication...).
    """
    with client.pipeline(transaction=False) as pipe:
        replies = pipe_results(pipe, _frontier_reads(pipe, keys))
    # not in the pipeline: a cluster pipeline refuses TIME
    fr = _Frontier.of(replies, _now_ms(client.time(**redis_client.node_of(client, keys.stats))))
    return {
        "crawl_id": keys.crawl_id, "queued": fr.due, "leased": fr.leased, "dead": fr.dead,
        "deferred": fr.deferred, "parked": fr.parked, "size": fr.size, "seen": fr.seen,
        "bloom_slices": fr.bloom_slices, "counters": fr.stats,
        "workers": {w: round((fr.now_ms - score) / 1000, 1) for w, score in fr.workers},
        "idle_seconds": fr.idle_seconds, "seeded_by": fr.seeded_by,
        "start_requests": fr.start_requests, "stored_responses": fr.stored,
        "stored_bytes": fr.stats.get("response_queue_bytes", 0),
    }


def _frontier_reads(pipe: Any, k: CrawlKeys) -> list[Any]:
    """Queue on *pipe* the reads of the frontier's counts (:class:`_Frontier`); returns the
    default of each reply (for :func:`_results`)."""
    pipe.get(k.queue_count)  # due: the buckets' count
    pipe.zcard(k.deferred)
    pipe.zcard(k.leases)
    pipe.llen(k.parked)
    pipe.hlen(k.dead)
    pipe.hgetall(k.bloom_meta)
    pipe.hgetall(k.stats)
    pipe.zrange(k.workers, 0, -1, withscores=True)
    pipe.hget(k.hostq, STAGE_HOST)  # stages: stored responses
    pipe.get(k.idle_since)
    pipe.hmget(k.seeding, "holder", "progress", "done")
    return [None, 0, 0, 0, 0, {}, {}, [], None, None, [None, None, None]]


@dataclass(frozen=True)
class _Frontier:
    """The frontier's counts, from the replies of :func:`_frontier_reads`."""

    now_ms: int  #: the Redis server's clock
    due: int
    deferred: int  #: entries waiting for a later time (the ``deferred`` ZSET)
    leased: int
    parked: int
    dead: int
    seen: int
    bloom_slices: int
    stats: dict[str, int]  #: the stats hash, field -> int
    workers: list[tuple[str, float]]  #: (worker id, last call in ms)
    stored: int
    idle_ms: int | None
    seeded_by: str | None
    seeding_done: bool

    @classmethod
    def of(cls, replies: list[Any], now_ms: int) -> _Frontier:
        (bucketed, deferred, leased, parked, dead, meta, raw_stats, workers, stored, idle,
         seeded) = replies
        meta_s = {_s(a): _s(b) for a, b in meta.items()}
        holder, _, done = [*(seeded or []), None, None, None][:3]
        return cls(
            now_ms=now_ms, due=_i(bucketed), deferred=_i(deferred), leased=_i(leased),
            parked=_i(parked), dead=_i(dead),
            seen=sum(_i(v) for name, v in meta_s.items() if name.startswith("c")),
            bloom_slices=_i(meta_s.get("slices", 0)),
            stats={_s(a): _i(b) for a, b in raw_stats.items()},
            workers=[(_s(w), float(score)) for w, score in workers], stored=_i(stored),
            idle_ms=_opt_i(idle),
            seeded_by=_s(holder) if holder else None, seeding_done=done == b"1")

    @property
    def size(self) -> int:
        return frontier_size(self.due, self.leased, self.deferred)

    @property
    def idle_seconds(self) -> float | None:
        return None if self.idle_ms is None else round((self.now_ms - self.idle_ms) / 1000, 1)

    @property
    def start_requests(self) -> str | None:
        if self.seeding_done:
            return "done"
        return "in progress" if self.seeded_by else None


def _now_ms(srv: Any) -> int:
    """TIME's reply in whole milliseconds."""
    return int(srv[0]) * 1000 + int(srv[1]) // 1000


def _read(client: redis.Redis, keys: CrawlKeys, hosts: int,
          alerts_config: AlertConfig | None,
          samples: dict[str, list[series_mod.Sample]] | None = None,
          config_key: str | None = None) -> dict[str, Any]:
    cfg = alerts_config or AlertConfig()
    k = keys
    # keyless commands (TIME, INFO) go to the crawl's node apart: a cluster pipeline refuses
    # them (redis_client.node_of is {} on one server)
    node = redis_client.node_of(client, k.stats)
    srv = client.time(**node)
    memory = client.info("memory", **node)
    with client.pipeline(transaction=False) as pipe:
        defaults = _frontier_reads(pipe, k)
        pipe.hgetall(k.mon)
        pipe.get(k.series("10s"))
        pipe.get(k.series("1m"))
        pipe.hlen(k.hostq)
        pipe.hget(k.config, "host_concurrency")
        pipe.zrevrange(k.hostbans, 0, max(hosts, 10) - 1, withscores=True)
        pipe.hlen(k.failed)
        pipe.hgetall(k.failed_by)  # a few reasons: what the alerts on kept records read
        replies1 = pipe_results(pipe, [*defaults, {}, None, None, 0, None, [], 0, {}])
    now = _now(srv)
    now_ms = int(now * 1000)
    fr = _Frontier.of(replies1[:len(defaults)], _now_ms(srv))
    (mon, raw10, raw1m, n_hosts, conf_cap, top_banned, failed,
     failed_by) = replies1[len(defaults):]
    due, deferred, leased, parked = fr.due, fr.deferred, fr.leased, fr.parked
    stats = fr.stats
    default_cap = _i(conf_cap)
    worker_ids = fr.workers

    with client.pipeline(transaction=False) as pipe:
        for wid, _ in worker_ids:
            pipe.hgetall(k.worker_info(wid))
        if n_hosts <= HOST_SAMPLE:
            pipe.hgetall(k.hostq)
        else:
            pipe.hscan(k.hostq, 0, count=HOST_SAMPLE)
        pipe.zcount(k.ready, "-inf", now_ms)
        pipe.zrangebyscore(k.ready, "-inf", now_ms, start=0, num=READY_SAMPLE)
        replies = pipe_results(pipe, [{}] * len(worker_ids)
                           + [{} if n_hosts <= HOST_SAMPLE else (0, {}), 0, []])
    infos = replies[:len(worker_ids)]
    raw_hostq, n_ready, ready_hosts = replies[len(worker_ids):]
    if n_hosts > HOST_SAMPLE:
        raw_hostq = raw_hostq[1]
    hostq = {_s(h): _i(n) for h, n in raw_hostq.items()}
    top = sorted(hostq.items(), key=lambda kv: (-kv[1], kv[0]))[:max(hosts, 0)]
    banned = [(_s(h), int(score)) for h, score in top_banned]
    names = list(dict.fromkeys([h for h, _ in top] + [h for h, _ in banned]))
    ready = [_s(h) for h in ready_hosts]

    with client.pipeline(transaction=False) as pipe:
        for h in names:
            pipe.hmget(k.hoststats, f"p|{h}", f"b|{h}", f"f|{h}")
        pipe.hmget(k.hostlive, names) if names else pipe.exists(k.stats)
        pipe.hmget(k.hold, names) if names else pipe.exists(k.stats)
        pipe.hmget(k.hostq, ready) if ready else pipe.exists(k.stats)
        pipe.hmget(k.hostconf, ready) if ready else pipe.exists(k.stats)
        pipe.hmget(k.hostlive, ready) if ready else pipe.exists(k.stats)
        replies = pipe_results(pipe, [[None] * 3] * len(names) + [[None] * len(names)] * 2
                           + [[None] * len(ready)] * 3)
    host_stats = replies[:len(names)]
    live, hold, ready_q, ready_conf, ready_live = replies[len(names):]

    # runnable_now: leases in flight plus, over the hosts that may be fetched now, what
    # each host's concurrency cap lets start beside its downloads in flight (a sample of
    # READY_SAMPLE hosts, scaled)
    runnable_ready = 0
    if ready:
        for q, conf, lv in zip(ready_q, ready_conf, ready_live, strict=True):
            flying = _i(lv)
            waiting = max(0, _i(q) - flying)
            cap = _host_cap(conf, default_cap)
            runnable_ready += min(waiting, max(0, cap - flying)) if cap > 0 else waiting
        if n_ready > len(ready):
            runnable_ready = int(runnable_ready * n_ready / len(ready))
    runnable_now = leased + min(due, runnable_ready)

    host_rows = {}
    for h, (p, b, first) in zip(names, host_stats, strict=True):
        pages_h, bans_h = _i(p), _i(b)
        host_rows[h] = {
            "host": h, "queued": hostq.get(h, 0), "leased": 0, "pages": pages_h,
            "bans": bans_h, "block_rate": round(bans_h / pages_h, 6) if pages_h else None,
            "hold_until": None, "first_ban": _i(first) / 1000 or None, **NEVER_ADAPTED,
        }
    if names:
        for h, lv, hd in zip(names, live, hold, strict=True):
            host_rows[h]["leased"] = _i(lv)
            until = _i(hd)
            host_rows[h]["hold_until"] = until / 1000 if until > now_ms else None

    # adaptive politeness (issue 35): each listed host's controller, by status --hosts's
    # reader (politeness/adaptive_view.py)
    for h, fields in read_adaptive(client, k, [h for h, _ in top], config_key).items():
        host_rows[h].update(fields)
    samples10 = series_mod.decode(raw10, "10s", now)
    samples1m = series_mod.decode(raw1m, "1m", now)
    if samples is not None:
        samples.update({"10s": samples10, "1m": samples1m})
    counters = counters_of(stats)
    rates = _rates(samples10, now, counters["pages"], counters["items_scraped"],
                   counters["bans"])
    depth = due + deferred + leased + parked
    rows = [_worker_row(wid, score, {_s(a): _s(b) for a, b in info.items()}, now, cfg)
            for (wid, score), info in zip(worker_ids, infos, strict=True)]
    rows.sort(key=lambda r: (r["health"] == "dead", r["id"]))
    mem = {"used_memory": _i(memory.get("used_memory")),
           "maxmemory": _i(memory.get("maxmemory"))}
    mon_s = {_s(a): _s(b) for a, b in mon.items()}
    snap: dict[str, Any] = {
        "schema": SCHEMA,
        "crawl": k.crawl_id,
        "at": round(now, 3),
        "frontier": {"due": due, "deferred": deferred, "leased": leased, "parked": parked,
                     "dead": fr.dead, "failed": _i(failed), "seen": fr.seen, "depth": depth,
                     "size": fr.size, "bloom_slices": fr.bloom_slices,
                     # stages: stored responses waiting for (or in) a parse worker, and
                     # those deferred (their links' hosts full: docs/stages.md)
                     "stored": fr.stored, "stored_bytes": stats.get("response_queue_bytes", 0),
                     "stored_deferred": stats.get("response_queue_deferred", 0),
                     "stored_deferred_bytes": stats.get("response_queue_deferred_bytes", 0)},
        "counters": counters,
        "rates": rates,
        # no page fetched over the last minute: nothing drains the frontier (no worker
        # alive, or every host held), so no ETA from an earlier fall
        "eta_seconds": (None if depth and rates["pages_per_min"] == 0
                        else _eta(samples10, now, depth)),
        "runnable_now": runnable_now,
        "workers": rows,
        "workers_alive": sum(1 for r in rows if r["health"] != "dead"),
        "hosts": [host_rows[h] for h, _ in top],
        "hosts_total": n_hosts,
        "hosts_sampled": n_hosts > HOST_SAMPLE,
        "hosts_ready": n_ready,
        "alerts": [],
        "failed_by": failed_counts_of(failed_by),
        "redis": mem,
        "started_at": _i(mon_s.get("t0")) / 1000 or None,
        "last_ack_at": _i(mon_s.get("la")) / 1000 or None,
        "last_worker_at": _i(mon_s.get("lw")) / 1000 or None,
        "idle_seconds": fr.idle_seconds,
        "start_requests": {"state": fr.start_requests, "seeded_by": fr.seeded_by},
    }
    snap["alerts"] = alerts_mod.evaluate(snap, samples1m, [host_rows[h] for h, _ in banned],
                                         cfg)
    # recrawl (issue 22): its figures, one pipeline more (recrawl/status.py); with a
    # recrawl, each listed host's learned change rate and price by status --hosts's reader
    # (recrawl/view.py), one pipeline more (issue 31)
    from scrapy_fleet.recrawl.status import read_recrawl
    from scrapy_fleet.recrawl.view import host_recrawl, read_hosts

    snap["recrawl"] = rv = read_recrawl(client, k, _now_ms(srv))
    listed = [h for h, _ in top]
    figures = (read_hosts(client, k, listed) if rv["tracked"] or rv["tracked_total"]
               else {})
    for h in listed:
        host_rows[h].update(figures.get(h) or host_recrawl({}))
    # crawl control (issue 34, docs/control.md)
    from scrapy_fleet.frontier.control import read_state

    snap["control"] = read_state(client, k, _now_ms(srv))  # (None: never used)
    return snap


def read_series(client: redis.Redis, keys: CrawlKeys, name: str, tier: str = "10s",
                since_s: float | None = None) -> list[tuple[float, float | None]]:
    """Series *name* (one of :data:`SERIES`) of tier *tier* (one of :data:`TIERS`): one
    ``(step start, value or None)`` per step from *since_s* (unix seconds; default: the
    tier's whole span) to now, oldest first.

    Raises:
        ValueError: unknown *name* or *tier*.
        redis.RedisError: when Redis cannot be read.
    """
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}: one of {', '.join(TIERS)}")
    if name not in SERIES:
        raise ValueError(f"unknown series {name!r}: one of {', '.join(SERIES)}")
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.get(keys.series(tier))
        srv, raw = pipe_results(pipe, [None, None])
    now = _now(srv)
    step, points = TIERS[tier]
    earliest = now - step * (points - 1)
    since = earliest if since_s is None else max(float(since_s), earliest)
    samples = series_mod.decode(raw, tier, now)
    values = series_mod.points_of(samples, name)
    return series_mod.fill_steps(values, tier, since, now)
