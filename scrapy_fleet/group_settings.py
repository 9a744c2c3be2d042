"""Crawl groups (issue 34, docs/control.md "Crawl groups"): ``FLEET_CRAWL_GROUP`` and
``FLEET_CRAWL_WEIGHT``.

The crawls of a group keep their own queues, filters, budgets and pauses but share each
host's politeness keys (keys/crawl.py, :attr:`CrawlKeys.politeness_base`); the weight is how the
lease step shares a host's turns among them while several have work (lua/step_group.lua).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import number, setting_value, validate_crawl_id
from scrapy_fleet.errors import FleetConfigError


@dataclass(frozen=True)
class GroupConfig:
    """``name``: the crawl group ("": none); ``weight``: the crawl's share of a host's
    leases in it (> 0; only the ratio between the group's crawls matters)."""

    name: str = ""
    weight: float = 1.0


def group_config(settings: BaseSettings | Mapping[str, Any], partitions: int,
                 redis_url: str) -> GroupConfig:
    """FLEET_CRAWL_GROUP and FLEET_CRAWL_WEIGHT, checked.

    Raises:
        FleetConfigError: a group name that is not 1-100 of ``A-Za-z0-9_.-``, a weight that
            is not a number > 0, or a group with FLEET_PARTITIONS > 1 or on Redis Cluster
            (a frontier call's keys must live in one slot, and a group's politeness keys are
            under the group's own hash tag: docs/control.md).
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    weight = number("FLEET_CRAWL_WEIGHT", g("FLEET_CRAWL_WEIGHT"), float, 0.0, "a number > 0",
                    exclusive=True)
    raw = g("FLEET_CRAWL_GROUP")
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none")):
        return GroupConfig(weight=weight)
    name = validate_crawl_id(raw, "FLEET_CRAWL_GROUP")
    if partitions > 1 or redis_url.split("://", 1)[0] in ("redis+cluster", "rediss+cluster"):
        raise FleetConfigError(
            f"FLEET_CRAWL_GROUP={name!r} cannot be used "
            f"{'with FLEET_PARTITIONS > 1' if partitions > 1 else 'on Redis Cluster'}: a "
            "group's shared politeness keys live under the group's own hash tag, another "
            "slot than the crawl's; use FLEET_PARTITIONS=1 on one Redis (or Sentinel)")
    return GroupConfig(name, weight)
