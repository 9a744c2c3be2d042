"""The recrawl settings (``FLEET_RECRAWL*``, docs/recrawl.md), read once into one validated
:class:`RecrawlConfig`; the catalog rows are in catalog.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import boolean, bound, check, number, setting_value

#: FLEET_RECRAWL's values
MODES = ("off", "fixed", "adaptive")
#: FLEET_RECRAWL_ITEMS' values
ITEMS = ("changed", "all")


@dataclass(frozen=True)
class RecrawlConfig:
    """``mode``: off, fixed or adaptive; intervals in seconds; ``max_tracked``: the schedule's
    bound (None: unbounded); ``gone_after``: 404/410 answers in a row that drop a URL;
    ``budget``: the share of a host's rate its revisits may take (0: none); ``items``:
    ``changed`` (a revisit's items go to the pipelines only when they changed) or ``all``;
    ``ignore_fields``: item fields left out of the comparison; ``near_duplicates``: a page
    without items is compared by simhash (recrawl/signature.py)."""

    mode: str = "off"
    #: host key -> its own FLEET_RECRAWL_INTERVAL (FLEET_HOST_OVERRIDES' recrawl_interval)
    host_intervals: dict[str, float] = field(default_factory=dict)
    #: FLEET_HOST_KEY, to find a URL's host key
    host_key: str = "host"
    interval: float = 86400.0
    min_interval: float = 3600.0
    max_interval: float = 30 * 86400.0
    max_tracked: int | None = 10_000_000
    gone_after: int = 2
    #: adaptive: the share of a host's rate (FLEET_HOST_RATE, DOWNLOAD_DELAY, its override,
    #: robots.txt Crawl-delay) its revisits may take (recrawl/budget.py); 0: no budget
    budget: float = 0.8
    items: str = "changed"
    ignore_fields: frozenset[str] = frozenset()
    near_duplicates: bool = False

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def for_host(self, host: str) -> RecrawlConfig:
        """This config with *host*'s own interval (FLEET_HOST_OVERRIDES) as the interval."""
        own = self.host_intervals.get(host)
        return self if own is None else replace(self, interval=own)


def recrawl_config(settings: BaseSettings | Mapping[str, Any]) -> RecrawlConfig:
    """Read and validate the ``FLEET_RECRAWL*`` settings.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    mode = g("FLEET_RECRAWL")
    if isinstance(mode, bool) and not mode:
        mode = "off"
    mode = mode.strip().lower() if isinstance(mode, str) else mode
    check("FLEET_RECRAWL", g("FLEET_RECRAWL"), mode in MODES, "one of off, fixed, adaptive")
    interval = number("FLEET_RECRAWL_INTERVAL", g("FLEET_RECRAWL_INTERVAL"), float, 1.0,
                      "seconds >= 1")
    low = number("FLEET_RECRAWL_MIN_INTERVAL", g("FLEET_RECRAWL_MIN_INTERVAL"), float, 1.0,
                 "seconds >= 1")
    high = number("FLEET_RECRAWL_MAX_INTERVAL", g("FLEET_RECRAWL_MAX_INTERVAL"), float, 1.0,
                  "seconds >= 1")
    check("FLEET_RECRAWL_MAX_INTERVAL", g("FLEET_RECRAWL_MAX_INTERVAL"), high >= low,
          f"seconds >= FLEET_RECRAWL_MIN_INTERVAL={low!r}")
    host_intervals = {}
    overrides = g("FLEET_HOST_OVERRIDES")
    if isinstance(overrides, str):
        import json

        try:
            overrides = json.loads(overrides) if overrides.strip() else {}
        except ValueError:
            overrides = {}  # (config.py names the setting and the value)
    if isinstance(overrides, dict):
        for host, spec in overrides.items():
            if isinstance(spec, dict) and spec.get("recrawl_interval") is not None:
                host_intervals[str(host).lower()] = number(
                    f"FLEET_HOST_OVERRIDES[{host!r}]['recrawl_interval']",
                    spec["recrawl_interval"], float, 1.0, "seconds >= 1")
    budget = number("FLEET_RECRAWL_BUDGET", g("FLEET_RECRAWL_BUDGET"), float, 0.0,
                    "a share of the host's rate, 0 .. 1")
    check("FLEET_RECRAWL_BUDGET", g("FLEET_RECRAWL_BUDGET"), budget <= 1.0,
          "a share of the host's rate, 0 .. 1")
    items = g("FLEET_RECRAWL_ITEMS")
    items = items.strip().lower() if isinstance(items, str) else items
    check("FLEET_RECRAWL_ITEMS", g("FLEET_RECRAWL_ITEMS"), items in ITEMS, "changed or all")
    ignore = g("FLEET_RECRAWL_IGNORE_FIELDS")
    if isinstance(ignore, str):
        ignore = [v.strip() for v in ignore.split(",") if v.strip()]
    check("FLEET_RECRAWL_IGNORE_FIELDS", g("FLEET_RECRAWL_IGNORE_FIELDS"),
          isinstance(ignore, (list, tuple, set, frozenset))
          and all(isinstance(v, str) and v for v in ignore), "a list of field names")
    return RecrawlConfig(budget=budget, items=str(items), ignore_fields=frozenset(ignore),
        near_duplicates=boolean("FLEET_RECRAWL_NEAR_DUPLICATES",
                                g("FLEET_RECRAWL_NEAR_DUPLICATES")),
        host_intervals=host_intervals, host_key=str(g("FLEET_HOST_KEY")),
        mode=str(mode), interval=interval, min_interval=low, max_interval=high,
        max_tracked=bound("FLEET_RECRAWL_MAX", g("FLEET_RECRAWL_MAX")),
        gone_after=number("FLEET_RECRAWL_GONE_AFTER", g("FLEET_RECRAWL_GONE_AFTER"), int, 1,
                          "an integer >= 1"))
