"""The stages' settings (``FLEET_ROLE``, ``FLEET_LARGE_RESPONSE``,
``FLEET_RESPONSE_QUEUE_MAX``, ``FLEET_RESPONSE_QUEUE_BYTES``, ``FLEET_MAX_STORED_RESPONSE``),
read once into one validated :class:`StageConfig` (docs/stages.md); the catalog rows are in
catalog.py, and ``FleetConfig.stages`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import check, number, setting_value

#: the values of FLEET_ROLE
ROLES = ("all", "fetch", "parse")


@dataclass(frozen=True)
class StageConfig:
    """Validated stage settings: what ``FLEET_ROLE`` a worker has, and the bounds of the
    response queue between fetch and parse workers (bytes, counts)."""

    role: str = "all"
    large_response: str = "parse"
    response_queue_max: int = 1000
    response_queue_bytes: int = 256 * 1024 * 1024
    max_stored_response: int = 8 * 1024 * 1024


def stage_config(settings: BaseSettings | Mapping[str, Any]) -> StageConfig:
    """Read and validate the stage settings.

    Raises:
        FleetConfigError: naming the setting and the value.
    """
    role = setting_value(settings, "FLEET_ROLE")
    check("FLEET_ROLE", role, role in ROLES, '"all", "fetch" or "parse"')
    large = setting_value(settings, "FLEET_LARGE_RESPONSE")
    check("FLEET_LARGE_RESPONSE", large, large in ("parse", "fail"), '"parse" or "fail"')
    bounds = {attr: number(name, setting_value(settings, name), int, 1, "an integer >= 1")
              for name, attr in (("FLEET_RESPONSE_QUEUE_MAX", "response_queue_max"),
                                 ("FLEET_RESPONSE_QUEUE_BYTES", "response_queue_bytes"),
                                 ("FLEET_MAX_STORED_RESPONSE", "max_stored_response"))}
    return StageConfig(role=role, large_response=large, **bounds)
