"""Redis memory safety checks run when a worker starts (docs/backpressure.md)."""

from __future__ import annotations

import logging
from typing import Any

import redis

from scrapy_fleet.config import FleetConfig

logger = logging.getLogger(__name__)

#: eviction policies that never delete a key without a TTL (the frontier's keys have none)
SAFE_POLICIES = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")
#: bytes a frontier entry takes in Redis, roughly: a queued one its payload (~50-300 B) and
#: ~20 B in its host's bucket list (a leased one ~150 B more, but leases are few); measured
#: in bench/bench_memory.py (~90-100 B for a pushed 50-byte URL) and bench_backpressure.py
BYTES_PER_ENTRY = 300


def memory_warnings(policy: str | None, maxmemory: int, used: int,
                    config: FleetConfig) -> list[str]:
    """Warnings for a Redis whose eviction policy or ``maxmemory`` endangers the frontier.

    *maxmemory* and *used* are bytes (0 = no limit).  Pure function, for tests.
    """
    warnings = []
    if policy is not None and policy not in SAFE_POLICIES:
        warnings.append(
            f"Redis maxmemory-policy is {policy!r}: when memory is full Redis may delete the "
            f"frontier's keys (queue, leases, dupefilter) and lose requests. Use 'noeviction' "
            f"(or a volatile-* policy) for the fleet's Redis.")
    if maxmemory and config.backpressure.queue_max:
        needed = config.backpressure.queue_max * BYTES_PER_ENTRY
        from scrapy_fleet.frontier.bloom import slice_params

        needed += slice_params(config.dupefilter.capacity,
                               config.dupefilter.error_rate, 0).bytes
        if needed > maxmemory - used:
            warnings.append(
                f"Redis maxmemory is {maxmemory} bytes with {used} used, but a frontier of "
                f"FLEET_QUEUE_MAX={config.backpressure.queue_max} entries and its Bloom filter "
                f"may need about {needed} bytes more: expect OOM pauses. Lower FLEET_QUEUE_MAX or "
                f"raise maxmemory.")
    return warnings


async def check_redis_memory(client: Any, config: FleetConfig,
                             key: str | None = None) -> list[str]:
    """Read ``maxmemory-policy``, ``maxmemory`` and ``used_memory``; return warnings.

    On a cluster, of the node that holds *key* (any key of the crawl: they share one hash
    tag), the node the crawl fills.  A Redis that refuses CONFIG (managed services often do,
    and an ACL user without ``config|get``) is not checked.
    """
    from scrapy_fleet.redis_client import node_of

    target = node_of(client, key) if key is not None else {}
    try:
        policy_reply = await client.config_get("maxmemory-policy", **target)
        max_reply = await client.config_get("maxmemory", **target)
        info = await client.info("memory", **target)
    except redis.ResponseError as exc:
        logger.debug("Cannot read the Redis memory configuration: %s", exc)
        return []
    policy = policy_reply.get("maxmemory-policy")
    maxmemory = int(max_reply.get("maxmemory") or 0)
    return memory_warnings(policy, maxmemory, int(info.get("used_memory", 0)), config)
