"""One log line when Redis becomes unreachable, one when it answers again (with the outage's
length), whatever number of calls fail in between.

Every caller that retries a Redis call (``redis_client.call_retrying[_async]``, the worker's
pump) reports here: :meth:`Outage.failed` after a call failed on the connection,
:meth:`Outage.recovered` after one succeeded.  One tracker per Redis URL and process: a
worker's frontier, politeness and start-request clients share it, so a worker logs an
outage once, not once per client or per retry (the retries are logged at DEBUG).  A call's
first connection error while no outage is under way is sent again at once before it is
reported (redis_client ``_Backoff.resend_at_once``): a pooled socket from before a Redis
restart fails once, and would otherwise start an outage after the real one had ended.
Stats are the callers' (``fleet/redis/errors``, ``fleet/redis/outages``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from scrapy_fleet.redact import redact

logger = logging.getLogger(__name__)


class Outage:
    """The reachability of one Redis URL as this process last saw it.  Times are
    ``time.monotonic()`` seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.down_since: float | None = None
        self.failed_calls = 0  #: calls failed in the current outage
        self.outages = 0  #: outages seen by this process

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: BaseException, retry_in: float | None = None,
               sent_at: float | None = None) -> bool:
        """A call failed on the connection.  Returns True when this starts an outage (the
        one WARNING line is logged then; later failures only at DEBUG).

        *sent_at* (``time.monotonic()`` seconds) is when the failed call was sent: a frozen
        server fails a call only after the client's read timeout, and the outage began when
        the call was sent, not when it timed out.  ``None``: now.
        """
        self.failed_calls += 1
        if self.down_since is not None:
            logger.debug("Redis at %s still unreachable (%s)", redact(self.url), exc)
            return False
        now = time.monotonic()
        self.down_since = now if sent_at is None else min(now, sent_at)
        self.outages += 1
        logger.warning("Redis at %s unreachable (%s): retrying in %s with back-off until it "
                       "answers (logged once per outage)", redact(self.url), exc,
                       "a moment" if retry_in is None else f"{retry_in:.1f} s")
        return True

    def recovered(self) -> float | None:
        """A call succeeded.  Returns the outage's length in seconds when one just ended
        (logged as one WARNING line), else None."""
        if self.down_since is None:
            return None
        length = time.monotonic() - self.down_since
        logger.warning("Redis at %s reachable again after %.1f s of outage (%d failed "
                       "call(s))", redact(self.url), length, self.failed_calls)
        self.down_since = None
        self.failed_calls = 0
        return length


_TRACKERS: dict[str, Outage] = {}
_LOCK = threading.Lock()


def tracker(url: str) -> Outage:
    """The process's :class:`Outage` of *url*."""
    with _LOCK:
        found = _TRACKERS.get(url)
        if found is None:
            found = _TRACKERS[url] = Outage(url)
        return found


class OutOfMemory:
    """A worker's view of Redis refusing its frontier calls with OOM (``maxmemory`` reached
    with ``noeviction``): one WARNING when the refusals start, at most one reminder per
    *remind_every* seconds (with the count of refused calls), one when a call succeeds again
    (with the length), as an outage is logged.  Times are ``time.monotonic()`` seconds
    (*clock*: for a test)."""

    def __init__(self, remind_every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.remind_every = remind_every
        self.clock = clock
        self.since: float | None = None
        self.refused_calls = 0
        self._reminded = 0.0

    def refused(self, extra: dict[str, Any] | None = None) -> None:
        """A call was refused with OOM (it changed nothing; the caller keeps what it sent)."""
        now = self.clock()
        self.refused_calls += 1
        if self.since is None:
            self.since = self._reminded = now
            logger.warning("Redis is out of memory (maxmemory): pausing pushes and "
                           "acknowledgements until it has room (logged once, then every "
                           "%.0f s while it lasts)", self.remind_every, extra=extra)
        elif now - self._reminded >= self.remind_every:
            self._reminded = now
            logger.warning("Redis still out of memory after %.0f s (%d refused call(s)): "
                           "pushes and acknowledgements still paused", now - self.since,
                           self.refused_calls, extra=extra)

    def recovered(self, extra: dict[str, Any] | None = None) -> float | None:
        """A call succeeded: returns the length of the out-of-memory spell it ends (logged),
        else None."""
        if self.since is None:
            return None
        length = self.clock() - self.since
        logger.warning("Redis has room again after %.1f s out of memory (%d refused "
                       "call(s)): pushes and acknowledgements resume", length,
                       self.refused_calls, extra=extra)
        self.since = None
        self.refused_calls = 0
        return length
