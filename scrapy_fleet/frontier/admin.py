"""The blocking frontier client of commands and scripts (:class:`FrontierAdmin`).

It runs the calls of lua/frontier.lua (push): the blocking transport of the call's
description (``call.py``), which the worker's asyncio client (``client.py``) shares; and the
queries of the commands: status (read by ``monitoring/snapshot.py``), hosts, dead letters,
purge.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import redis

from scrapy_fleet import lua, redis_client
from scrapy_fleet.frontier import layout
from scrapy_fleet.frontier.call import FrontierCall, RunScript, Step, WaitReplicas, drive
from scrapy_fleet.frontier.dupecache import DupeCache
from scrapy_fleet.frontier.protocol import (
    CallBatch,
    CallResult,
    FrontierParams,
    as_int,
    queue_size_reads,
    size_of,
)
from scrapy_fleet.frontier.records import as_push
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring.snapshot import read_counts
from scrapy_fleet.politeness.adaptive_view import adaptive_fields, policy_defaults
from scrapy_fleet.politeness.hosts import effective_policy


class FrontierAdmin:
    """Blocking frontier access for commands and scripts: push, status, purge, dead letters.

    Raises:
        RedisUnavailableError: when Redis cannot be reached (message names the URL).
    """

    def __init__(self, url: str, crawl_id: str, prefix: str = "fleet",
                 params: FrontierParams | None = None, timeout: float = 10.0,
                 retries: int = 3, wait_replicas: int = 0, dupe_cache: int = 0, *,
                 keys: CrawlKeys | None = None, client: Any = None) -> None:
        """*keys*: another key set than the crawl's own (one partition's, issue 21);
        *client*: a client to share (the partitions of a crawl share one)."""
        self.url = url
        self.keys = keys or CrawlKeys(prefix, crawl_id)
        self.retries = retries
        self.timeout = timeout
        self._client: Any = client
        self._script: Any = None
        #: the description of this client's frontier calls (frontier/call.py): a command
        #: WAITs after every call (FLEET_REDIS_WAIT_REPLICAS) and requires no crawl marker
        self.calls = FrontierCall(self.keys, params or FrontierParams(), url=url,
                                  dupes=DupeCache(dupe_cache), wait_replicas=wait_replicas,
                                  wait_every_call=True, keep_marker=False)

    @property
    def params(self) -> FrontierParams:
        """The per-crawl constants sent with every call (those of :attr:`calls`)."""
        return self.calls.params

    @params.setter
    def params(self, params: FrontierParams) -> None:
        self.calls.params = params

    @property
    def wait_replicas(self) -> int:
        """FLEET_REDIS_WAIT_REPLICAS: after each call, WAIT for that many replicas."""
        return self.calls.wait_replicas

    @property
    def client(self) -> Any:
        """The blocking client (``redis.Redis``, or ``RedisCluster`` for a cluster URL),
        made on first use.

        Raises:
            RedisUnavailableError: a cluster none of whose start-up nodes answers.
        """
        if self._client is None:
            self._client = redis_client.make_client(self.url, self.timeout)
        return self._client

    def ping(self, role: str | None = None) -> None:
        """PING; with *role* (``worker``, ``monitor``, ``admin``: scrapy_fleet/acl.py) also
        check that the Redis user may run every command of that role.

        Raises:
            RedisUnavailableError: Redis cannot be reached.
            RedisPermissionError: naming the commands the user may not run.
        """
        redis_client.ping_sync(self.client, self.url, self.keys.stats)
        if role is not None:
            from scrapy_fleet import acl

            acl.check_sync(self.client, self.keys, role,
                           cluster=redis_client.is_cluster(self.client))

    def _node(self) -> dict[str, Any]:
        """``target_nodes`` of the crawl's node for keyless commands (TIME, SCAN) on a
        cluster; nothing on one server."""
        return redis_client.node_of(self.client, self.keys.stats)

    def server_ms(self) -> int:
        """The Redis server's clock (of the crawl's node), in milliseconds."""
        seconds, micros = self.client.time(**self._node())
        return int(seconds) * 1000 + int(micros) // 1000

    def call(self, batch: CallBatch, worker: str = "", op_id: str | None = None,
             monitor: bytes = b"") -> CallResult:
        """Run one batch (:meth:`FrontierCall.plan`), blocking, retried with the same op id
        on connection errors.  *op_id* (default: a fresh one) names the call: the same id
        again replays the first reply.  *worker*: the worker id the call is made as ("":
        none); the description of the calls is per worker id (its previous op id).

        Raises:
            CrawlLayoutError: (first call) the crawl was written by another layout.
            RedisUnavailableError: Redis stayed unreachable through :attr:`retries` retries.
        """
        if self._script is None:
            layout.check_sync(self.client, self.keys)  # (once: a crawl of another layout)
            self._script = lua.load(self.client, "frontier.lua")
        self.calls.worker = worker
        return drive(self.calls.plan(batch, monitor, op_id), self._run)

    def _run(self, step: Step) -> Any:
        """The blocking transport of a call's steps (frontier/call.py)."""
        if isinstance(step, RunScript):
            return redis_client.call_retrying(
                lambda: self._script(keys=step.keys, args=step.args), self.url, self.retries)
        if isinstance(step, WaitReplicas):
            return redis_client.wait_replicas(self.client, step.key, step.replicas,
                                              self.timeout)
        return self.client.hmget(step.key, step.entry_ids)

    @property
    def dupes(self) -> DupeCache:
        """Bloom keys known to be in the filter (*dupe_cache* > 0; see DupeCache)."""
        return self.calls.dupes

    @property
    def unreplicated(self) -> int:
        """Calls fewer replicas than :attr:`wait_replicas` acknowledged in time."""
        return self.calls.unreplicated

    def push(self, pushes: Sequence[Sequence[Any]]) -> CallResult:
        """Push entries without parent: :class:`~scrapy_fleet.frontier.records.Push` records
        or tuples ``(bloom_key or b"", priority, payload[, 0, host[, delay ms]])``;
        ``push_flags`` say new/duplicate, ``refused`` which ones the bounds refused."""
        return self.call(CallBatch(pushes=[as_push(p) for p in pushes]))

    def size(self) -> int:
        """Entries the frontier holds against FLEET_QUEUE_MAX: queued + leased + deferred."""
        with self.client.pipeline(transaction=False) as pipe:
            queue_size_reads(pipe, self.keys)
            return size_of(pipe.execute())

    def status(self) -> dict[str, Any]:
        """The frontier's counts (``monitoring.snapshot.read_counts``, the snapshot's own
        reads): ``queued``, ``deferred``, ``leased``, ``parked``, ``dead``, ``size``, ``seen``
        (Bloom), ``workers`` (id -> seconds since its last call), ``idle_seconds``, the start
        requests' state, and ``counters``: the crawl's stats hash (pushed, duplicates, leased,
        acked, ...).

        Raises:
            redis.RedisError: when Redis cannot be read.
        """
        return read_counts(self.client, self.keys)

    def hosts(self, limit: int = 50, config_key: str | None = None) -> list[dict[str, Any]]:
        """Per-host politeness state, busiest hosts first (up to *limit*): ``queued``
        (entries of the host in the frontier), ``leased`` (downloads in flight), ``next_in``
        (seconds until the host may be fetched), ``hold_left`` (s), ``crawl_delay`` (s),
        ``failures`` (consecutive), ``override``, the adaptive controller's figures
        (``politeness.adaptive_view.adaptive_fields``, the reader of the snapshot's
        hosts too), and the policy applied (the defaults from
        the hash *config_key*: this crawl's ``config`` unless given; a partition's are its
        crawl's control ``config``)."""
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.hostq)
            pipe.hgetall(k.hostlive)
            pipe.zrange(k.ready, 0, -1, withscores=True)
            pipe.hgetall(k.hold)
            pipe.hgetall(k.crawldelay)
            pipe.hgetall(k.fails)
            pipe.hgetall(k.hostconf)
            pipe.hgetall(k.adaptive)
            queued, live, ready, hold, delay, fails, conf, adapt = pipe.execute()
        config = self.client.hgetall(config_key or k.config)  # (another slot: the control's)
        now = self.server_ms()  # not in the pipeline: a cluster pipeline refuses TIME
        defaults = policy_defaults(config)
        ready_at = {h: score for h, score in ready}
        names = set(queued) | set(live) | set(hold) | set(ready_at) | set(adapt)
        rows = []
        for h in names:
            at = ready_at.get(h)
            interval, burst, cap, _ = effective_policy(
                defaults, conf[h].decode(errors="replace") if h in conf else None,
                as_int(delay[h], None) if h in delay else None)
            rows.append({
                "host": h.decode(),
                "queued": int(queued.get(h, 0)),
                "leased": int(live.get(h, 0)),
                "next_in": None if at is None or at >= 9e15 else max(0.0, (at - now) / 1000),
                "waits_for_slot": at is not None and at >= 9e15,
                "hold_left": max(0.0, (int(hold.get(h, 0)) - now) / 1000),
                "crawl_delay": int(delay[h]) / 1000 if h in delay else None,
                "failures": int(fails.get(h, 0)),
                "override": conf[h].decode() if h in conf else None,
                # its policy as the lease step applies it (defaults, override, Crawl-delay)
                "interval": interval,
                "rate": round(1 / interval, 3) if interval > 0 else None,
                "burst": burst,
                "cap": cap,
                **adaptive_fields(adapt.get(h), interval),
            })
        rows.sort(key=lambda r: (-r["queued"], -r["leased"], r["host"]))
        return rows[:limit]

    def host_policy(self) -> dict[str, Any] | None:
        """The fleet-wide per-host defaults the workers run with (written by each worker at
        start): {host_key, interval (s, 0: none), rate (per s, or None), burst, cap (0:
        none), is_rate}; None before any worker started."""
        config = self.client.hgetall(self.keys.config)
        if b"host_interval_ms" not in config:
            return None
        defaults = policy_defaults(config)
        interval = int(defaults["host_interval_ms"]) / 1000
        return {"host_key": defaults.get("host_key", "host"), "interval": interval,
                "rate": round(1 / interval, 3) if interval > 0 else None,
                "burst": int(defaults["host_burst"]), "cap": int(defaults["host_concurrency"]),
                "is_rate": bool(int(defaults["host_interval_is_rate"]))}

    def dead_letters(self, limit: int = 100) -> Iterator[dict[str, Any]]:
        """Dead letters as dicts {entry_id, reason, at (ms), data (bytes)}, up to *limit*."""
        n = 0
        for entry_id, raw in self.client.hscan_iter(self.keys.dead, count=100):
            if n >= limit:
                return
            try:
                d = {k.decode(): v for k, v in msgpack.unpackb(raw, raw=True).items()}
                reason = d.get("reason", b"")
                reason = reason.decode(errors="replace") if isinstance(reason, bytes) \
                    else str(reason)
            except Exception:  # not written by the fleet: show it, do not stop the listing
                d, reason = {"data": raw}, "unreadable dead letter (not written by the fleet)"
            yield {"entry_id": entry_id.decode(errors="replace"), "reason": reason,
                   "at": d.get("at"), "data": d.get("data", b"")}
            n += 1

    def has_state(self) -> bool:
        """Whether Redis holds anything of this crawl (one EXISTS): a push writes the entry
        counter, a worker its bounds and heartbeat, every call the counters."""
        k = self.keys
        return bool(self.client.exists(k.seq, k.stats, k.config, k.workers, k.bloom_meta,
                                       k.queue_count, k.dead, k.layout))

    def no_record(self) -> str:
        """Why Redis may hold nothing of this crawl, for a command that found nothing
        (:meth:`has_state` False): never pushed (a typo in the crawl id or the key prefix?),
        purged, or Redis lost its data (restarted without persistence, flushed); with how long
        this Redis has been up, which tells a recent restart apart."""
        k = self.keys
        try:
            info = self.client.info("server", **self._node())
            uptime = f" (this Redis has been up for {_duration(int(info['uptime_in_seconds']))})"
        except (redis.RedisError, KeyError, TypeError, ValueError):
            uptime = ""
        return (f"Redis has no record of crawl {k.crawl_id!r} (key prefix {k.prefix!r}): "
                "nothing was pushed to it, it was purged, or Redis lost its data (restarted "
                f"without persistence, or flushed){uptime}; check the crawl id and the key "
                "prefix")

    def crawl_keys(self) -> list[bytes]:
        return list(self.client.scan_iter(match=self.keys.pattern, count=1000, **self._node()))

    def purge(self) -> int:
        """Delete every key of the crawl (queue, leases, dupefilter, stats...); returns how many."""
        deleted = 0
        batch: list[bytes] = []
        for key in self.client.scan_iter(match=self.keys.pattern, count=1000, **self._node()):
            batch.append(key)
            if len(batch) >= 500:
                deleted += self.client.unlink(*batch)
                batch = []
        if batch:
            deleted += self.client.unlink(*batch)
        return deleted

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"
