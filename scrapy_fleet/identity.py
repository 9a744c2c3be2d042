"""Whose crawl, whose worker id: two checks a worker makes once, at start, with small Redis
commands (blocking client of the start-up check, startup.py).

**The crawl's spider.**  A crawl id (``FLEET_CRAWL_ID``, else the spider's name) holds the
requests of one spider: its callbacks are named by method, so a worker of another spider that
leased them would run its own ``parse`` on them.  The first worker or ``scrapy fleet push`` of
a crawl records ``"<spider name>\\t<class path>"`` in the crawl's ``spider`` key (``SET NX
GET``: one atomic call, the first writer wins); a worker or push of a spider of another name
stops with :class:`~scrapy_fleet.errors.CrawlSpiderError`.  ``scrapy fleet purge`` deletes the
record with the crawl's other keys.  The class path is informative: a spider moved to another
module keeps its crawl.

**A worker id.**  Two processes with one ``FLEET_WORKER_ID`` would share one heartbeat and
take each other's leases.  The rule (docs/monitoring.md, "One worker per id"):

* the id's heartbeat (written by every frontier call, lua/monitoring.lua) is **fresh** when its
  last call is less than ``FLEET_WORKER_DEAD_AFTER`` old by Redis's clock;
* a fresh heartbeat of a process on this host (same host name) whose pid no longer runs is
  dead at once (a restart after a crash on the same machine starts immediately);
* otherwise the starting worker watches it: if it beats again, a live worker holds the id and
  this one stops with :class:`~scrapy_fleet.errors.WorkerIdInUseError` naming it (host, pid,
  start); if it does not beat again before it is ``FLEET_WORKER_DEAD_AFTER`` old, its worker
  is dead and this one starts.  So a restart never waits more than ``FLEET_WORKER_DEAD_AFTER``;
* workers started at the same moment, before any of them has a heartbeat: each writes a
  **claim** (``SET NX``, expiring ``FLEET_WORKER_DEAD_AFTER`` later) when it starts; the first
  one starts, the others see its claim and watch for its first heartbeat as above.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from scrapy_fleet.errors import CrawlSpiderError, WorkerIdInUseError
from scrapy_fleet.frontier.protocol import as_int
from scrapy_fleet.keys.crawl import CrawlKeys

logger = logging.getLogger(__name__)

#: how to fix a CrawlSpiderError (one line, appended to its message)
SPIDER_FIX = ("Give each spider its own FLEET_CRAWL_ID (by default the crawl id is the "
              "spider's name), or purge the crawl first (`{purge}`)")


def spider_fix(exc: CrawlSpiderError) -> str:
    """How to fix *exc*: SPIDER_FIX with the purge command of that very crawl (its
    FLEET_CRAWL_ID named when it is not the owner's name: the command's default)."""
    owner = exc.owner[0]
    purge = f"scrapy fleet purge {owner} --yes"
    if exc.crawl_id and exc.crawl_id != owner:
        purge = f"scrapy fleet purge {owner} -s FLEET_CRAWL_ID={exc.crawl_id} --yes"
    return SPIDER_FIX.format(purge=purge)
#: how to fix a WorkerIdInUseError
WORKER_ID_FIX = ("Give each worker its own FLEET_WORKER_ID (unset, each process gets a "
                 "unique host:pid:start id), or stop that worker first")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def spider_path(spidercls: type) -> str:
    """``module.ClassName`` of a spider class."""
    return f"{spidercls.__module__}.{spidercls.__qualname__}"


def recorded_spider(client: Any, keys: CrawlKeys) -> str | None:
    """The name of the spider the crawl of *keys* belongs to, or None (none recorded, or
    Redis did not answer: the caller's own command reports that).  One GET, blocking."""
    try:
        value = client.get(keys.spider)
    except redis.RedisError:
        return None
    return _text(value).partition("\t")[0] if value is not None else None


def claim_crawl(client: Any, keys: CrawlKeys, name: str, path: str,
                record: bool = True) -> bool:
    """Record spider *name* (class *path*) as the owner of the crawl of *keys* unless one is
    recorded; returns True when this call recorded it.  With *record* False it only checks
    (a command that writes no request of its own, such as ``retry``, must not claim a crawl
    that has none): returns False.

    One ``SET key value NX GET`` (Redis >= 7.0; a ``GET`` with *record* False), blocking, on a
    sync redis-py client.

    Raises:
        CrawlSpiderError: the crawl belongs to a spider of another name (message: the crawl
            id, both spiders' names and class paths).
        redis.RedisError: from the call (an out-of-memory Redis: ``OutOfMemoryError``).
    """
    if record:
        old = client.set(keys.spider, f"{name}\t{path}", nx=True, get=True)
    else:
        old = client.get(keys.spider)
    if old is None:
        return record
    owner, _, owner_path = _text(old).partition("\t")
    if owner == name:
        return False
    raise CrawlSpiderError(
        f"crawl {keys.crawl_id!r} belongs to spider {owner!r} ({owner_path or '?'}), not to "
        f"spider {name!r} ({path})", owner=(owner, owner_path), spider=(name, path),
        crawl_id=keys.crawl_id)


@dataclass(frozen=True)
class Holder:
    """A process that used a worker id: its host name, pid and start (unix seconds)."""

    host: str
    pid: int
    started: float

    def describe(self) -> str:
        since = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
                 if self.started > 0 else "an unknown time")
        return f"host {self.host or '?'}, pid {self.pid or '?'}, running since {since}"

    def encode(self) -> str:
        return f"{self.host}\t{self.pid}\t{self.started:.3f}"

    @classmethod
    def decode(cls, value: Any) -> Holder:
        host, _, rest = _text(value).partition("\t")
        pid, _, started = rest.partition("\t")
        return cls(host, as_int(pid), _float(started))


def _float(value: Any) -> float:
    try:
        return float(_text(value))
    except ValueError:
        return 0.0


def gone_here(holder: Holder) -> bool:
    """True when *holder* ran on this host and its pid runs no more (or is this very
    process, which has not used the id yet: a restarted container's pid 1).  A zombie
    (killed, not yet reaped) counts as gone."""
    if not holder.pid or holder.host != socket.gethostname():
        return False
    if holder.pid == os.getpid():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it runs
        return False
    try:
        with open(f"/proc/{holder.pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _server_ms(client: Any, key: str) -> int:
    """Redis's clock in ms (on a cluster, of the node that holds *key*)."""
    from scrapy_fleet.redis_client import node_of

    seconds, micros = client.time(**node_of(client, key))
    return int(seconds) * 1000 + int(micros) // 1000


def claim_worker_id(client: Any, keys: CrawlKeys, worker_id: str, me: Holder,
                    dead_after: float, poll: float, quiet_for: float = 0.0,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Make sure no live process uses *worker_id* in the crawl of *keys*, then claim it for
    *me* (the rule is in the module's docstring).  Blocks at most about *dead_after* seconds
    (while an earlier holder's heartbeat may still beat), polling every *poll* seconds; says
    that it waits (one WARNING) once it has waited *quiet_for* seconds (the heartbeat
    interval: a live holder has beaten by then, and its refusal is the only line).

    Raises:
        WorkerIdInUseError: a live worker holds the id (message: id, host, pid, start, age
            of its last heartbeat).
        redis.RedisError: from the calls (``OutOfMemoryError`` from the claim's SET).
    """
    info = keys.worker_info(worker_id)
    claim = keys.worker_claim(worker_id)
    ttl_ms = max(1, int(dead_after * 1000))
    first_seen: int | None = None
    looked = False
    warned = False
    since = time.monotonic()
    while True:
        seen_raw, host, pid, started = client.hmget(info, "seen", "h", "pid", "sa")
        now = _server_ms(client, info)
        seen = as_int(seen_raw) if seen_raw is not None else None
        beat = Holder(_text(host), as_int(pid), _float(started))
        age = now - seen if seen is not None else ttl_ms
        fresh = age < ttl_ms and not gone_here(beat)
        if looked and fresh and seen != first_seen:
            raise WorkerIdInUseError(
                f"FLEET_WORKER_ID {worker_id!r} is in use by a live worker of crawl "
                f"{keys.crawl_id!r} ({beat.describe()}; last heartbeat {age / 1000:.1f} s ago)")
        if not looked:
            looked, first_seen = True, seen
        quiet = time.monotonic() - since < quiet_for
        if fresh:
            if not warned and not quiet:
                warned = True
                logger.warning("FLEET_WORKER_ID %r was used %.1f s ago by a worker of crawl %r "
                               "(%s): waiting up to %.1f s to see whether it is alive (it beats "
                               "again: this worker stops) or dead (it does not: this one "
                               "starts)", worker_id, age / 1000, keys.crawl_id, beat.describe(),
                               (ttl_ms - age) / 1000)
            sleep(max(0.05, min(poll, (ttl_ms - age) / 1000 + 0.05)))
            continue
        old = client.set(claim, me.encode(), nx=True, px=ttl_ms, get=True)
        if old is None or _text(old) == me.encode():
            return
        other = Holder.decode(old)
        if gone_here(other):
            client.set(claim, me.encode(), px=ttl_ms)
            return
        if not warned and not quiet:
            warned = True
            logger.warning("FLEET_WORKER_ID %r was taken by another worker of crawl %r just "
                           "before (%s) and has no heartbeat yet: waiting up to %.1f s more for "
                           "it (it beats: this worker stops; it does not: this one starts)",
                           worker_id, keys.crawl_id, other.describe(), dead_after)
        sleep(max(0.05, poll))
