"""Each host's fetch budget for its revisits, and its price of a fetch (docs/recrawl.md).

The adaptive policy gives each page the interval of the optimal allocation (allocation.py) at
its host's price ``mu``.  A host's budget is ``FLEET_RECRAWL_BUDGET`` (a share, 0.8 by default)
of its rate: one request per its politeness interval (the longest of ``FLEET_HOST_RATE``'s,
``DOWNLOAD_DELAY``, its ``FLEET_HOST_OVERRIDES`` entry's and its robots.txt Crawl-delay); a
host without any has no budget.  Its price is the base one (``FLEET_RECRAWL_INTERVAL``'s) while
its pages fit the budget at it, else the smallest that makes them fit (allocation.solve_price).

State in Redis, one HASH per host (keys/crawl.py ``rvb:<host>``): its tracked pages by change-rate
bucket (field ``<bucket>``: pages; field ``r<bucket>``: the sum of their rates) and its price
(field ``mu``, seconds, ``inf``: every page at the max interval); the hosts that have one are
in a SET (keys/crawl.py ``rvh``: status --hosts reads them, recrawl/view.py).  A worker that
schedules a page moves it from the bucket of its old history to the bucket of its new one
(:meth:`HostBudgets.move`, kept in memory), and every :data:`SYNC_PERIOD` seconds adds its
moves to the hosts' HASHes and reads them back in one pipeline, solves the price of each host
it touched from the histogram (at most ``allocation.BUCKETS`` buckets: the cost does not grow
with the host's pages) and writes it.
The same histogram gives the host's prior (:meth:`HostBudgets.prior`): the mean estimated rate
of its pages, the rate a page of the host starts from (schedule.py ``next_interval``).
Every worker computes the same price from the same histogram; a worker's cache is only a
cache (workers stay stateless).

What the histogram misses: a page that leaves the schedule without its worker knowing (dead
letters, a record not stored past ``FLEET_RECRAWL_MAX``, an acknowledgement with a lost lease)
stays counted, which makes its host's price higher (intervals longer) than needed, never
lower: politeness errs on the safe side.  A purge deletes the HASHes with the crawl.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.recrawl.allocation import (
    base_price,
    bucket_rates,
    rate_bucket,
    solve_price,
)
from scrapy_fleet.recrawl.schedule import estimate_rate

if TYPE_CHECKING:
    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.recrawl.settings import RecrawlConfig

#: seconds between a worker's syncs of its hosts' histograms and prices
SYNC_PERIOD = 5.0

logger = logging.getLogger(__name__)


def history_bucket(history: list[int], base: float) -> tuple[int, float]:
    """The histogram bucket of a page with *history* on a host of base interval *base* (its
    estimated rate's: allocation.rate_bucket) and that rate (changes a second)."""
    rate = estimate_rate(history, base)
    return rate_bucket(rate, base), rate


def host_budget(fleet: FleetConfig, host: str, crawl_delay: float = 0.0) -> float | None:
    """Revisits a second *host* may take: FLEET_RECRAWL_BUDGET over its politeness interval
    (seconds: its override's or the fleet's, or its robots.txt *crawl_delay* when longer);
    None when it has no interval (no rate, no delay) or the share is 0."""
    share = fleet.recrawl.budget
    override = fleet.politeness.host_overrides.get(host)
    interval = override[0] if override is not None and override[0] is not None \
        else fleet.politeness.host_interval
    interval = max(interval, crawl_delay)
    if share <= 0 or interval <= 0:
        return None
    return share / interval


def host_price(counts: dict[int, int], config: RecrawlConfig, budget: float | None,
               sums: dict[int, float] | None = None) -> float:
    """The price of a host whose pages are *counts* (bucket -> pages; *sums*: bucket -> the
    sum of their rates), *config* its own (``RecrawlConfig.for_host``)."""
    return solve_price(bucket_rates(counts, config.interval, sums),
                       base_price(config.interval), config.min_interval,
                       config.max_interval, budget)


class HostBudgets:
    """A worker's side of the hosts' budgets (module docstring): its moves not synced yet and
    the prices it read.  *client*: the worker's asyncio Redis client; *keys*: the crawl's."""

    def __init__(self, fleet: FleetConfig, keys: CrawlKeys, client: Any,
                 period: float = SYNC_PERIOD) -> None:
        self.fleet = fleet
        self.keys = keys
        self.client = client
        self.period = period
        #: host -> bucket -> (pages, sum of their rates) moved since the last sync
        self.pending: dict[str, dict[int, tuple[int, float]]] = {}
        self.prices: dict[str, float] = {}
        #: host -> the mean estimated change rate of its tracked pages (changes a second)
        self.priors: dict[str, float] = {}
        self._solved: dict[str, tuple[object, float | None, float]] = {}
        self._last = 0.0
        self._task: asyncio.Future[None] | None = None
        self._warned = False

    def price(self, host: str) -> float | None:
        """*host*'s price as last synced (None: not known yet, the base price applies)."""
        return self.prices.get(host)

    def prior(self, host: str) -> float | None:
        """The change rate (changes a second) a page of *host* starts from: the mean of the
        estimated rates of its pages with a history (its histogram in Redis, fleet-wide, as
        last synced: updated as they are visited); None before any (schedule.py
        ``next_interval``: the base interval's rate then)."""
        return self.priors.get(host)

    def move(self, host: str, old: tuple[int, float] | None,
             new: tuple[int, float] | None) -> None:
        """A page of *host* leaves *old* for *new*, each (bucket, its estimated rate) or None
        (not counted: a first visit, or a page leaving the schedule)."""
        moves = self.pending.setdefault(host, {})
        for side, sign in ((old, -1), (new, 1)):
            if side is not None:
                n, total = moves.get(side[0], (0, 0.0))
                moves[side[0]] = (n + sign, total + sign * side[1])

    def _host_keys(self, host: str) -> CrawlKeys:
        """The keys of *host*'s partition (the crawl's own keys when P is 1)."""
        parts = self.fleet.partitions
        return self.keys.partition(partition_of(host, parts), parts)

    def maybe_sync(self, now: float | None = None) -> None:
        """Start a sync when the last one is over and :attr:`period` has passed (called by the
        middleware with each scheduled page; needs a running asyncio loop)."""
        now = time.monotonic() if now is None else now
        if not self.pending or now - self._last < self.period:
            return
        if self._task is not None and not self._task.done():
            return
        self._last = now
        self._task = asyncio.ensure_future(self.sync())

    async def sync(self) -> None:
        """Add the moves to the hosts' HASHes, read them back, solve and write the prices.
        Written only while the crawl's marker exists (WATCHed: a crawl purged meanwhile gets
        no key back; its moves are dropped); a Redis error keeps the moves for the next sync
        (one WARNING)."""
        batch, self.pending = self.pending, {}
        groups: dict[CrawlKeys, list[str]] = {}
        for host in batch:
            groups.setdefault(self._host_keys(host), []).append(host)
        for hk, hosts in groups.items():
            try:
                replies = await self._exchange(hk, hosts, batch)
            except Exception as exc:
                self._keep(hosts, batch)
                self._warn(exc)
                continue
            if replies is not None:
                await self._solve(hk, hosts, batch, replies)

    def _warn(self, exc: Exception) -> None:
        """One WARNING per worker for a sync that Redis refused (it is tried again)."""
        if not self._warned:
            self._warned = True
            logger.warning("Recrawl budgets not synced (%s): retried in %.0f s", exc,
                           self.period)

    def _keep(self, hosts: list[str], batch: dict[str, dict[int, tuple[int, float]]]) -> None:
        for host in hosts:
            mine = self.pending.setdefault(host, {})
            for bucket, (n, total) in batch[host].items():
                had = mine.get(bucket, (0, 0.0))
                mine[bucket] = (had[0] + n, had[1] + total)

    async def _exchange(self, hk: CrawlKeys, hosts: list[str],
                        batch: dict[str, dict[int, tuple[int, float]]]) -> list[Any] | None:
        """One transaction on partition *hk*: the moves of *hosts* added, the hosts added to
        the set of hosts with a budget, their HASHes and Crawl-delays read; None when the
        crawl's marker is gone (nothing written)."""
        async with self.client.pipeline(transaction=True) as pipe:
            await pipe.watch(hk.marker)
            if not await pipe.exists(hk.marker):
                return None
            pipe.multi()
            for host in hosts:
                key = hk.revisit_budget(host)
                for bucket, (n, total) in batch[host].items():
                    if n:
                        pipe.hincrby(key, str(bucket), n)
                    if total:
                        pipe.hincrbyfloat(key, f"r{bucket}", total)
                pipe.sadd(hk.revisit_hosts, host)
                pipe.hgetall(key)
                pipe.hget(hk.crawldelay, host)
            return list(await pipe.execute())

    async def _solve(self, hk: CrawlKeys, hosts: list[str],
                     batch: dict[str, dict[int, tuple[int, float]]], replies: list[Any]) -> None:
        writes: list[tuple[str, float]] = []
        at = 0
        for host in hosts:
            at += sum(bool(n) + bool(total) for n, total in batch[host].values())
            fields, delay = replies[at + 1], replies[at + 2]  # (at: the SADD's reply)
            at += 3
            counts: dict[int, int] = {}
            sums: dict[int, float] = {}
            for k, v in fields.items():
                name = k.decode()
                if name.startswith("r"):
                    sums[int(name[1:])] = float(v)
                elif name != "mu" and int(v) > 0:
                    counts[int(name)] = int(v)
            pages = sum(counts.values())
            if pages > 0 and sum(sums.values()) > 0:
                self.priors[host] = sum(sums.values()) / pages
            crawl_delay = int(delay) / 1000.0 if delay else 0.0
            budget = host_budget(self.fleet, host, crawl_delay)
            signature = ((tuple(sorted(counts.items())), tuple(sorted(sums.items()))), budget)
            solved = self._solved.get(host)
            if solved is not None and solved[:2] == signature:
                price = solved[2]
            else:
                price = host_price(counts, self.fleet.recrawl.for_host(host), budget, sums)
                self._solved[host] = (*signature, price)
            self.prices[host] = price
            if fields.get(b"mu") != repr(price).encode():
                writes.append((host, price))
        if not writes:
            return
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                await pipe.watch(hk.marker)
                if not await pipe.exists(hk.marker):
                    return
                pipe.multi()
                for host, price in writes:
                    pipe.hset(hk.revisit_budget(host), "mu", repr(price))
                await pipe.execute()
        except Exception as exc:  # the prices are kept here and written at the next sync
            self._warn(exc)

    async def close(self) -> None:
        """Wait for a sync under way, then sync the moves left."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self.pending:
            await self.sync()


def read_prices(client: Any, keys: CrawlKeys, hosts: list[str]) -> dict[str, float]:
    """host -> its price as written in Redis (a blocking *client*; hosts without one left
    out): for status and tests."""
    out = {}
    for host in hosts:
        value = client.hget(keys.revisit_budget(host), "mu")
        if value is not None:
            out[host] = float(value) if value != b"inf" else math.inf
    return out
