"""Every Redis client of the fleet is built here, with explicit retry settings.

redis-py retries differently depending on how a client is built (``Redis(host=, port=)``
retries 10 times, ``from_url`` 0 times), and a retried EVALSHA after a lost reply runs twice
on the server.  So clients here never retry by themselves (``Retry(NoBackoff(), 0)``); the
callers that mutate (frontier.py, dupefilter.py) retry explicitly, with :func:`call_retrying`
and the same operation id, which their scripts turn into a no-op replay.

The URL picks the client (scrapy_fleet/redis_url.py): one server (``redis.Redis``), Redis
Cluster (``redis.cluster.RedisCluster``: it follows MOVED/ASK itself and re-reads the slot
map after a connection error, so a retried call reaches the replica promoted by a failover),
or Sentinel (``redis.sentinel``: a connection asks the sentinels for the current master, and
a connection to a demoted master is dropped on READONLY).  The asyncio clients are their
``redis.asyncio`` twins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from scrapy_fleet import outage, redis_url
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


def _cluster_options(timeout: float) -> dict[str, Any]:
    options = _options(timeout)
    del options["retry_on_timeout"]  # deprecated for the cluster clients (and their Retry of
    # 0 retries already retries nothing)
    return options


def _node_kwargs(target: redis_url.RedisTarget) -> dict[str, Any]:
    """Connection options of *target*'s data nodes (user, password, db, TLS...), without
    the address."""
    node = redis.connection.parse_url(target.url)
    for name in ("host", "port", "connection_class"):
        node.pop(name, None)
    if target.tls:
        node["ssl"] = True
    return node


def _sentinel_kwargs(target: redis_url.RedisTarget, timeout: float,
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the sentinels' connection options, the master's) of a Sentinel URL."""
    master = _node_kwargs(target)
    tls = {k: v for k, v in master.items() if k.startswith("ssl")}
    sentinels: dict[str, Any] = {
        "socket_timeout": timeout, "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0), **target.sentinel_options}
    if target.tls:
        sentinels.update(tls)
    return sentinels, {**master, **_options(timeout)}


def sync_client(url: str, timeout: float = 10.0) -> Any:
    """A blocking client for commands and the push helper (never in the reactor's path):
    ``redis.Redis``, ``redis.cluster.RedisCluster`` or a Sentinel-managed ``redis.Redis``.

    Raises:
        FleetConfigError: *url* is not a valid ``FLEET_REDIS_URL``.
        RedisUnavailableError: a cluster whose start-up node cannot be reached (the cluster
            client reads the slot map when it is built).
    """
    target = redis_url.parse(url)
    if target.kind == "cluster":
        nodes = [redis.cluster.ClusterNode(host, port) for host, port in target.hosts]
        try:
            return redis.cluster.RedisCluster(startup_nodes=nodes, **_node_kwargs(target),
                                              **_cluster_options(timeout))
        except (RedisClusterException, *_PING_ERRORS) as exc:
            raise _unreachable(exc, url) from exc
    if target.kind == "sentinel":
        sentinels, master = _sentinel_kwargs(target, timeout)
        return redis.sentinel.Sentinel(list(target.hosts), sentinel_kwargs=sentinels,
                                       ).master_for(target.service, **master)
    return redis.Redis.from_url(target.url, **_options(timeout))


def async_client(url: str, timeout: float = 10.0) -> Any:
    """An asyncio client, used by workers inside Scrapy's asyncio reactor: the
    ``redis.asyncio`` twin of :func:`sync_client`'s (it connects on its first command).

    Raises:
        FleetConfigError: *url* is not a valid ``FLEET_REDIS_URL``.
    """
    target = redis_url.parse(url)
    if target.kind == "cluster":
        anodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in target.hosts]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=anodes,
                                                  **_node_kwargs(target),
                                                  **_cluster_options(timeout))
    if target.kind == "sentinel":
        sentinels, master = _sentinel_kwargs(target, timeout)
        return redis.asyncio.sentinel.Sentinel(
            list(target.hosts), sentinel_kwargs=sentinels,
        ).master_for(target.service, **master)
    return redis.asyncio.Redis.from_url(target.url, **_options(timeout))


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (sync or asyncio)."""
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def node_of(client: Any, key: str) -> dict[str, Any]:
    """Keyword arguments sending a keyless command (INFO, CONFIG GET, SCAN...) to the node
    that holds *key*: ``{"target_nodes": node}`` on a cluster, ``{}`` otherwise.  Every key of
    a crawl has the crawl's hash tag, so one key's node is the crawl's node.  An asyncio
    cluster client must have run a command first (it reads the slot map then)."""
    if is_cluster(client):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}


def wait_timeout_ms(timeout: float) -> int:
    """WAIT's timeout for a client whose socket timeout is *timeout* seconds: 1 s at most,
    half the socket timeout at least (the reply must come before the socket gives up)."""
    return max(1, int(min(1.0, timeout / 2) * 1000))


def wait_replicas_sync(client: Any, key: str, replicas: int, timeout: float) -> int:
    """``WAIT replicas`` after a write: blocks until *replicas* replicas acknowledged every
    write sent before on this connection, or ``wait_timeout_ms(timeout)``; returns how many
    did.  Sent on the node of *key* (the crawl's), through the connection the write just
    used: redis-py's pools hand out the last released connection first, and the caller
    (one thread, one call at a time) has released nothing else since.
    """
    return int(client.wait(replicas, wait_timeout_ms(timeout), **node_of(client, key)))


async def wait_replicas_async(client: Any, key: str, replicas: int, timeout: float) -> int:
    """The asyncio twin of :func:`wait_replicas_sync` (its caller, the frontier's pump, is
    the only user of its client while a call runs)."""
    return int(await client.wait(replicas, wait_timeout_ms(timeout), **node_of(client, key)))


#: errors after which a call may succeed when sent again (with the same operation id):
#: connection errors and timeouts, and a cluster's answers during a failover (CLUSTERDOWN,
#: TRYAGAIN, a slot no node serves yet), which come before the command runs
RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError, OSError,
             ClusterDownError, TryAgainError, SlotNotCoveredError)
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
    if "CERTIFICATE_VERIFY_FAILED" in str(exc) or "certificate verify failed" in str(exc):
        return RedisUnavailableError(
            f"Redis at {redact(url)} presented a TLS certificate that cannot be verified "
            f"(FLEET_REDIS_URL, ssl_ca_certs): {exc}")
    if isinstance(exc, redis.AuthenticationError):
        return RedisUnavailableError(
            f"Redis at {redact(url)} refused the credentials (FLEET_REDIS_URL): {exc}")
    if isinstance(exc, redis.ResponseError):
        return RedisUnavailableError(
            f"Redis at {redact(url)} refused the connection (FLEET_REDIS_URL): {exc}")
    return RedisUnavailableError(f"cannot reach Redis at {redact(url)} (FLEET_REDIS_URL): {exc}")


def ping_sync(client: Any, url: str, key: str | None = None) -> None:
    """PING or raise :class:`RedisUnavailableError` naming the (redacted) URL.  On a cluster
    with *key*: PING the node that holds *key* (the crawl's), not the client's default node,
    which may be a dead master the cluster has failed over."""
    try:
        client.ping(**(node_of(client, key) if key is not None else {}))
    except (*_PING_ERRORS, RedisClusterException) as exc:
        raise _unreachable(exc, url) from exc


async def ping_async(client: Any, url: str, key: str | None = None) -> None:
    """The asyncio twin of :func:`ping_sync`."""
    try:
        if key is not None and is_cluster(client):
            await client.initialize()  # reads the slot map (once; again after errors)
            await client.ping(**node_of(client, key))
        else:
            await client.ping()
    except (*_PING_ERRORS, RedisClusterException) as exc:
        raise _unreachable(exc, url) from exc


def call_retrying(call: Callable[[], T], url: str, retries: int) -> T:
    """``call()``, sent again up to *retries* times after a connection error or timeout
    (back-off 0.1 s doubling to 5 s).  Only for calls that are safe to repeat (operation ids).

    Raises:
        RedisUnavailableError: still failing after the retries.
    """
    delay = _FIRST_BACKOFF
    for attempt in range(retries + 1):
        sent_at = time.monotonic()
        try:
            result = call()
            outage.tracker(url).recovered()
            return result
        except RETRYABLE as exc:
            if attempt == retries:
                raise _unreachable(exc, url) from exc
            # one line per outage (outage.py), counted from when the failed call was sent
            outage.tracker(url).failed(exc, delay, sent_at)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
    raise AssertionError("unreachable")


async def call_retrying_async(call: Callable[[], Awaitable[T]], url: str, retries: int) -> T:
    """The asyncio twin of :func:`call_retrying` (sleeps without blocking the loop)."""
    delay = _FIRST_BACKOFF
    for attempt in range(retries + 1):
        sent_at = time.monotonic()
        try:
            result = await call()
            outage.tracker(url).recovered()
            return result
        except RETRYABLE as exc:
            if attempt == retries:
                raise _unreachable(exc, url) from exc
            # one line per outage (outage.py), counted from when the failed call was sent
            outage.tracker(url).failed(exc, delay, sent_at)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
    raise AssertionError("unreachable")


async def drop_idle_async(client: Any) -> None:
    """Close the idle connections of *client*'s pool (an asyncio client): after a Redis
    restart every connection the pool kept is dead, and each would fail its next call with
    ``Connection closed by server``; closed, each connects again on its next use.  A cluster
    client (one pool per node, re-read after errors) is left alone.  Never raises."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    try:
        await pool.disconnect(inuse_connections=False)
    except (*RETRYABLE, redis.RedisError):
        pass


def is_oom(exc: BaseException) -> bool:
    """True for Redis's "command not allowed when used memory > 'maxmemory'" answer (OOM).

    A script that gets it has not written anything: Redis checks memory before a script's
    first write only.
    """
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and str(exc).startswith("OOM"))
