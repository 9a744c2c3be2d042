"""The memory warnings of a bounded frontier, from Redis's maxmemory policy, limit and use
(e2e/test_backpressure.py runs the bounded crawls)."""

from __future__ import annotations

import pytest

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.memory import memory_warnings


@pytest.mark.parametrize("policy,maxmemory,used,expected", [
    ("noeviction", 0, 10**6, []),
    ("volatile-lru", 0, 10**6, []),
    ("allkeys-lru", 0, 10**6, ["maxmemory-policy is 'allkeys-lru'"]),
    ("noeviction", 50 * 10**6, 10**6, ["may need about"]),
])
def test_memory_warnings(policy, maxmemory, used, expected):
    config = FleetConfig.from_settings({"FLEET_QUEUE_MAX": 1_000_000})
    warnings = memory_warnings(policy, maxmemory, used, config)
    assert len(warnings) == len(expected)
    for warning, fragment in zip(warnings, expected, strict=True):
        assert fragment in warning
