"""A worker's sign of life, beaten from a thread of its own (issue 30; docs/architecture.md,
"Recovery in seconds").

The frontier reclaims the leases of a worker silent for ``FLEET_WORKER_DEAD_AFTER`` seconds
(lua/step_recover.lua).  A worker's frontier calls run on the reactor's asyncio loop, which
a slow callback, a long parse or a large item pipeline blocks: its calls stop while it is
alive.  :class:`LivenessBeat` runs lua/beat.lua every ``FLEET_WORKER_DEAD_AFTER / 5`` s from
a daemon thread with its own blocking client, in every partition of the crawl, so a live
worker stays alive to the fleet while its reactor is busy (Python threads share the
interpreter, switching every few ms: a callback in Python code leaves the thread its turn; a
C extension that holds the GIL for seconds, a stop (SIGSTOP), a dead process or a lost Redis
does not).

What a false death costs is bounded and counted: the worker's leases are reclaimed and leased
again elsewhere, its acknowledgements of them are refused (fencing tokens) and counted in
``fleet/frontier/lease_lost``, and :class:`StallGuard` keeps the requests it leased from a
partition it may have been dead to back (prefetched, or given to the downloader) until a
frontier call has said which of those leases it still holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from scrapy_fleet import lua, redis_client
from scrapy_fleet.keys.calls import BEAT_CALL
from scrapy_fleet.keys.crawl import CrawlKeys

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # (the pump's logger)

#: beats per FLEET_WORKER_DEAD_AFTER: a worker is dead after this many beats are missed
BEATS_PER_DEATH = 5


class LivenessBeat:
    """Beats the worker's sign of life (lua/beat.lua) into each of *parts* (the crawl's keys,
    one per partition, in partition order) every *dead_after* / 5 seconds, from a daemon
    thread.

    *url*: ``FLEET_REDIS_URL``; *worker*: the worker id; *dead_after*: seconds,
    ``FLEET_WORKER_DEAD_AFTER``; *timeout*: seconds a beat may wait for Redis (at most one
    period); *on_beat(p, sent)*: called from the thread for each partition *p* a beat sent at
    *sent* (``time.monotonic()``) reached.  Each partition is beaten on its own: one that
    cannot be reached (its master down) does not keep the beat from the others.
    ``last_ok`` is when the last beat that reached every partition was sent (None: none
    yet); ``beats`` and ``failures`` count rounds (a round with a partition not reached is a
    failure).  Errors are counted and logged at DEBUG only: the pump logs Redis outages.
    """

    def __init__(self, url: str, parts: Sequence[CrawlKeys], worker: str, dead_after: float,
                 timeout: float, on_beat: Callable[[int, float], None] | None = None) -> None:
        self.url = url
        self.parts = list(parts)
        self.worker = worker
        self.dead_ms = int(dead_after * 1000)
        self.period = dead_after / BEATS_PER_DEATH
        self.timeout = max(0.1, min(timeout, self.period))
        self.on_beat = on_beat
        self.last_ok: float | None = None
        self.beats = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-liveness", daemon=True)

    def start(self) -> None:
        """Start the thread (its first beat one period later: the worker's first frontier call
        has just written its liveness)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (the worker is closing: its final call released its leases); waits
        for a beat in flight at most one timeout."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout + 1.0)

    def _run(self) -> None:
        client: Any = None
        script: Any = None
        while not self._stop.wait(self.period):
            try:
                if client is None:
                    client = redis_client.make_client(self.url, self.timeout)
                    script = lua.load(client, "beat.lua")
            except Exception as exc:  # Redis unreachable (a cluster's default node down)
                self.failures += 1
                logger.debug("Fleet liveness beat failed: %s", exc)
                continue
            if self.beat_round(script):
                self.beats += 1
            else:
                self.failures += 1
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def beat_round(self, script: Callable[..., Any]) -> bool:
        """One beat into every partition, each on its own; True when all were reached."""
        sent = time.monotonic()
        reached = 0
        for p, keys in enumerate(self.parts):
            try:
                script(keys=keys.call_keys(BEAT_CALL), args=[self.worker, self.dead_ms])
            except Exception as exc:  # that partition unreachable, a failover: next period
                logger.debug("Fleet liveness beat to partition %d failed: %s", p, exc)
                continue
            reached += 1
            if self.on_beat is not None:
                self.on_beat(p, sent)
        if reached == len(self.parts):
            self.last_ok = sent
            return True
        return False


class StallGuard:
    """Which partitions this worker may have been dead to, for the pump (no I/O).

    A worker is dead to a partition when no sign of life (a frontier call's part, a liveness
    beat) reached it for ``FLEET_WORKER_DEAD_AFTER``: that partition reclaims its leases
    (lua/step_recover.lua), each partition on its own clock.  After a silence of more than
    *dead_after* / 2 s towards partition *p*, seen now (:meth:`check`) or between two signs
    that reached it (:meth:`sign`: after SIGCONT the beat thread beats at once, and a check
    of the latest sign alone missed the silence before it), the requests leased from *p* are
    **held**: not taken from the prefetch, not sent by the downloader, until a frontier call
    that extends every lease held, sent after the hold began, got *p*'s reply (its reply
    marks the lost leases).  The requests of the other partitions go on: a master of a
    partitioned crawl that is down (its beats and calls fail) holds only its own partitions.

    *dead_after*: ``FLEET_WORKER_DEAD_AFTER`` (0: never); *beat*: the worker's
    :class:`LivenessBeat` (None: none).  Times are ``time.monotonic()`` seconds.
    """

    def __init__(self, dead_after: float, beat: LivenessBeat | None = None) -> None:
        self.dead_after = dead_after
        self.beat = beat
        #: partition -> when the last sign of life that reached it was sent
        self.last_sign: dict[int, float] = {}
        #: partition -> since when its leases are held back (absent: they are not)
        self.held: dict[int, float] = {}
        #: a hold began that a call extending every lease must end (:meth:`revalidation_due`)
        self._due = False
        self._lock = threading.Lock()  # (the beat thread signs too)

    def start_beat(self, url: str, worker: str, parts: Sequence[CrawlKeys],
                   timeout: float) -> None:
        """Start beating *worker*'s sign of life into *parts* (:class:`LivenessBeat`), unless
        *dead_after* is 0."""
        if self.dead_after > 0 and self.beat is None:
            self.beat = LivenessBeat(url, parts, worker, self.dead_after, timeout,
                                     on_beat=self.sign)
            self.beat.start()

    def stop_beat(self, inc: Callable[[str, int], None]) -> None:
        """Stop beating (the worker closes: its leases are released); *inc(stat, n)* counts
        the beats (``fleet/liveness/beats``) and the failed ones (``fleet/liveness/failed``)."""
        if self.beat is not None:
            self.beat.stop()
            inc("fleet/liveness/beats", self.beat.beats)
            if self.beat.failures:
                inc("fleet/liveness/failed", self.beat.failures)
            self.beat = None

    def sign(self, p: int, at: float) -> None:
        """A sign of life sent at *at* reached partition *p* (a beat, from the beat thread; a
        call's part).  A silence of more than *dead_after* / 2 s towards *p* before it holds
        *p*'s leases from *at*: the worker may have been dead to *p* meanwhile, whatever got
        through since.  The first sign a partition gets is no silence (the start-up)."""
        if self.dead_after <= 0:
            return
        with self._lock:
            last = self.last_sign.get(p)
            if last is not None and at - last > self.dead_after / 2 and p not in self.held:
                self.held[p] = at
                self._due = True
            if last is None or at > last:
                self.last_sign[p] = at

    def quiet(self, now: float | None = None) -> bool:
        """Nothing is held and every partition heard from the worker less than *dead_after* /
        2 s ago (or *dead_after* is 0): :meth:`check` would hold nothing (a cheap test)."""
        if self.dead_after <= 0:
            return True
        limit = (time.monotonic() if now is None else now) - self.dead_after / 2
        with self._lock:
            return not self.held and not self._due and all(
                t >= limit for t in self.last_sign.values())

    def check(self, leased: Iterable[int], now: float | None = None) -> set[int]:
        """The partitions whose leases are held now, of those *leased* from (the partitions of
        the leases the worker holds, prefetched or given to the downloader).  A partition of
        *leased* no sign reached for more than *dead_after* / 2 s is held from now; a held
        partition the worker holds no lease of is let go (nothing to protect: a lease it takes
        later comes from a call that reached that partition after the silence)."""
        if self.dead_after <= 0:
            return set()
        now = time.monotonic() if now is None else now
        parts = set(leased)
        with self._lock:
            for p in parts - set(self.held):
                last = self.last_sign.get(p)
                if last is not None and now - last > self.dead_after / 2:
                    self.held[p] = now
                    self._due = True
            for p in set(self.held) - parts:
                del self.held[p]
            return set(self.held)

    def revalidation_due(self) -> bool:
        """True once for each hold that began (the pump's next call extends every lease)."""
        with self._lock:
            due, self._due = self._due, False
            return due

    def confirmed(self, started: float, revalidates: bool, reached: Iterable[int]) -> bool:
        """A call sent at *started* got the reply of each partition of *reached*; *revalidates*:
        it was built afresh and extended every lease held.  Returns True when that ends a hold
        (its reply dropped the lost leases: the engine may take the rest)."""
        ended = False
        for p in reached:
            self.sign(p, started)
            with self._lock:
                since = self.held.get(p)
                if revalidates and since is not None and started >= since:
                    del self.held[p]
                    ended = True
        return ended


async def leave(client: Any, keys: CrawlKeys, worker: str, partitions: int) -> None:
    """Leave the worker list and the lease holders, and drop the worker's heartbeat and its
    id's claim (best effort: they expire by themselves, after FLEET_WORKER_FORGET_AFTER and
    FLEET_WORKER_DEAD_AFTER).  A partitioned crawl's heartbeats live in every partition the
    worker's calls went to: the worker leaves each of them (issue 21).  *client*: the
    worker's asyncio client; *keys*: the crawl's (control) keys; *partitions*: P."""
    parts = keys.all_partitions(partitions) if partitions > 1 else []
    try:
        async with client.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.workers, worker)
            pipe.zrem(keys.holders, worker)
            pipe.delete(keys.worker_info(worker), keys.worker_claim(worker))
            for k in parts:  # one key per command: partitions may be on other nodes
                pipe.zrem(k.workers, worker)
                pipe.zrem(k.holders, worker)
                pipe.delete(k.worker_info(worker))
            await pipe.execute()
    except Exception:
        pass
