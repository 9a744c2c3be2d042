"""Fleet-wide politeness: what counts as one host, and the per-host calls of the workers.

The frontier's lease step (lua/step_lease.lua with lua/hosts.lua) hands out a request
only when its host may be fetched: not on hold, under its concurrency cap, and with a GCRA
token.  This module holds the rest, used by the downloader middlewares: the guard for
requests that did not come from the frontier, back-off, and the shared robots.txt.
docs/politeness.md describes the model; settings are ``FLEET_HOST_*``, ``FLEET_ROBOTSTXT_*``,
``FLEET_BACKOFF_*``.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import msgpack
import redis
import redis.asyncio

from scrapy_fleet import lua, outage, redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of


@lru_cache(maxsize=1)
def _extractor() -> Any:
    import tldextract

    # the suffix list bundled with tldextract: never fetched from the network, no cache files
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@lru_cache(maxsize=65536)
def _resolve(hostname: str) -> str:
    try:
        return str(socket.getaddrinfo(hostname, None)[0][4][0])
    except (OSError, IndexError, UnicodeError):
        return hostname


def host_key(url: str, mode: str = "host") -> str:
    """What counts as one host for the politeness caps (``FLEET_HOST_KEY``).

    ``"host"``: the URL's host name, lower case (ports ignored, as Scrapy's download slots);
    ``"domain"``: its registered domain by the Public Suffix List (tldextract's bundled copy),
    so ``a.example.co.uk`` and ``b.example.co.uk`` are one host; ``"ip"``: the first address
    the name resolves to (cached per process; resolving blocks, once per name).
    """
    hostname = (urlsplit(url).hostname or "").lower()
    if not hostname or mode == "host":
        return hostname
    if mode == "domain":
        parts = _extractor()(hostname)
        registered = parts.top_domain_under_public_suffix if hasattr(
            parts, "top_domain_under_public_suffix") else parts.registered_domain
        return str(registered or hostname)
    return _resolve(hostname)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def robots_origin(url: str) -> str:
    """The origin a robots.txt applies to: ``scheme://host:port``, host lower case, the port
    always written (80 / 443 when the URL has none).  RFC 9309 section 2.3: the rules of a
    robots.txt apply to the scheme, host and port it was fetched from, whatever
    ``FLEET_HOST_KEY`` groups for the politeness caps.  "" for a URL without a host."""
    parts = urlsplit(url)
    hostname = (parts.hostname or "").lower()
    if not hostname:
        return ""
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme, 0)
    if ":" in hostname:  # an IPv6 literal
        hostname = f"[{hostname}]"
    return f"{scheme}://{hostname}:{port}"


def overrides_to_hostconf(config: FleetConfig) -> dict[str, str]:
    """``FLEET_HOST_OVERRIDES`` as the ``hostconf`` hash: host -> "T ms|burst|cap|rate"
    (rate 1: T comes from a rate and may catch up on a late turn)."""
    out = {}
    for host, (interval, burst, cap, is_rate) in config.politeness.host_overrides.items():
        out[host] = "|".join("" if v is None else str(v) for v in (
            None if interval is None else int(interval * 1000), burst, cap,
            1 if is_rate else 0))
    return out


def policy_fields(config: FleetConfig) -> dict[str, Any]:
    """The fleet-wide per-host defaults the workers run with, as written into the crawl's
    ``config`` hash for ``scrapy fleet status --hosts``: host_interval_ms (0: no rate limit),
    host_interval_is_rate (1: from FLEET_HOST_RATE), host_burst, host_concurrency (0: no
    cap), host_key."""
    params = config.frontier_params()
    return {"host_interval_ms": int(params.host_interval * 1000),
            "host_interval_is_rate": 1 if params.host_interval_is_rate else 0,
            "host_burst": params.host_burst, "host_concurrency": params.host_concurrency,
            "host_key": config.politeness.host_key}


def describe_policy(interval: float, concurrency: int, burst: int = 1,
                    is_rate: bool = False) -> str:
    """"one request every 1.000 s (1.00/s), at most 1 in flight": a per-host policy
    (*interval* seconds, 0: none; *concurrency* 0: no cap) in words."""
    if interval > 0:
        pace = f"one request every {interval:.3f} s ({1 / interval:.2f}/s"
        pace += f", burst {burst})" if is_rate and burst > 1 else ")"
    else:
        pace = "no rate limit"
    cap = f"at most {concurrency} in flight" if concurrency > 0 else "no cap on requests in flight"
    return f"{pace}, {cap}"


def policy_log_line(config: FleetConfig) -> str:
    """The INFO line a worker logs at start: the per-host interval, rate and cap that hold
    for the whole fleet, where they come from, and what to change for a faster crawl
    (docs/politeness.md, "Scrapy's own delays and caps")."""
    params, pol = config.frontier_params(), config.politeness
    line = (f"Fleet-wide politeness per host (FLEET_HOST_KEY={pol.host_key!r}), whatever "
            f"the number of workers: "
            + describe_policy(params.host_interval, params.host_concurrency, params.host_burst,
                              params.host_interval_is_rate)
            + f" (FLEET_HOST_DELAY={pol.host_delay:g} s, by default the project's "
            f"DOWNLOAD_DELAY; FLEET_HOST_RATE={pol.host_rate}; FLEET_HOST_CONCURRENCY="
            f"{pol.host_concurrency}, by default CONCURRENT_REQUESTS_PER_DOMAIN)")
    if pol.host_overrides:
        line += f"; {len(pol.host_overrides)} host(s) in FLEET_HOST_OVERRIDES"
    if pol.robots_obey:
        line += "; a robots.txt Crawl-delay may slow a host down further"
    if params.host_interval >= 0.5 or 0 < params.host_concurrency <= 2:
        line += ("; for a faster crawl lower DOWNLOAD_DELAY (or set FLEET_HOST_RATE) and raise "
                 "CONCURRENT_REQUESTS_PER_DOMAIN (or FLEET_HOST_CONCURRENCY)")
    return line


def effective_policy(defaults: dict[str, Any], override: str | None,
                     crawl_delay_ms: int | None) -> tuple[float, int, int, bool]:
    """(interval s, burst, concurrency cap, is_rate) of one host, as lua/hosts.lua's
    host_policy_ctx computes it: the fleet's *defaults* (:func:`policy_fields`), its
    ``hostconf`` *override* ("T ms|burst|cap|rate", empty parts keep the default), and its
    robots.txt Crawl-delay as a lower bound of the interval (with burst 1)."""
    interval = int(defaults.get("host_interval_ms", 0))
    burst = int(defaults.get("host_burst", 1))
    cap = int(defaults.get("host_concurrency", 0))
    rate = bool(int(defaults.get("host_interval_is_rate", 0)))
    if override:
        parts = [*override.split("|"), "", "", "", ""][:4]
        if parts[0].strip().isdigit():
            interval, rate = int(parts[0]), parts[3].strip() == "1"
        if parts[1].strip().isdigit():
            burst = int(parts[1])
        if parts[2].strip().isdigit():
            cap = int(parts[2])
    if crawl_delay_ms is not None and crawl_delay_ms >= interval:
        interval, burst, rate = crawl_delay_ms, 1, False
    return interval / 1000, max(burst, 1), cap, rate


class Politeness:
    """Per-host politeness calls of one worker (asyncio).

    Every call is one round trip of lua/politeness.lua; times are the Redis server's.
    Calls are not retried (see the script's header), with one exception: a call that fails
    with a connection error (a socket the pool kept from before a Redis restart, which the
    restarted server never read) closes the pool's idle connections and is sent once more,
    at once, on a new one.  A call that succeeds tells the process's outage tracker
    (outage.py) that Redis answers; one that still fails raises, and the caller reports it.
    """

    def __init__(self, client: redis.asyncio.Redis, keys: CrawlKeys, config: FleetConfig,
                 worker: str, on_call: Callable[[], None] | None = None) -> None:
        self.client = client
        self._on_call = on_call  #: called once per round trip (a worker counts them)
        self.keys = keys
        self.config = config
        self.worker = worker
        self._script = lua.load(client, "politeness.lua")
        params = config.frontier_params()
        self._defaults = {"pt": int(params.host_interval * 1000), "pb": params.host_burst,
                          "pc": params.host_concurrency,
                          "pr": 1 if params.host_interval_is_rate else 0,
                          "ad": 1 if params.adaptive else 0}
        self._keys = keys.politeness_keys()
        #: FLEET_PARTITIONS > 1 (issue 21): a host's state is in its partition's keys
        self._part_keys = ([k.politeness_keys() for k in keys.all_partitions(config.partitions)]
                           if config.partitions > 1 else None)

    def _keys_of(self, host: str, origin: str) -> list[str]:
        if self._part_keys is None:
            return self._keys
        name = host or host_key(origin, self.config.politeness.host_key)
        return self._part_keys[partition_of(name, len(self._part_keys))]

    async def _call(self, op: str, host: str, **args: Any) -> dict[str, Any]:
        arg = msgpack.packb({"op": op, "h": host, **self._defaults, **args},
                            use_bin_type=False)
        if self._on_call is not None:
            self._on_call()
        keys = self._keys_of(host, args.get("o", ""))
        try:
            reply = await self._script(keys=keys, args=[arg])
        except redis.ConnectionError:
            # a stale socket fails before the server reads the call: sending it again on a
            # new connection cannot run it twice (a timeout could: it is not sent again)
            await redis_client.drop_idle_async(self.client)
            reply = await self._script(keys=keys, args=[arg])
        outage.tracker(self.config.redis_url).recovered()
        decoded = msgpack.unpackb(reply, raw=True)
        if not isinstance(decoded, dict):  # cmsgpack packs an empty table as an array
            return {}
        return {k.decode(): v for k, v in decoded.items()}

    async def write_overrides(self) -> None:
        """Store ``FLEET_HOST_OVERRIDES`` for the whole fleet (each worker writes the same)."""
        conf = overrides_to_hostconf(self.config)
        if conf:
            await self.client.hset(self.keys.hostconf, mapping=dict(conf))  # type: ignore[arg-type]

    async def take(self, host: str) -> float:
        """Take a token for *host*; returns 0.0, or the seconds to wait before trying again."""
        reply = await self._call("take", host)
        return max(0.0, float(reply["wait"]) / 1000)

    async def refund(self, host: str) -> None:
        """Give back *host*'s turn taken by a leased request that was not sent."""
        await self._call("refund", host)

    async def hold_left(self, host: str) -> float:
        """Seconds *host* stays on hold (0.0: not on hold), by Redis's clock."""
        reply = await self._call("hold", host)
        return max(0.0, float(reply["wait"]) / 1000)

    async def backoff(self, host: str, retry_after: float | None) -> float:
        """Put *host* on hold for the whole fleet: *retry_after* seconds, or (None) an
        exponential back-off with jitter that grows with its consecutive failures.  Returns
        the hold in seconds."""
        reply = await self._call(
            "backoff", host, ra=-1 if retry_after is None else retry_after,
            base=int(self.config.politeness.backoff_base * 1000),
            max=int(self.config.politeness.backoff_max * 1000),
            jit=random.uniform(0.5, 1.5))
        return float(reply["delay"]) / 1000

    async def success(self, host: str) -> None:
        await self._call("success", host)

    async def adaptive_state(self, host: str) -> dict[str, Any]:
        """*host*'s adaptive controller: {r: learned rate, cap: learned capacity} (requests/s,
        as text; cap "0": none), {} when it has no state."""
        return await self._call("adaptive_get", host)

    async def adaptive_seed(self, host: str, capacity: float, window_ms: int) -> dict[str, Any]:
        """Start *host*'s controller at *capacity* (requests/s, learned by an earlier crawl)
        unless it has a state or no ceiling: {seeded: 0 or 1, r: the rate it starts at}."""
        return await self._call("adaptive_seed", host, cap=capacity, aw=window_ms)

    async def robots_lock(self, origin: str, ttl: float = 30.0,
                          owner: str = "") -> tuple[bool, dict[str, Any] | None, int]:
        """Unless *origin*'s entry is settled (younger than FLEET_ROBOTSTXT_TTL, and usable,
        given up, or failed with its next attempt still ahead), take the right to fetch its
        robots.txt for the fleet for *ttl* seconds, as *owner* (one fetch: this worker's id and
        a number; the same owner renews it), in the same step.  Returns (taken, the entry,
        the Redis server time in ms).  The entry (None: the fleet has none): {status (0: no
        answer), body, at (ms), fails (consecutive failed attempts), next (ms: no new attempt
        before; 0 none), gone (1: given up, FLEET_ROBOTSTXT_MAX_ATTEMPTS), err (the last
        failure)}; *origin* as :func:`robots_origin` gives it."""
        reply = await self._call("robots_lock", "", o=origin, w=owner or self.worker,
                                 ttl=int(ttl * 1000),
                                 rt=int(self.config.politeness.robotstxt_ttl * 1000))
        return bool(reply["ok"]), _entry(reply.get("entry")), int(reply.get("now", 0))

    async def robots_store(self, origin: str, host: str, status: int, body: bytes,
                           crawl_delay: float | None, error: str = "",
                           retry_after: float | None = None) -> tuple[dict[str, Any], int]:
        """Store the result of a robots.txt fetch of *origin* (whose host key is *host*) and
        release the fetch lock; returns the stored entry and the server time (ms).

        A failure (*status* 0: no answer, 5xx, 429) counts one more consecutive failed
        attempt ``n``; the next attempt is not before now + max(Retry-After,
        min(cap, FLEET_ROBOTSTXT_HOLD * 2^(n-1))), cap = the larger of FLEET_BACKOFF_MAX and
        FLEET_ROBOTSTXT_HOLD; after FLEET_ROBOTSTXT_MAX_ATTEMPTS of them the entry is marked
        gone.  A *crawl_delay* (s) becomes *host*'s minimum interval."""
        hold_ms = int(self.config.politeness.robotstxt_hold * 1000)
        reply = await self._call(
            "robots_store", host, o=origin, status=status, body=body,
            cd=-1 if crawl_delay is None else int(crawl_delay * 1000),
            hold=hold_ms, cap=max(hold_ms, int(self.config.politeness.backoff_max * 1000)),
            ma=self.config.politeness.robotstxt_max_attempts, err=error[:300],
            ra=-1 if retry_after is None else int(retry_after * 1000), w=self.worker)
        entry = _entry(reply["entry"])
        assert entry is not None
        return entry, int(reply["now"])


def _entry(raw: Any) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        decoded = msgpack.unpackb(raw, raw=True)
    except Exception:  # not written by the fleet: as if absent (it is fetched again)
        return None
    if not isinstance(decoded, dict):
        return None
    return {k.decode(errors="replace") if isinstance(k, bytes) else str(k): v
            for k, v in decoded.items()}
