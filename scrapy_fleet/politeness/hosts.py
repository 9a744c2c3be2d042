"""Fleet-wide politeness: what counts as one host, and the per-host calls of the workers.

The frontier's lease step (lua/frontier.lua with lua/hosts.lua) hands out a request
only when its host may be fetched: not on hold, under its concurrency cap, and with a GCRA
token.  This module holds the rest, used by the downloader middlewares: the guard for
requests that did not come from the frontier, back-off, and the shared robots.txt.
docs/politeness.md describes the model; settings are ``FLEET_HOST_*``, ``FLEET_ROBOTSTXT_*``,
``FLEET_BACKOFF_*``.
"""

from __future__ import annotations

import random
import socket
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import msgpack
import redis.asyncio

from scrapy_fleet import lua
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys import CrawlKeys


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


def overrides_to_hostconf(config: FleetConfig) -> dict[str, str]:
    """``FLEET_HOST_OVERRIDES`` as the ``hostconf`` hash: host -> "T ms|burst|cap|rate"
    (rate 1: T comes from a rate and may catch up on a late turn)."""
    out = {}
    for host, (interval, burst, cap, is_rate) in config.host_overrides.items():
        out[host] = "|".join("" if v is None else str(v) for v in (
            None if interval is None else int(interval * 1000), burst, cap,
            1 if is_rate else 0))
    return out


class Politeness:
    """Per-host politeness calls of one worker (asyncio).

    Every call is one round trip of lua/politeness.lua; times are the Redis server's.
    Calls are not retried (see the script's header).
    """

    def __init__(self, client: redis.asyncio.Redis, keys: CrawlKeys, config: FleetConfig,
                 worker: str) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self.worker = worker
        self._script = lua.load(client, "politeness.lua")
        params = config.frontier_params()
        self._defaults = {"pt": int(params.host_interval * 1000), "pb": params.host_burst,
                          "pc": params.host_concurrency,
                          "pr": 1 if params.host_interval_is_rate else 0}
        self._keys = keys.politeness_keys()

    async def _call(self, op: str, host: str, **args: Any) -> dict[str, Any]:
        arg = msgpack.packb({"op": op, "h": host, **self._defaults, **args},
                            use_bin_type=False)
        reply = await self._script(keys=self._keys, args=[arg])
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
            base=int(self.config.backoff_base * 1000), max=int(self.config.backoff_max * 1000),
            jit=random.uniform(0.5, 1.5))
        return float(reply["delay"]) / 1000

    async def success(self, host: str) -> None:
        await self._call("success", host)

    async def robots_get(self, host: str) -> tuple[dict[str, Any] | None, int]:
        """The shared robots.txt entry of *host* ({status, body, at}) and the server time."""
        reply = await self._call("robots_get", host)
        raw = reply["entry"]
        entry = None
        if raw:
            entry = {k.decode(): v for k, v in msgpack.unpackb(raw, raw=True).items()}
        return entry, int(reply["now"])

    async def robots_lock(self, host: str, ttl: float = 30.0) -> bool:
        reply = await self._call("robots_lock", host, w=self.worker, ttl=int(ttl * 1000))
        return bool(reply["ok"])

    async def robots_store(self, host: str, status: int, body: bytes,
                           crawl_delay: float | None, hold: float) -> None:
        await self._call("robots_store", host, status=status, body=body,
                         cd=-1 if crawl_delay is None else int(crawl_delay * 1000),
                         hold=int(hold * 1000), w=self.worker)
