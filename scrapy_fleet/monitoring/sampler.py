"""Sampling the time series from outside the workers (the monitor process, ``status``).

Workers sample with their frontier calls (lua/monitoring.lua); :func:`sample` runs the same
code alone (lua/sample.lua), so the series go on while no worker lives.  Fleet-wide, a tier
gets at most one sample per step, whoever calls.
"""

from __future__ import annotations

from typing import Any

import redis

from scrapy_fleet import lua
from scrapy_fleet.keys.crawl import CrawlKeys


def sample(client: redis.Redis, keys: CrawlKeys, dead_after: float = 6.0,
           forget_after: float = 120.0) -> bool:
    """Take the samples that are due now; True when a 10 s sample was written (False: one
    was taken this step already).  *dead_after* (seconds): a worker silent longer is not
    counted in ``workers_alive``; one silent longer than *forget_after* leaves the
    ``workers`` list (its heartbeat key has expired by then).

    Raises:
        redis.RedisError: when Redis cannot be reached or refuses the write (OOM).
    """
    script: Any = lua.load(client, "sample.lua")  # the source is read once; run by SHA
    return bool(script(keys=keys.sample_keys(), args=[int(dead_after * 1000),
                                                         int(forget_after * 1000)]))
