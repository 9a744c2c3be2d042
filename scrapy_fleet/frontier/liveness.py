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
``fleet/frontier/lease_lost``, and :meth:`FrontierPump.prefetch_safe` keeps its prefetched
requests back until a frontier call has said which of its leases it still holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from scrapy_fleet import lua, redis_client
from scrapy_fleet.keys import BEAT_CALL, CrawlKeys

logger = logging.getLogger("scrapy_fleet.frontier.scheduler")  # (the pump's logger)

#: beats per FLEET_WORKER_DEAD_AFTER: a worker is dead after this many beats are missed
BEATS_PER_DEATH = 5


class LivenessBeat:
    """Beats the worker's sign of life (lua/beat.lua) into each of *parts* (the crawl's keys,
    one per partition) every *dead_after* / 5 seconds, from a daemon thread.

    *url*: ``FLEET_REDIS_URL``; *worker*: the worker id; *dead_after*: seconds,
    ``FLEET_WORKER_DEAD_AFTER``; *timeout*: seconds a beat may wait for Redis (at most one
    period).  ``last_ok`` is ``time.monotonic()`` when the last beat that reached every
    partition was sent (None: none yet); ``beats`` and ``failures`` count rounds.  Errors are
    counted and logged at DEBUG only: the pump logs Redis outages.
    """

    def __init__(self, url: str, parts: Sequence[CrawlKeys], worker: str, dead_after: float,
                 timeout: float) -> None:
        self.url = url
        self.parts = list(parts)
        self.worker = worker
        self.dead_ms = int(dead_after * 1000)
        self.period = dead_after / BEATS_PER_DEATH
        self.timeout = max(0.1, min(timeout, self.period))
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
                sent = time.monotonic()
                for keys in self.parts:
                    script(keys=keys.call_keys(BEAT_CALL), args=[self.worker, self.dead_ms])
                self.last_ok = sent
                self.beats += 1
            except Exception as exc:  # Redis unreachable, a failover: the next beat tries again
                self.failures += 1
                logger.debug("Fleet liveness beat failed: %s", exc)
        if client is not None:
            try:
                client.close()
            except Exception:
                pass


class StallGuard:
    """Whether this worker may have been dead to the fleet, for the pump (no I/O).

    *dead_after*: ``FLEET_WORKER_DEAD_AFTER`` (0: never); *beat*: the worker's
    :class:`LivenessBeat` (None: none).  :meth:`suspect` is asked before the engine takes a
    prefetched request; :meth:`confirmed` after each frontier call that got its reply.
    """

    def __init__(self, dead_after: float, beat: LivenessBeat | None = None) -> None:
        self.dead_after = dead_after
        self.beat = beat
        #: time.monotonic() when the last frontier call that got its reply was sent
        self.confirmed_at = time.monotonic()
        #: since when the prefetch is held back (None: it is not)
        self.held_since: float | None = None

    def start_beat(self, url: str, worker: str, parts: Sequence[CrawlKeys],
                   timeout: float) -> None:
        """Start beating *worker*'s sign of life into *parts* (:class:`LivenessBeat`), unless
        *dead_after* is 0."""
        if self.dead_after > 0 and self.beat is None:
            self.beat = LivenessBeat(url, parts, worker, self.dead_after, timeout)
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

    def suspect(self, prefetched: bool = True) -> bool | None:
        """True while the prefetch is held back; None when it must be from now on (no call
        got its reply and no beat got through for more than *dead_after* / 2 s: the process
        was stopped, its reactor and thread blocked, or Redis away), so the pump's next call
        must extend every lease it holds; False otherwise (*prefetched* False: nothing is
        prefetched, nothing to hold back)."""
        if self.held_since is not None:
            return True
        if self.dead_after <= 0 or not prefetched:
            return False
        now = time.monotonic()
        last = self.confirmed_at
        beat = self.beat.last_ok if self.beat is not None else None
        if beat is not None and beat > last:
            last = beat
        if now - last <= self.dead_after / 2:
            return False
        self.held_since = now
        return None

    def confirmed(self, started: float, revalidates: bool) -> bool:
        """A call sent at *started* got its reply; *revalidates*: it was built afresh and
        extended every lease held.  Returns True when that ends a hold (its reply dropped the
        lost leases: the engine may take the rest)."""
        self.confirmed_at = max(self.confirmed_at, started)
        if self.held_since is not None and revalidates and started >= self.held_since:
            self.held_since = None
            return True
        return False


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
