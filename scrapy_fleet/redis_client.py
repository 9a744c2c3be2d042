"""Every Redis client of the fleet is built here, with explicit retry settings.

redis-py retries differently depending on how a client is built (``Redis(host=, port=)``
retries 10 times, ``from_url`` 0 times), and a retried EVALSHA after a lost reply runs twice
on the server.  So clients here never retry by themselves (``Retry(NoBackoff(), 0)``); the
callers that mutate (frontier.py, dupefilter.py) retry explicitly, with :func:`call_retrying`
and the same operation id, which their scripts turn into a no-op replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_fleet import outage
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.redact import redact

T = TypeVar("T")
logger = logging.getLogger(__name__)


def _options(timeout: float) -> dict[str, Any]:
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
        "retry_on_timeout": False,
        "health_check_interval": 30,
        "client_name": "scrapy_fleet",
    }


def sync_client(url: str, timeout: float = 10.0) -> redis.Redis:
    """A blocking client for commands and the push helper (never in the reactor's path)."""
    return redis.Redis.from_url(url, **_options(timeout))


def async_client(url: str, timeout: float = 10.0) -> redis.asyncio.Redis:
    """An asyncio client, used by workers inside Scrapy's asyncio reactor."""
    return redis.asyncio.Redis.from_url(url, **_options(timeout))


#: errors after which a call may succeed when sent again (with the same operation id)
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError, OSError)
_FIRST_BACKOFF, _MAX_BACKOFF = 0.1, 5.0  # seconds, doubling


#: errors of a PING on a new connection: also the answers to the connection's set-up commands
#: (SELECT of a database out of range, an ACL user without the rights for PING or CLIENT...)
_PING_ERRORS = (*RETRYABLE, redis.ResponseError, redis.exceptions.InvalidResponse)


def _unreachable(exc: BaseException, url: str) -> RedisUnavailableError:
    if isinstance(exc, redis.exceptions.InvalidResponse):
        # something answered, but not in RESP: an HTTP server, SSH, another protocol
        return RedisUnavailableError(
            f"{redact(url)} is not a Redis server (FLEET_REDIS_URL): it answered in another "
            f"protocol ({exc})")
    if isinstance(exc, redis.AuthenticationError):
        return RedisUnavailableError(
            f"Redis at {redact(url)} refused the credentials (FLEET_REDIS_URL): {exc}")
    if isinstance(exc, redis.ResponseError):
        return RedisUnavailableError(
            f"Redis at {redact(url)} refused the connection (FLEET_REDIS_URL): {exc}")
    return RedisUnavailableError(f"cannot reach Redis at {redact(url)} (FLEET_REDIS_URL): {exc}")


def ping_sync(client: redis.Redis, url: str) -> None:
    """PING or raise :class:`RedisUnavailableError` naming the (redacted) URL."""
    try:
        client.ping()
    except _PING_ERRORS as exc:
        raise _unreachable(exc, url) from exc


async def ping_async(client: redis.asyncio.Redis, url: str) -> None:
    """PING or raise :class:`RedisUnavailableError` naming the (redacted) URL."""
    try:
        await client.ping()
    except _PING_ERRORS as exc:
        raise _unreachable(exc, url) from exc


def call_retrying(call: Callable[[], T], url: str, retries: int) -> T:
    """``call()``, sent again up to *retries* times after a connection error or timeout
    (back-off 0.1 s doubling to 5 s).  Only for calls that are safe to repeat (operation ids).

    Raises:
        RedisUnavailableError: still failing after the retries.
    """
    delay = _FIRST_BACKOFF
    for attempt in range(retries + 1):
        try:
            result = call()
            outage.tracker(url).recovered()
            return result
        except RETRYABLE as exc:
            if attempt == retries:
                raise _unreachable(exc, url) from exc
            outage.tracker(url).failed(exc, delay)  # one line per outage (outage.py)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
    raise AssertionError("unreachable")


async def call_retrying_async(call: Callable[[], Awaitable[T]], url: str, retries: int) -> T:
    """The asyncio twin of :func:`call_retrying` (sleeps without blocking the loop)."""
    delay = _FIRST_BACKOFF
    for attempt in range(retries + 1):
        try:
            result = await call()
            outage.tracker(url).recovered()
            return result
        except RETRYABLE as exc:
            if attempt == retries:
                raise _unreachable(exc, url) from exc
            outage.tracker(url).failed(exc, delay)  # one line per outage (outage.py)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
    raise AssertionError("unreachable")


def is_oom(exc: BaseException) -> bool:
    """True for Redis's "command not allowed when used memory > 'maxmemory'" answer (OOM).

    A script that gets it has not written anything: Redis checks memory before a script's
    first write only.
    """
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and str(exc).startswith("OOM"))
