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
a connection to a demoted master is dropped on READONLY); :func:`make_client` builds either
the blocking or the ``redis.asyncio`` one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
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


def _no_retry(is_async: bool) -> Any:
    """A retry policy of 0 retries of the client's kind: an asyncio client gets
    ``redis.asyncio.retry.Retry`` (redis-py >= 8.2 converts a sync ``redis.retry.Retry`` with a
    ``UserWarning``, an error under ``PYTHONWARNINGS=error``; both classes exist since 4.2)."""
    return (redis.asyncio.retry.Retry if is_async else Retry)(NoBackoff(), 0)


def _options(timeout: float, is_async: bool) -> dict[str, Any]:
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": _no_retry(is_async),
        "retry_on_timeout": False,
        "health_check_interval": 30,
        "client_name": "scrapy_fleet",
    }


def _cluster_options(timeout: float, is_async: bool) -> dict[str, Any]:
    options = _options(timeout, is_async)
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


def _sentinel_kwargs(target: redis_url.RedisTarget, timeout: float, is_async: bool,
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the sentinels' connection options, the master's) of a Sentinel URL."""
    master = _node_kwargs(target)
    tls = {k: v for k, v in master.items() if k.startswith("ssl")}
    sentinels: dict[str, Any] = {
        "socket_timeout": timeout, "socket_connect_timeout": timeout,
        "retry": _no_retry(is_async), **target.sentinel_options}
    if target.tls:
        sentinels.update(tls)
    return sentinels, {**master, **_options(timeout, is_async)}


class _Cluster(redis.cluster.RedisCluster):
    """redis-py's cluster client, reading FCALL's keys from its arguments as it reads
    EVALSHA's: it would otherwise ask a node (``COMMAND GETKEYS``, FCALL's keys being
    "movable") before every frontier call, one more round trip (lua/library.py)."""

    def determine_slot(self, *args: Any) -> Any:
        if len(args) > 3 and str(args[0]).upper() == "FCALL" and int(args[2]) > 0:
            return super().determine_slot("EVALSHA", *args[1:])
        return super().determine_slot(*args)


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):
    """:class:`_Cluster` for redis.asyncio."""

    async def _determine_slot(self, command: str, *args: Any) -> Any:
        if len(args) > 2 and command.upper() == "FCALL" and int(args[1]) > 0:
            return await super()._determine_slot("EVALSHA", *args)
        return await super()._determine_slot(command, *args)


#: the client classes, blocking and asyncio: (one server, cluster, cluster node, sentinel)
_CLASSES: dict[bool, tuple[Any, Any, Any, Any]] = {
    False: (redis.Redis, _Cluster, redis.cluster.ClusterNode, redis.sentinel.Sentinel),
    True: (redis.asyncio.Redis, _AsyncCluster, redis.asyncio.cluster.ClusterNode,
           redis.asyncio.sentinel.Sentinel),
}


def make_client(url: str, timeout: float = 10.0, *, is_async: bool = False) -> Any:
    """The client of *url*: ``redis.Redis``, ``redis.cluster.RedisCluster`` or a
    Sentinel-managed ``redis.Redis``; with *is_async*, their ``redis.asyncio`` versions (a
    worker's, inside Scrapy's asyncio reactor).  A blocking client is for commands and the
    push helper, never in the reactor's path.

    Raises:
        FleetConfigError: *url* is not a valid ``FLEET_REDIS_URL``.
        RedisUnavailableError: (blocking) a cluster whose start-up node cannot be reached
            (the blocking cluster client reads the slot map when it is built; the asyncio one
            on its first command).
    """
    plain, cluster, cluster_node, sentinel = _CLASSES[is_async]
    target = redis_url.parse(url)
    if target.kind == "cluster":
        nodes = [cluster_node(host, port) for host, port in target.hosts]
        try:
            return cluster(startup_nodes=nodes, **_node_kwargs(target),
                           **_cluster_options(timeout, is_async))
        except (RedisClusterException, *_PING_ERRORS) as exc:
            raise _unreachable(exc, url) from exc
    if target.kind == "sentinel":
        sentinels, master = _sentinel_kwargs(target, timeout, is_async)
        return sentinel(list(target.hosts), sentinel_kwargs=sentinels,
                        ).master_for(target.service, **master)
    return plain.from_url(target.url, **_options(timeout, is_async))


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


def wait_replicas(client: Any, key: str, replicas: int, timeout: float) -> Any:
    """``WAIT replicas`` after a write: how many replicas acknowledged every write sent
    before on this connection, within ``wait_timeout_ms(timeout)`` (an int; from an asyncio
    client, an awaitable of it).  Sent on the node of *key* (the crawl's), through the
    connection the write just used: redis-py's pools hand out the last released connection
    first, and the caller (one call at a time on its client) has released nothing else
    since.
    """
    return client.wait(replicas, wait_timeout_ms(timeout), **node_of(client, key))


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


@contextlib.contextmanager
def _reachable(url: str) -> Iterator[None]:
    """Errors of a PING inside as :class:`RedisUnavailableError` naming the (redacted) URL."""
    try:
        yield
    except (*_PING_ERRORS, RedisClusterException) as exc:
        raise _unreachable(exc, url) from exc


def ping_sync(client: Any, url: str, key: str | None = None) -> None:
    """PING or raise :class:`RedisUnavailableError` naming the (redacted) URL.  On a cluster
    with *key*: PING the node that holds *key* (the crawl's), not the client's default node,
    which may be a dead master the cluster has failed over."""
    with _reachable(url):
        client.ping(**(node_of(client, key) if key is not None else {}))


async def ping_async(client: Any, url: str, key: str | None = None) -> None:
    """:func:`ping_sync` for an asyncio client (which reads a cluster's slot map first)."""
    with _reachable(url):
        if key is not None and is_cluster(client):
            await client.initialize()  # reads the slot map (once; again after errors)
            await client.ping(**node_of(client, key))
        else:
            await client.ping()


class _Backoff:
    """The back-off of a call retried up to *retries* times: 0.1 s doubling to 5 s, one line
    per outage (outage.py), counted from when the failed call was sent.

    A connection error while this process sees Redis up (no outage under way), the call's
    first, is most likely a socket the client's pool kept from before a Redis restart, which
    the restarted server never read: the call is sent again at once, on a new connection
    (:meth:`resend_at_once`), and reported to the outage tracker only if that fails too.
    Otherwise each stale socket of a pool (a partitioned worker's has one per partition it
    called concurrently) logged an outage of its own after the real one had ended: one Redis
    restart was logged as three outages."""

    def __init__(self, url: str, retries: int) -> None:
        self.url, self.retries = url, retries
        self.delay = _FIRST_BACKOFF
        self._resent = False

    def resend_at_once(self, exc: BaseException) -> bool:
        """Whether the call that just failed with *exc* is sent again at once, unreported
        (see the class docstring): once per call, for a connection error (never a timeout: a
        frozen server may still run the call) while no outage is under way."""
        if (self._resent or not isinstance(exc, redis.ConnectionError)
                or outage.tracker(self.url).down):
            return False
        self._resent = True
        return True

    def succeeded(self) -> None:
        outage.tracker(self.url).recovered()

    def failed(self, exc: BaseException, attempt: int, sent_at: float) -> float:
        """The seconds to sleep before the next attempt.

        Raises:
            RedisUnavailableError: *attempt* was the last one.
        """
        if attempt == self.retries:
            raise _unreachable(exc, self.url) from exc
        delay = self.delay
        outage.tracker(self.url).failed(exc, delay, sent_at)
        self.delay = min(delay * 2, _MAX_BACKOFF)
        return delay


def call_retrying(call: Callable[[], T], url: str, retries: int, client: Any = None) -> T:
    """``call()``, sent again up to *retries* times after a connection error or timeout
    (back-off 0.1 s doubling to 5 s).  Only for calls that are safe to repeat (operation ids).
    A first connection error while Redis is up is sent again at once, on a new connection
    (*client*: its pool's idle connections are closed first), before any back-off
    (``_Backoff.resend_at_once``).

    Raises:
        RedisUnavailableError: still failing after the retries.
    """
    backoff = _Backoff(url, retries)
    for attempt in range(retries + 1):
        sent_at = time.monotonic()
        try:
            try:
                result = call()
            except RETRYABLE as exc:
                if not backoff.resend_at_once(exc):
                    raise
                drop_idle(client)
                result = call()
        except RETRYABLE as exc:
            time.sleep(backoff.failed(exc, attempt, sent_at))
            continue
        backoff.succeeded()
        return result
    raise AssertionError("unreachable")


async def call_retrying_async(call: Callable[[], Awaitable[T]], url: str, retries: int,
                              client: Any = None) -> T:
    """:func:`call_retrying` for an asyncio call (sleeps without blocking the loop); *client*
    the asyncio client the call goes through."""
    backoff = _Backoff(url, retries)
    for attempt in range(retries + 1):
        sent_at = time.monotonic()
        try:
            try:
                result = await call()
            except RETRYABLE as exc:
                if not backoff.resend_at_once(exc):
                    raise
                await drop_idle_async(client)
                result = await call()
        except RETRYABLE as exc:
            await asyncio.sleep(backoff.failed(exc, attempt, sent_at))
            continue
        backoff.succeeded()
        return result
    raise AssertionError("unreachable")


def drop_idle(client: Any) -> None:
    """:func:`drop_idle_async` for a blocking client (None: nothing).  Never raises."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    try:
        pool.disconnect(inuse_connections=False)
    except (*RETRYABLE, redis.RedisError):
        pass


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
