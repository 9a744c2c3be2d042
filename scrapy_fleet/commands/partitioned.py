"""The crawl commands for every P (issue 33): ``push``, ``status``, ``shards``, ``purge``,
``dead``, ``failed`` and ``retry`` run over the crawl's partitions, and a crawl of
FLEET_PARTITIONS = 1 is one partition (``CrawlKeys.partition(0, 1)`` is the crawl's own keys,
:func:`partition_admins` the crawl's own admin).  What only P > 1 adds is said in the output:
``(P partitions)``, ids ``<p>:<id>``, ``status``'s table per partition and its skew
(docs/partitions.md).  ``top`` and ``monitor`` read the same merged snapshot
(monitoring/merge.py ``read_merged``).

A command learns P from the crawl (its ``partitions`` key); a command run inside a project
whose FLEET_PARTITIONS differs from it is refused (frontier/partition_count.py
``start_sync``).  Each ``run_*`` returns an exit status (commands/registry.py ``EXIT_STATUSES``).
"""

from __future__ import annotations

import heapq
import json
import sys
from collections.abc import Callable
from typing import Any

import redis

from scrapy_fleet import codec
from scrapy_fleet.commands import budget as budget_commands
from scrapy_fleet.commands import push, sessions
from scrapy_fleet.commands.actions import (
    add_host_rows,
    print_host_rows,
    purge_confirmed,
    utc,
    warn_live_workers,
)
from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallResult
from scrapy_fleet.frontier.records import as_push
from scrapy_fleet.frontier.routing import entry_ref, partition_params
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.recrawl import view as recrawl_view


def partition_admins(admin: FrontierAdmin, parts: int) -> list[FrontierAdmin]:
    """One FrontierAdmin per partition of *parts*, sharing *admin*'s client: its keys those
    of the partition, FLEET_QUEUE_MAX split over the partitions, *admin*'s
    FLEET_REDIS_WAIT_REPLICAS.  With *parts* = 1, ``[admin]`` itself (its keys are the
    partition's)."""
    if parts == 1:
        return [admin]
    return [FrontierAdmin(admin.url, admin.keys.crawl_id, admin.keys.prefix,
                          partition_params(admin.params, parts), admin.timeout,
                          admin.retries, admin.wait_replicas, keys=keys,
                          client=admin.client)  # one client: a cluster client routes a key
            for keys in admin.keys.all_partitions(parts)]


def _where(parts: int, sep: str = " (", end: str = ")") -> str:
    """What a line adds for a crawl in *parts* partitions ("" for one)."""
    return f"{sep}{parts} partitions{end}" if parts > 1 else ""


class PartitionedPush:
    """What ``push.push_lines`` needs of an admin, for a crawl in *parts* partitions: each
    batch split by the partition of its entries' hosts, one frontier call per partition
    (``FrontierAdmin.push``); with *parts* = 1 that is the crawl's one call.  ``size`` is
    that of the fullest partition times P (a push waiting for room waits for the partition
    that refused it); ``unreplicated`` sums the partitions' calls that
    FLEET_REDIS_WAIT_REPLICAS replicas did not acknowledge in time."""

    def __init__(self, admin: FrontierAdmin, parts: int) -> None:
        self.admin = admin
        self.parts = parts
        self.keys = admin.keys
        self.params = admin.params
        self.url = admin.url
        self.wait_replicas = admin.wait_replicas
        self._admins = partition_admins(admin, parts)
        #: per partition, (rows, reply) of a call that went through in a push another
        #: partition then refused (out of memory: push_lines pushes the batch again): the
        #: same rows pushed again take that reply instead of running a second time
        self._answered: dict[int, tuple[list[tuple[Any, ...]], CallResult]] = {}

    @property
    def unreplicated(self) -> int:
        return sum(one.unreplicated for one in self._admins)

    def size(self) -> int:
        return max(a.size() for a in self._admins) * self.parts

    def push(self, pushes: list[tuple[Any, ...]]) -> CallResult:
        """Push *pushes* (``FrontierAdmin.push``'s rows; the host is field 4) into their
        partitions; one reply with indexes into *pushes*.

        Raises:
            redis.ResponseError: a partition refused its call (the calls that went through
                are kept: the same batch pushed again takes their replies).
        """
        per: dict[int, list[int]] = {}
        for i, p in enumerate(pushes):
            per.setdefault(partition_of(as_push(p).host, self.parts), []).append(i)
        flags = [0] * len(pushes)
        refused: list[int] = []
        pushed = dups = size = 0
        answered, self._answered = self._answered, {}
        done: dict[int, tuple[list[tuple[Any, ...]], CallResult]] = {}
        for q, idx in sorted(per.items()):
            rows = [pushes[i] for i in idx]
            if q in answered and answered[q][0] == rows:
                res = answered[q][1]
            else:
                try:
                    res = self._admins[q].push(rows)
                except redis.ResponseError:
                    self._answered = done  # (the partitions before it went through)
                    raise
            done[q] = (rows, res)
            for j, i in enumerate(idx):
                flags[i] = res.push_flags[j]
            refused += [idx[j] for j in res.refused]
            pushed += res.pushed
            dups += res.duplicates
            if res.refused:
                size = max(size, res.size * self.parts)
        return CallResult(leased=[], lost=[], push_flags=flags, refused=sorted(refused),
                          pushed=pushed, duplicates=dups, acked=0, released=0, reclaimed=0,
                          dead_lettered=0, parked=0, deferred=0, resumed=0, queued=0,
                          inflight=0, deferred_now=0, size=size, idle_ms=-1, now_ms=0,
                          bloom_full=False)


def read_status(admin: FrontierAdmin, parts: int, hosts: int = 10,
                alerts_config: Any = None) -> dict[str, Any]:
    """The schema-2 snapshot of the crawl, its *parts* partitions merged
    (monitoring/merge.py ``read_merged``; with P > 1 ``partitions``, ``per_partition`` and
    ``skew`` added).

    Raises:
        redis.RedisError: a partition cannot be read.
    """
    from scrapy_fleet.monitoring import merge

    return merge.read_merged(admin.client, admin.keys, parts, hosts, alerts_config,
                             partition_params(admin.params, parts).queue_max)


def run_status(admin: FrontierAdmin, opts: Any, label: str, parts: int = 1,
               low_watermark: int | None = None, alerts_config: Any = None) -> int:
    """``status``: the snapshot (``--json``: schema 2, with ``queue_max`` and
    ``low_watermark``), or the screen (P > 1: a row per partition and the skew line)."""
    from scrapy_fleet.monitoring import screen

    limit = getattr(opts, "limit", 10)
    snap = read_status(admin, parts, limit, alerts_config)
    status = {**snap, "queue_max": admin.params.queue_max, "low_watermark": low_watermark}
    host_budgets = budget_commands.add_status(status, admin.client, admin.keys, parts)
    if getattr(opts, "hosts", False):
        rows = host_rows(admin, parts, limit)
        add_host_rows(status, rows, admin.host_policy(), recrawl_view.read_hosts(
            admin.client, admin.keys, [row["host"] for row in rows], parts))
        budget_commands.add_host_rows(status["hosts"], host_budgets)
        status["recrawl_hosts"] = recrawl_view.recrawl_hosts(admin.client, admin.keys, parts,
                                                             limit)
    # session pools: under the crawl's own tag, as the cookie jars (docs/sessions.md)
    status["sessions"] = sessions.summary(admin)
    if getattr(opts, "json", False):
        print(json.dumps(status, indent=2, sort_keys=True))
        return push.EXIT_OK
    print(screen.render(snap, label + _where(parts, ", ", ""), admin.params.queue_max,
                        low_watermark))
    fr = snap["frontier"]
    if fr["stored"]:  # stages: fetch workers' responses for parse workers
        print(f"  stored   {fr['stored']} responses ({fr['stored_bytes']} bytes) for parse "
              "workers")
    print(failures.failed_status_line(snap["failed_by"], snap["counters"]["requests"]))
    line = sessions.status_line(status["sessions"])
    if line:
        print(line)
    if parts > 1:
        print_partition_rows(snap)
    if getattr(opts, "hosts", False):
        print_host_rows(status)
        budget_commands.print_host_lines(status["hosts"])
    return push.EXIT_OK


def print_partition_rows(snap: dict[str, Any]) -> None:
    """``status``'s table of a partitioned crawl: a row per partition, then the skew."""
    print(f"  {'part':>4} {'node':<21} {'queued':>8} {'leased':>7} {'deferred':>8} "
          f"{'parked':>6} {'bound':>8} {'idle':>7}")
    for r in snap["per_partition"]:
        idle = "-" if r["idle_seconds"] is None else f"{r['idle_seconds']:.0f}s"
        print(f"  {r['partition']:>4} {r['node'] or 'local':<21} {r['queued']:>8} "
              f"{r['leased']:>7} {r['deferred']:>8} {r['parked']:>6} "
              f"{r['bound'] or '-':>8} {idle:>7}")
    print(f"  skew: the fullest partition holds {snap['skew']}x the mean of queued entries"
          if any(r["queued"] for r in snap["per_partition"]) else "  skew: - (nothing queued)")


def host_rows(admin: FrontierAdmin, parts: int, limit: int) -> list[dict[str, Any]]:
    """``status --hosts``: every partition's hosts (a host's entries and politeness state
    live in one partition), busiest first, up to *limit*; the policy defaults from the
    crawl's control ``config``."""
    rows = [row for one in partition_admins(admin, parts)
            for row in one.hosts(limit=limit, config_key=admin.keys.config)]
    rows.sort(key=lambda r: (-r["queued"], -r["leased"], r["host"]))
    return rows[:limit]


def run_shards(admin: FrontierAdmin, opts: Any, parts: int) -> int:
    """Which master holds which partition (``shards``); moving one is Redis Cluster's own
    ``redis-cli --cluster reshard`` of its slot (docs/partitions.md)."""
    from scrapy_fleet.monitoring.merge import node_of, slot_of

    rows = [{"partition": keys.part, "tag": keys.base, "slot": slot_of(keys.base),
             "node": node_of(admin.client, keys.stats) or "local"}
            for keys in admin.keys.all_partitions(parts)]
    if getattr(opts, "json", False):
        print(json.dumps(rows, indent=2))
        return push.EXIT_OK
    by_node: dict[str, list[int]] = {}
    for r in rows:
        by_node.setdefault(str(r["node"]), []).append(int(str(r["partition"])))
        print(f"  partition {r['partition']:>3}  slot {r['slot']:>5}  {r['node']:<21} "
              f"{r['tag']}")
    for node, ps in sorted(by_node.items()):
        print(f"  {node}: {len(ps)} partition(s)")
    return push.EXIT_OK


def has_state(admin: FrontierAdmin, parts: int) -> bool:
    """Whether Redis holds anything of the crawl in any of its *parts* partitions (one EXISTS
    per partition: FrontierAdmin.has_state)."""
    return any(one.has_state() for one in partition_admins(admin, parts))


def run_purge(admin: FrontierAdmin, opts: Any, label: str, parts: int,
              confirm: Callable[[str], str] = input) -> int:
    """``purge`` of every partition and of the crawl's own keys: nothing to purge (exit 0)
    when Redis holds no key of the crawl, a warning when workers called it in the last 60 s,
    a question unless ``--yes``."""
    admins = partition_admins(admin, parts)
    others = [one for one in admins if one is not admin]  # (none with P = 1)
    found = len(admin.crawl_keys()) + sum(len(one.crawl_keys()) for one in others)
    if not found:
        print(f"nothing to purge for crawl {admin.keys.crawl_id!r}")
        return push.EXIT_OK
    warn_live_workers(sorted({w for one in admins for w, age in one.status()["workers"].items()
                              if age < 60}))
    if not opts.yes and not purge_confirmed(
            confirm, f"Delete {found} keys of crawl {admin.keys.crawl_id!r} ({label})"
                     f"{_where(parts, ' in its ', '')}: queue, leases, dupefilter, stats? [y/N] "):
        return push.EXIT_REJECTED
    deleted = sum(one.purge() for one in others)
    deleted += admin.purge()  # the crawl's own keys (P > 1: the control keys, partitions last)
    print(f"purged {deleted} keys of crawl {admin.keys.crawl_id!r}{_where(parts)}")
    return push.EXIT_OK


def _ref(parts: int, part: int, entry_id: str) -> str:
    """An entry's or a record's id as the commands show it (``<p>:<id>`` when P > 1)."""
    return entry_ref(part, entry_id) if parts > 1 else entry_id


def run_dead(admin: FrontierAdmin, opts: Any, parts: int = 1) -> int:
    """``dead``: the dead letters of every partition, up to ``--limit``."""
    rows = []
    for one in partition_admins(admin, parts):
        for letter in one.dead_letters(limit=opts.limit):
            try:
                url = codec.decode_dict(letter["data"])["url"]
            except RequestDecodeError:
                url = None
            rows.append({"entry_id": _ref(parts, one.keys.part, letter["entry_id"]),
                         "reason": letter["reason"], "url": url, "at_ms": letter["at"]})
    rows = rows[:opts.limit] if opts.limit > 0 else rows
    if opts.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['entry_id']}  {row['url'] or '<undecodable>'}  {row['reason']}")
        print(f"{len(rows)} dead letter(s) shown{_where(parts)}")
    return push.EXIT_OK


def run_failed(admin: FrontierAdmin, opts: Any, parts: int = 1) -> int:
    """``failed``: every partition's failed requests, oldest first (each partition's are),
    the most recent ``--limit`` shown."""
    per = [[dict(rec.to_json(), id=_ref(parts, one.keys.part, rid))
            for rid, rec in failures.failed_records(one.client, one.keys, opts.reason)]
           for one in partition_admins(admin, parts)]
    rows = list(heapq.merge(*per, key=lambda row: row.get("at") or 0))
    shown = rows[-opts.limit:] if opts.limit > 0 else rows  # the most recent ones
    if opts.json:
        print(json.dumps(shown, indent=2))
        return push.EXIT_OK
    for row in shown:
        status = row["status"] or "-"
        print(f"{row['id']}  {row['method']} {row['url']}  {row['reason']}  status {status}  "
              f"attempts {row['attempts']}  worker {row['worker']}  at {utc(row['at'])}"
              + (f"  found by {row['parent']}" if row.get("parent") else ""))
    what = f" with reason {opts.reason!r}" if opts.reason else ""
    print(f"{len(shown)} of {len(rows)} failed request(s){what} shown{_where(parts)}")
    return push.EXIT_OK


def run_retry(admin: FrontierAdmin, opts: Any, parts: int, host_key_mode: str) -> int:
    """``retry`` in every partition: a record goes back into its own partition (its
    host's); the counts are summed."""
    if not opts.all and opts.reason is None:
        print("error: retry needs --reason R or --all", file=sys.stderr)
        return push.EXIT_ERROR
    if opts.all and opts.reason is not None:
        print("error: retry takes --reason R or --all, not both", file=sys.stderr)
        return push.EXIT_ERROR
    total = failures.RetryReport()
    for one in partition_admins(admin, parts):
        report = failures.retry(one.client, one.keys, one.url, dead=opts.dead,
                                reason=opts.reason, queue_max=one.params.queue_max,
                                host_key=lambda url: politeness.host_key(url, host_key_mode),
                                retries=one.retries)
        for name, value in vars(report).items():
            setattr(total, name, getattr(total, name) + value)
    print_retry_report(admin, opts, parts, total)
    if total.full:
        where = (f"a partition is full (FLEET_QUEUE_MAX={admin.params.queue_max}, split over "
                 f"{parts})" if parts > 1 else
                 f"the frontier is full (FLEET_QUEUE_MAX={admin.params.queue_max})")
        print(f"error: {total.full} left: {where}; run retry again when it has room",
              file=sys.stderr)
        return push.EXIT_FULL
    return push.EXIT_OK


def print_retry_report(admin: FrontierAdmin, opts: Any, parts: int,
                       report: failures.RetryReport) -> None:
    """``retry``'s line: what was retried, and what was left and why."""
    what = "dead letter(s)" if opts.dead else "failed request(s)"
    crawl = f"crawl {admin.keys.crawl_id!r}{_where(parts, ', ', '')}"
    print(f"retried {report.retried} {what} ({crawl})"
          + (f"; {report.gone} already retried by another run" if report.gone else "")
          + (f"; {report.unreadable} unreadable, left" if report.unreadable else "")
          + (f"; {report.merged} more of the same page(s), fetched once" if report.merged
             else "")
          + (f"; {report.unstorable} left: requests the spider yielded without a parent that "
             "could not be stored (codec/...): fix the spider, then push their URLs "
             "(scrapy fleet failed lists them) or run its start requests again"
             if report.unstorable else ""))
