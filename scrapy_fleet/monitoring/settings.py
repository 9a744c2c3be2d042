"""The monitoring settings (``FLEET_HEARTBEAT_INTERVAL``, ``FLEET_WORKER_DEAD_AFTER``,
``FLEET_WORKER_FORGET_AFTER``, ``FLEET_STALL_AFTER``, ``FLEET_ALERT_*``, docs/monitoring.md),
read once into one validated :class:`MonitoringConfig`; the catalog rows are in catalog.py,
and ``FleetConfig.monitoring`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import check, is_fraction, number, setting_value


@dataclass(frozen=True)
class MonitoringConfig:
    """Validated monitoring settings: worker health (seconds) and the alerts' thresholds
    (``monitoring.alerts.AlertConfig.from_config`` reads them)."""

    heartbeat_interval: float = 5.0
    worker_dead_after: float = 6.0
    worker_forget_after: float = 120.0
    stall_after: float = 120.0
    alert_depth_minutes: int = 10
    alert_block_rate: float = 0.2
    alert_block_min_pages: int = 20
    alert_memory_ratio: float = 0.9


def monitoring_config(settings: BaseSettings | Mapping[str, Any]) -> MonitoringConfig:
    """Read and validate the monitoring settings.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    dead_after = number("FLEET_WORKER_DEAD_AFTER", g("FLEET_WORKER_DEAD_AFTER"), float, 0.0,
                        "seconds > 0", exclusive=True)
    forget_after = number("FLEET_WORKER_FORGET_AFTER", g("FLEET_WORKER_FORGET_AFTER"),
                          float, 0.0, "seconds > 0", exclusive=True)
    check("FLEET_WORKER_FORGET_AFTER", g("FLEET_WORKER_FORGET_AFTER"),
          forget_after >= dead_after,
          "seconds >= FLEET_WORKER_DEAD_AFTER (a dead worker is shown until forgotten)")
    heartbeat = number("FLEET_HEARTBEAT_INTERVAL", g("FLEET_HEARTBEAT_INTERVAL"), float,
                       0.0, "seconds > 0", exclusive=True)
    check("FLEET_HEARTBEAT_INTERVAL", g("FLEET_HEARTBEAT_INTERVAL"), heartbeat < dead_after,
          f"seconds < FLEET_WORKER_DEAD_AFTER={dead_after!r} (else a live worker is "
          "shown dead between two heartbeats)")
    for name in ("FLEET_ALERT_BLOCK_RATE", "FLEET_ALERT_MEMORY_RATIO"):
        value = g(name)
        check(name, value, not isinstance(value, bool) and isinstance(value, (int, float, str))
              and is_fraction(value), "a fraction between 0 and 1")
    return MonitoringConfig(
        heartbeat_interval=heartbeat,
        worker_dead_after=dead_after,
        worker_forget_after=forget_after,
        stall_after=number("FLEET_STALL_AFTER", g("FLEET_STALL_AFTER"), float, 0.0,
                           "seconds > 0", exclusive=True),
        alert_depth_minutes=number("FLEET_ALERT_DEPTH_MINUTES", g("FLEET_ALERT_DEPTH_MINUTES"),
                                   int, 1, "an integer >= 1 (minutes)"),
        alert_block_rate=number("FLEET_ALERT_BLOCK_RATE", g("FLEET_ALERT_BLOCK_RATE"), float,
                                0.0, "a fraction between 0 and 1"),
        alert_block_min_pages=number("FLEET_ALERT_BLOCK_MIN_PAGES",
                                     g("FLEET_ALERT_BLOCK_MIN_PAGES"), int, 1,
                                     "an integer >= 1"),
        alert_memory_ratio=number("FLEET_ALERT_MEMORY_RATIO", g("FLEET_ALERT_MEMORY_RATIO"),
                                  float, 0.0, "a fraction between 0 and 1", exclusive=True))
