"""The back pressure settings (``FLEET_QUEUE_MAX``, ``FLEET_QUEUE_LOW_WATERMARK``,
``FLEET_HOST_QUEUE_MAX``, ``FLEET_BACKPRESSURE_DELAY``: the frontier's bounds,
docs/backpressure.md), read once into one validated :class:`BackpressureConfig`; the catalog
rows are in catalog.py, and ``FleetConfig.backpressure`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import bound, check, number, setting_value


@dataclass(frozen=True)
class BackpressureConfig:
    """Validated bounds: ``queue_max`` entries in the frontier and ``host_queue_max`` per host
    (None: unbounded), ``low_watermark`` (a fraction of ``queue_max``) and ``delay`` (seconds
    a request over a bound is deferred)."""

    queue_max: int | None = 1_000_000
    low_watermark: float = 0.9
    host_queue_max: int | None = None
    delay: float = 10.0

    @property
    def queue_low(self) -> int | None:
        """Size under which paused producers resume (FLEET_QUEUE_LOW_WATERMARK of the max,
        at least 1: an empty frontier always lets them go on)."""
        if self.queue_max is None:
            return None
        return max(int(self.queue_max * self.low_watermark), 1)


def backpressure_config(settings: BaseSettings | Mapping[str, Any]) -> BackpressureConfig:
    """Read and validate the back pressure settings.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    low = number("FLEET_QUEUE_LOW_WATERMARK", g("FLEET_QUEUE_LOW_WATERMARK"), float, 0.0,
                 "a fraction of FLEET_QUEUE_MAX between 0 and 1", exclusive=True)
    check("FLEET_QUEUE_LOW_WATERMARK", low, low < 1.0,
          "a fraction of FLEET_QUEUE_MAX between 0 and 1")
    return BackpressureConfig(
        queue_max=bound("FLEET_QUEUE_MAX", g("FLEET_QUEUE_MAX")),
        low_watermark=low,
        host_queue_max=bound("FLEET_HOST_QUEUE_MAX", g("FLEET_HOST_QUEUE_MAX")),
        delay=number("FLEET_BACKPRESSURE_DELAY", g("FLEET_BACKPRESSURE_DELAY"), float, 0.0,
                     "seconds >= 0"))
