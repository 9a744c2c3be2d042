"""Where the cockpit's views (``top``, ``/metrics``, the dashboard, the JSON API) get their data.

The views never read Redis keys themselves: :class:`FleetSource` calls the data side's one
reader (``scrapy_fleet.monitoring.merge``: ``read_merged``, ``read_merged_series``, the crawl's
partitions merged, one partition being the crawl's own snapshot; contract in
docs/monitoring.md) and remembers the last error, so that a view can keep showing the last
good data with an error banner while Redis is down.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import redis

from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import merge, sampler
from scrapy_fleet.monitoring import snapshot as snapshot_api

#: what a failed read of Redis raises (connection refused, timeout, a script or type error...)
READ_ERRORS = (redis.RedisError, OSError, RedisUnavailableError)

#: depth series drawn as "queue depth", in the dashboard's and ``top``'s order
DEPTH_SERIES = ("depth_due", "depth_deferred", "depth_leased", "depth_parked", "depth_dead")
#: series a view fetches by default: depth by state, pages per minute, workers alive
VIEW_SERIES = (*DEPTH_SERIES, "pages_per_min", "items_per_min", "block_rate", "workers_alive")

Points = list[tuple[float, float | None]]


class Source(Protocol):
    """What the views read: a snapshot dict (the stable JSON of ``scrapy fleet status
    --json``) and time series of ``(unix seconds, value or None)`` points."""

    def snapshot(self) -> dict[str, Any]: ...

    def series(self, names: Iterable[str], tier: str = "10s",
               since_s: float | None = None) -> dict[str, Points]: ...


class FleetSource:
    """The data of one crawl in *parts* partitions (FLEET_PARTITIONS), read through
    ``monitoring.merge`` (with P > 1: sums, ``per_partition``, ``skew``; each series taken
    from the partitions' samples merged step by step).

    *client*: a blocking redis-py client (thread safe: the server's threads share it);
    *hosts*: how many top hosts a snapshot carries; *bound*: a partition's share of
    FLEET_QUEUE_MAX (None: unbounded).  ``snapshot()`` and ``series()`` raise
    what redis-py raises (see :data:`READ_ERRORS`) and record it: ``last_error`` (message or
    None) and ``error_since`` (unix seconds of the first failure of a run of failures).
    ``read_seconds`` is the duration of the last successful snapshot read.

    Raises:
        ValueError: from ``series()`` for an unknown series name or tier.
    """

    def __init__(self, client: redis.Redis, keys: CrawlKeys, hosts: int = 10,
                 alerts_config: Any = None, parts: int = 1, bound: int | None = None) -> None:
        self._data = snapshot_api
        self.client = client
        self.keys = keys
        self.hosts = hosts
        self.alerts_config = alerts_config
        self.parts = parts
        self.bound = bound
        self.last_error: str | None = None
        self.error_since: float | None = None
        self.read_seconds = 0.0
        self._lock = threading.Lock()
        self._revisits: deque[tuple[float, int]] = deque()

    def _revisit_rate(self, snap: dict[str, Any]) -> dict[str, Any]:
        """*snap* with ``recrawl.revisits_per_min`` (revisits/min): the fleet-wide revisit
        counters (``recrawl.outcomes`` summed) now minus their value at this source's latest
        reading at least 60 s old (else its earliest), over the time between, by the
        snapshot's ``at`` (Redis's clock), as the snapshot's ``rates`` are taken.  None until
        two readings 1 s apart (``top --once``, a first ``/api/snapshot``)."""
        rv = snap.get("recrawl")
        if not isinstance(rv, dict):
            return snap
        total = sum(int(v) for v in (rv.get("outcomes") or {}).values())
        at = float(snap.get("at") or 0.0)
        with self._lock:
            readings = self._revisits
            if readings and at < readings[-1][0]:
                readings.clear()  # (a clock gone back: start again)
            readings.append((at, total))
            while len(readings) > 2 and readings[1][0] <= at - 60:
                readings.popleft()
            then, before = readings[0]
        if at - then >= 1.0:
            rv["revisits_per_min"] = round(max(0, total - before) * 60 / (at - then), 3)
        return snap

    @property
    def series_names(self) -> tuple[str, ...]:
        return tuple(self._data.SERIES)

    @property
    def tiers(self) -> dict[str, tuple[int, int]]:
        return {name: (int(step), int(points)) for name, (step, points)
                in self._data.TIERS.items()}

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.last_error = f"{type(exc).__name__}: {exc}"
            if self.error_since is None:
                self.error_since = time.time()

    def _ok(self) -> None:
        with self._lock:
            self.last_error = None
            self.error_since = None

    def snapshot(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            snap = merge.read_merged(self.client, self.keys, self.parts, self.hosts,
                                     self.alerts_config, self.bound)
        except READ_ERRORS as exc:
            self._failed(exc)
            raise
        self.read_seconds = time.perf_counter() - started
        self._ok()
        return self._revisit_rate(dict(snap))

    def _checked(self, names: Iterable[str], tier: str) -> list[str]:
        """*names* as a list, each a known series, and *tier* a known tier.

        Raises:
            ValueError: naming the unknown series or tier.
        """
        names = list(names)
        known = set(self._data.SERIES)
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown series {', '.join(unknown)} (known: "
                             f"{', '.join(self._data.SERIES)})")
        if tier not in self._data.TIERS:
            raise ValueError(f"unknown tier {tier!r} (known: {', '.join(self._data.TIERS)})")
        return names

    def series(self, names: Iterable[str], tier: str = "10s",
               since_s: float | None = None) -> dict[str, Points]:
        names = self._checked(names, tier)
        try:
            read = merge.read_merged_series(self.client, self.keys, self.parts, names, tier,
                                            since_s)
        except READ_ERRORS as exc:
            self._failed(exc)
            raise
        self._ok()
        return {name: [(float(t), None if v is None else float(v)) for t, v in points]
                for name, points in read.items()}


#: the one line a monitor without the sampler's permission prints (then it stops sampling)
SAMPLING_DENIED = ("warning: the Redis user may not sample the time series ({error}): it is "
                   "a read-only monitor user, so the views show what the workers sample (the "
                   "series pause while no worker runs; docs/monitoring.md)")


class Sampling:
    """A daemon thread that keeps the time series going while no worker runs: it calls the
    data side's ``sampler.sample`` every *interval* seconds (a tier takes at most one sample
    per step fleet-wide, whoever calls, so this never doubles a point; one EVALSHA per
    call; it also drops workers silent for *forget_after* s).  Failures (Redis down, OOM)
    are skipped: the views report Redis's state.

    A Redis user without the sampler's permissions (the read-only ``monitor`` ACL role of
    scrapy_fleet/acl.py: no EVALSHA, no writes) gets NOPERM: the thread then calls *say*
    once with :data:`SAMPLING_DENIED` (default: a line on standard error), keeps the message
    in ``denied`` and stops; the views go on reading what the workers sample."""

    def __init__(self, client: redis.Redis, keys: CrawlKeys, dead_after: float = 6.0,
                 forget_after: float = 120.0, interval: float = 5.0,
                 say: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.keys = keys
        self.interval = interval
        self.dead_after = dead_after
        self.forget_after = forget_after
        self.samples = 0
        self.failures = 0
        self.denied: str | None = None
        self._say = say or _print_line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-sampling", daemon=True)

    def start(self) -> Sampling:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if sampler.sample(self.client, self.keys, self.dead_after, self.forget_after):
                    self.samples += 1
            except redis.exceptions.NoPermissionError as exc:
                self.denied = SAMPLING_DENIED.format(error=exc)
                self._say(self.denied)
                return  # asking again would only fill Redis's ACL LOG
            except READ_ERRORS:
                self.failures += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
