"""The commands on a partitioned crawl (FLEET_PARTITIONS > 1, docs/partitions.md): ``push``
(batched per partition, lean calls), ``status`` and ``status --json`` (the schema-2 snapshot
merged over the partitions, monitoring/merge.py, with a table per partition and a skew),
``shards`` (which master holds which partition), ``purge`` (every partition, on every node),
``dead``, ``failed`` and ``retry`` over every partition (ids ``<p>:<id>``); ``top`` and
``monitor`` read the merged snapshot (monitoring/source.py ``PartitionedSource``).

A command learns P from the crawl (its ``partitions`` key); a command run inside a project
whose FLEET_PARTITIONS differs from it is refused (frontier/partitions.py ``check_sync``).
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

import redis

from scrapy_fleet import codec, lua, redis_client
from scrapy_fleet.commands import budget as budget_commands
from scrapy_fleet.commands import push, sessions
from scrapy_fleet.commands.actions import (
    add_host_rows,
    print_host_rows,
    purge_confirmed,
    warn_live_workers,
)
from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.lean import LeanResult, lean_args
from scrapy_fleet.frontier.protocol import CallResult
from scrapy_fleet.frontier.routing import entry_ref, partition_params
from scrapy_fleet.keys import PUSH_LEAN_CALL, partition_of
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.recrawl import view as recrawl_view

#: actions that run on a partitioned crawl (the others refuse it, in one line)
PARTITIONED_ACTIONS = ("push", "status", "shards", "purge", "dead", "failed", "retry", "top",
                       "monitor")


def partition_admins(admin: FrontierAdmin, parts: int) -> list[FrontierAdmin]:
    """One FrontierAdmin per partition (its keys those of the partition), sharing *admin*'s
    client."""
    out = []
    for p, keys in enumerate(admin.keys.all_partitions(parts)):
        one = FrontierAdmin(admin.url, admin.keys.crawl_id, admin.keys.prefix,
                            partition_params(admin.params, parts), admin.timeout,
                            admin.retries, keys=keys,
                            client=admin.client)  # one client: a cluster client routes every key
        out.append(one)
        assert keys.part == p
    return out


class PartitionedPush:
    """What ``push.push_lines`` needs of an admin, for a partitioned crawl: each batch split
    by the partition of its entries' hosts, one lean call (lua/push_lean.lua) per partition;
    ``size`` is that of the fullest partition times P (so that a push waiting for room waits
    for the partition that refused it)."""

    def __init__(self, admin: FrontierAdmin, parts: int) -> None:
        self.admin = admin
        self.parts = parts
        self.keys = admin.keys
        self.params = admin.params
        self.url = admin.url
        self.unreplicated = 0
        self.wait_replicas = admin.wait_replicas
        self._admins = partition_admins(admin, parts)
        self._script = lua.load(admin.client, "push_lean.lua")
        self._part_params = partition_params(admin.params, parts)
        #: per partition, (rows, reply) of a lean call that went through in a push another
        #: partition then refused (out of memory: push_lines pushes the batch again): the
        #: same rows pushed again take that reply instead of running a second time
        self._answered: dict[int, tuple[list[tuple[Any, ...]], LeanResult]] = {}

    def _caller(self, keys: list[str], arg: bytes) -> Any:
        return lambda: self._script(keys=keys, args=[arg])

    def size(self) -> int:
        return max(a.size() for a in self._admins) * self.parts

    def push(self, pushes: list[tuple[Any, ...]]) -> CallResult:
        per: dict[int, list[int]] = {}
        for i, p in enumerate(pushes):
            host = p[4] if len(p) > 4 else ""
            per.setdefault(partition_of(host, self.parts), []).append(i)
        flags = [0] * len(pushes)
        refused: list[int] = []
        pushed = dups = 0
        size = 0
        answered, self._answered = self._answered, {}
        done: dict[int, tuple[list[tuple[Any, ...]], LeanResult]] = {}
        for q, idx in sorted(per.items()):
            rows = [(pushes[i][0], pushes[i][1], pushes[i][2],
                     pushes[i][4] if len(pushes[i]) > 4 else "") for i in idx]
            if q in answered and answered[q][0] == rows:
                res = answered[q][1]
            else:
                keys = self._admins[q].keys.call_keys(PUSH_LEAN_CALL, uuid.uuid4().hex)
                arg = lean_args(rows, self._part_params, "")
                try:
                    reply = redis_client.call_retrying(self._caller(keys, arg), self.url,
                                                       self.admin.retries)
                except redis.ResponseError:
                    self._answered = done  # (before any write: the others went through)
                    raise
                res = LeanResult.from_reply(reply)
            done[q] = (rows, res)
            for j, i in enumerate(idx):
                flags[i] = res.flags[j]
            refused += [idx[j] for j in res.refused]
            pushed += res.pushed
            dups += res.duplicates
            if res.refused and res.size is not None:
                size = max(size, res.size * self.parts)
        return CallResult(leased=[], lost=[], push_flags=flags, refused=sorted(refused),
                          pushed=pushed, duplicates=dups, acked=0, released=0, reclaimed=0,
                          dead_lettered=0, parked=0, deferred=0, resumed=0, queued=0,
                          inflight=0, deferred_now=0, size=size, idle_ms=-1, now_ms=0,
                          bloom_full=False)


def _slot(key: str) -> int:
    from scrapy_fleet.monitoring.merge import slot_of

    return slot_of(key)


def _node(client: Any, key: str) -> str:
    from scrapy_fleet.monitoring.merge import node_of

    return node_of(client, key)


def read_status(admin: FrontierAdmin, parts: int, hosts: int = 10,
                alerts_config: Any = None) -> dict[str, Any]:
    """The schema-2 snapshot of a partitioned crawl: every partition's, merged
    (monitoring/merge.py), with ``partitions``, ``per_partition`` and ``skew``.

    Raises:
        redis.RedisError: a partition cannot be read.
    """
    from scrapy_fleet.monitoring import merge

    return merge.read_merged(admin.client, admin.keys, parts, hosts, alerts_config,
                             partition_params(admin.params, parts).queue_max)


def run_status(admin: FrontierAdmin, opts: Any, label: str, parts: int,
               low_watermark: int | None = None, alerts_config: Any = None) -> int:
    """``status`` of a partitioned crawl: the merged snapshot (``--json``: schema 2, with
    ``queue_max`` and ``low_watermark`` as for one partition), or the screen, a row per
    partition and the skew line."""
    from scrapy_fleet.monitoring import screen

    snap = read_status(admin, parts, getattr(opts, "limit", 10), alerts_config)
    status = {**snap, "queue_max": admin.params.queue_max, "low_watermark": low_watermark}
    host_budgets = budget_commands.add_status(status, admin.client, admin.keys, parts)
    if getattr(opts, "hosts", False):
        rows = host_rows(admin, parts, opts.limit)
        add_host_rows(status, rows, admin.host_policy(), recrawl_view.read_hosts(
            admin.client, admin.keys, [row["host"] for row in rows], parts))
        budget_commands.add_host_rows(status["hosts"], host_budgets)
        status["recrawl_hosts"] = recrawl_view.recrawl_hosts(admin.client, admin.keys, parts,
                                                             opts.limit)
    # session pools: under the crawl's own tag, as the cookie jars (docs/sessions.md)
    status["sessions"] = sessions.summary(admin)
    if getattr(opts, "json", False):
        print(json.dumps(status, indent=2, sort_keys=True))
        return push.EXIT_OK
    print(screen.render(snap, f"{label}, {parts} partitions", admin.params.queue_max,
                        low_watermark))
    print(failures.failed_status_line(snap["failed_by"], snap["counters"]["requests"]))
    line = sessions.status_line(status["sessions"])
    if line:
        print(line)
    print(f"  {'part':>4} {'node':<21} {'queued':>8} {'leased':>7} {'deferred':>8} "
          f"{'parked':>6} {'bound':>8} {'idle':>7}")
    for r in snap["per_partition"]:
        idle = "-" if r["idle_seconds"] is None else f"{r['idle_seconds']:.0f}s"
        print(f"  {r['partition']:>4} {r['node'] or 'local':<21} {r['queued']:>8} "
              f"{r['leased']:>7} {r['deferred']:>8} {r['parked']:>6} "
              f"{r['bound'] or '-':>8} {idle:>7}")
    print(f"  skew: the fullest partition holds {snap['skew']}x the mean of queued entries"
          if any(r["queued"] for r in snap["per_partition"]) else "  skew: - (nothing queued)")
    if getattr(opts, "hosts", False):
        print_host_rows(status)
        budget_commands.print_host_lines(status["hosts"])
    return push.EXIT_OK


def host_rows(admin: FrontierAdmin, parts: int, limit: int) -> list[dict[str, Any]]:
    """``status --hosts`` of a partitioned crawl: every partition's hosts (a host's entries
    and politeness state live in one partition), busiest first, up to *limit*; the policy
    defaults from the crawl's control ``config``."""
    rows = [row for one in partition_admins(admin, parts)
            for row in one.hosts(limit=limit, config_key=admin.keys.config)]
    rows.sort(key=lambda r: (-r["queued"], -r["leased"], r["host"]))
    return rows[:limit]


def run_shards(admin: FrontierAdmin, opts: Any, parts: int) -> int:
    """Which master holds which partition (``shards``); moving one is Redis Cluster's own
    ``redis-cli --cluster reshard`` of its slot (docs/partitions.md)."""
    rows = [{"partition": one.keys.part, "tag": one.keys.base, "slot": _slot(one.keys.base),
             "node": _node(admin.client, one.keys.stats) or "local"}
            for one in partition_admins(admin, parts)]
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
              confirm: Any = input) -> int:
    """``purge`` of every partition and of the control keys; as with P = 1: nothing to purge
    (exit 0) when Redis holds no key of the crawl, a warning when workers called it in the last
    60 s, a question unless ``--yes``."""
    admins = partition_admins(admin, parts)
    if not admin.crawl_keys() and not any(one.crawl_keys() for one in admins):
        print(f"nothing to purge for crawl {admin.keys.crawl_id!r}")
        return push.EXIT_OK
    warn_live_workers(sorted({w for one in admins for w, age in one.status()["workers"].items()
                              if age < 60}))
    if not opts.yes and not purge_confirmed(
            confirm, f"Delete every key of crawl {admin.keys.crawl_id!r} ({label}) "
                     f"in its {parts} partitions? [y/N] "):
        return push.EXIT_REJECTED
    deleted = sum(one.purge() for one in admins)
    deleted += admin.purge()  # the control keys, the partitions key last
    print(f"purged {deleted} keys of crawl {admin.keys.crawl_id!r} ({parts} partitions)")
    return push.EXIT_OK


def run_dead(admin: FrontierAdmin, opts: Any, parts: int) -> int:
    """``dead`` over every partition; ids read ``<p>:<entry id>``."""
    rows = []
    for one in partition_admins(admin, parts):
        for letter in one.dead_letters(limit=opts.limit):
            try:
                url = codec.decode_dict(letter["data"])["url"]
            except RequestDecodeError:
                url = None
            rows.append({"entry_id": entry_ref(one.keys.part, letter["entry_id"]),
                         "reason": letter["reason"], "url": url, "at_ms": letter["at"]})
    rows = rows[:opts.limit] if opts.limit > 0 else rows
    if opts.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['entry_id']}  {row['url'] or '<undecodable>'}  {row['reason']}")
        print(f"{len(rows)} dead letter(s) shown ({parts} partitions)")
    return push.EXIT_OK


def run_failed(admin: FrontierAdmin, opts: Any, parts: int) -> int:
    """``failed`` over every partition, oldest first by time; ids ``<p>:<record id>``."""
    rows = [dict(rec.to_json(), id=entry_ref(one.keys.part, rid))
            for one in partition_admins(admin, parts)
            for rid, rec in failures.failed_records(one.client, one.keys, opts.reason)]
    rows.sort(key=lambda row: (row.get("at") or 0, row["id"]))
    shown = rows[-opts.limit:] if opts.limit > 0 else rows
    if opts.json:
        print(json.dumps(shown, indent=2))
        return push.EXIT_OK
    for row in shown:
        print(f"{row['id']}  {row['method']} {row['url']}  {row['reason']}  status "
              f"{row['status'] or '-'}  attempts {row['attempts']}  worker {row['worker']}")
    what = f" with reason {opts.reason!r}" if opts.reason else ""
    print(f"{len(shown)} of {len(rows)} failed request(s){what} shown ({parts} partitions)")
    return push.EXIT_OK


def run_retry(admin: FrontierAdmin, opts: Any, parts: int, host_key_mode: str) -> int:
    """``retry`` in every partition: a record goes back into its own partition (its host's);
    the counts are summed."""
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
    what = "dead letter(s)" if opts.dead else "failed request(s)"
    print(f"retried {total.retried} {what} (crawl {admin.keys.crawl_id!r}, {parts} partitions)"
          + (f"; {total.gone} already retried by another run" if total.gone else "")
          + (f"; {total.unreadable} unreadable, left" if total.unreadable else "")
          + (f"; {total.unstorable} left: requests without a parent that could not be "
             "stored" if total.unstorable else ""))
    if total.full:
        print(f"error: {total.full} left: a partition is full (FLEET_QUEUE_MAX="
              f"{admin.params.queue_max}, split over {parts}); run retry again when it has "
              "room", file=sys.stderr)
        return push.EXIT_FULL
    return push.EXIT_OK


def refuse(action: str, crawl_id: str, parts: int) -> int:
    print(f"error: {action} does not run on a partitioned crawl yet (crawl {crawl_id!r} has "
          f"FLEET_PARTITIONS={parts}; {', '.join(PARTITIONED_ACTIONS)} do)", file=sys.stderr)
    return push.EXIT_ERROR
