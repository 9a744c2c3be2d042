"""The dupefilter's settings (``FLEET_DUPEFILTER_CAPACITY``, ``FLEET_DUPEFILTER_ERROR_RATE``,
``FLEET_DUPEFILTER_CACHE``), read once into one validated :class:`DupefilterConfig`; the
catalog rows are in catalog.py, and ``FleetConfig.dupefilter`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import check, number, setting_value
from scrapy_fleet.frontier.bloom import MAX_SLICE_BITS, slice_params


@dataclass(frozen=True)
class DupefilterConfig:
    """Validated dupefilter settings: the Bloom filter's first slice (``capacity``
    fingerprints at ``error_rate``), and ``cache``, the Bloom keys a worker remembers as seen
    (0: none)."""

    capacity: int = 1_000_000
    error_rate: float = 0.001
    cache: int = 100_000


def dupefilter_config(settings: BaseSettings | Mapping[str, Any]) -> DupefilterConfig:
    """Read and validate the dupefilter settings.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    error_rate = number("FLEET_DUPEFILTER_ERROR_RATE", g("FLEET_DUPEFILTER_ERROR_RATE"),
                        float, 0.0, "a probability between 0 and 0.5", exclusive=True)
    check("FLEET_DUPEFILTER_ERROR_RATE", error_rate, error_rate <= 0.5,
          "a probability between 0 and 0.5")
    capacity = number("FLEET_DUPEFILTER_CAPACITY", g("FLEET_DUPEFILTER_CAPACITY"), int, 1,
                      "an integer >= 1")
    check("FLEET_DUPEFILTER_CAPACITY", capacity,
          slice_params(capacity, error_rate, 0).bits <= MAX_SLICE_BITS,
          "a capacity whose first Bloom slice fits in one Redis string (512 MB)")
    cache = number("FLEET_DUPEFILTER_CACHE", g("FLEET_DUPEFILTER_CACHE"), int, 0,
                   "an integer >= 0")
    return DupefilterConfig(capacity=capacity, error_rate=error_rate, cache=cache)
