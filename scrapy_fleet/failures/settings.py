"""The failures' settings (``FLEET_FAILED_MAX``, docs/failures.md), read once into one
validated :class:`FailuresConfig`; the catalog row is in catalog.py, and
``FleetConfig.failures`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import number, setting_value


@dataclass(frozen=True)
class FailuresConfig:
    """Validated failure settings: ``max_kept``, the failed requests kept per crawl (the
    oldest are trimmed past it, counted as ``failed_trimmed``)."""

    max_kept: int = 10_000


def failures_config(settings: BaseSettings | Mapping[str, Any]) -> FailuresConfig:
    """Read and validate the failure settings.

    Raises:
        FleetConfigError: naming the setting and the value.
    """
    return FailuresConfig(max_kept=number("FLEET_FAILED_MAX",
                                          setting_value(settings, "FLEET_FAILED_MAX"), int, 1,
                                          "an integer >= 1"))
