"""The crawl's budgets (issue 34, docs/control.md "Budgets"): ``FLEET_BUDGET_PAGES``,
``FLEET_BUDGET_SECONDS``, ``FLEET_BUDGET_ITEMS``, ``FLEET_BUDGET_BYTES``,
``FLEET_HOST_BUDGET_PAGES`` and
``FLEET_HOST_OVERRIDES``' ``budget_pages``, and Scrapy's ``CLOSESPIDER_PAGECOUNT`` /
``_TIMEOUT`` / ``_ITEMCOUNT`` carried over to them (:func:`carry_closespider`, called by the
add-on).

The numbers travel with every frontier call (frontier/protocol.py ``bgp bgs bgh``); the lease
step charges them (lua/step_budget.lua); ``scrapy fleet budget`` stores numbers in Redis that
stand above these settings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import check, number, setting_value
from scrapy_fleet.errors import FleetConfigError

logger = logging.getLogger(__name__)

#: Scrapy's CloseSpider setting -> the fleet budget it becomes (the user's one number is the
#: crawl's number, not each worker's)
CARRIED = {"CLOSESPIDER_PAGECOUNT": "FLEET_BUDGET_PAGES",
           "CLOSESPIDER_TIMEOUT": "FLEET_BUDGET_SECONDS",
           "CLOSESPIDER_ITEMCOUNT": "FLEET_BUDGET_ITEMS"}


@dataclass(frozen=True)
class BudgetConfig:
    """``pages`` (the crawl's page budget, 0: none), ``seconds`` (its time budget from its
    first lease, on Redis's clock; 0: none), ``host_pages`` (every host's page budget, 0:
    none), ``hosts`` (host key -> its own page budget, FLEET_HOST_OVERRIDES) and ``items``
    (items scraped fleet-wide after which nothing more is leased; 0: none), ``bytes`` (the
    same for response bytes)."""

    pages: int = 0
    seconds: float = 0.0
    host_pages: int = 0
    hosts: dict[str, int] = field(default_factory=dict)
    items: int = 0  #: items the workers report, fleet-wide (0: none)
    bytes: int = 0  #: response bytes the workers report, fleet-wide (0: none)

    @property
    def any(self) -> bool:
        """Whether a budget is set."""
        return bool(self.pages or self.seconds or self.host_pages or self.hosts or self.items
                    or self.bytes)


def _optional(name: str, value: Any, kind: type) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return kind(0)
    return number(name, value, kind, 0, f"{'an integer' if kind is int else 'seconds'} > 0 "
                  "or None", exclusive=True)


def _host_budgets(value: Any) -> dict[str, int]:
    """``budget_pages`` of each FLEET_HOST_OVERRIDES entry (politeness/settings.py checks
    the rest of its shape)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}  # politeness/settings.py names the setting
    out: dict[str, int] = {}
    if not isinstance(value, Mapping):
        return out
    for host, spec in value.items():
        if isinstance(spec, Mapping) and spec.get("budget_pages") is not None:
            out[str(host).lower()] = number(f"FLEET_HOST_OVERRIDES[{host!r}]['budget_pages']",
                                            spec["budget_pages"], int, 0,
                                            "an integer > 0", exclusive=True)
    return out


def budget_config(settings: BaseSettings | Mapping[str, Any]) -> BudgetConfig:
    """Read and validate the budget settings.

    Raises:
        FleetConfigError: naming the setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    return BudgetConfig(pages=_optional("FLEET_BUDGET_PAGES", g("FLEET_BUDGET_PAGES"), int),
                        seconds=_optional("FLEET_BUDGET_SECONDS", g("FLEET_BUDGET_SECONDS"),
                                          float),
                        host_pages=_optional("FLEET_HOST_BUDGET_PAGES",
                                             g("FLEET_HOST_BUDGET_PAGES"), int),
                        hosts=_host_budgets(g("FLEET_HOST_OVERRIDES")),
                        items=_optional("FLEET_BUDGET_ITEMS", g("FLEET_BUDGET_ITEMS"), int),
                        bytes=_optional("FLEET_BUDGET_BYTES", g("FLEET_BUDGET_BYTES"), int))


def check_partitions(config: BudgetConfig, partitions: int) -> None:
    """The crawl's time, item and byte budgets hold at one partition only; its page budget
    and per-host budgets at every P (partitions reserve the page budget in chunks:
    frontier/budgetchunks.py; a host lives in one partition).

    Raises:
        FleetConfigError: a time, item or byte budget with FLEET_PARTITIONS > 1.
    """
    for name, value in (("FLEET_BUDGET_SECONDS", config.seconds),
                        ("FLEET_BUDGET_ITEMS", config.items),
                        ("FLEET_BUDGET_BYTES", config.bytes)):
        check(name, value, not value or partitions == 1,
              "None with FLEET_PARTITIONS > 1 (a time, item or byte budget over partitions "
              "is not built yet; FLEET_BUDGET_PAGES and FLEET_HOST_BUDGET_PAGES work at "
              "every P)")


def carry_closespider(settings: BaseSettings) -> list[str]:
    """``CLOSESPIDER_PAGECOUNT``, ``_TIMEOUT`` and ``_ITEMCOUNT`` become the fleet's budgets
    (:data:`CARRIED`) unless the fleet setting is given, and are set to 0 so that Scrapy's
    CloseSpider extension does not also close each worker at its own count.  Returns one
    line per setting carried over (also logged at INFO).  A value that is no number is left
    in place (Scrapy reports it).  With FLEET_PARTITIONS > 1 only CLOSESPIDER_PAGECOUNT is
    carried over (the crawl's other budgets need one partition: :func:`check_partitions`):
    each worker keeps Scrapy's own count of the others, with the start-up warning of
    compat/per_worker.py."""
    try:
        partitioned = int(settings.get("FLEET_PARTITIONS") or 1) > 1
    except (TypeError, ValueError):
        return []  # (config.py names FLEET_PARTITIONS)
    lines = []
    for scrapy_name, fleet_name in CARRIED.items():
        if partitioned and scrapy_name != "CLOSESPIDER_PAGECOUNT":
            continue
        try:
            value = float(settings[scrapy_name] or 0)
        except (TypeError, ValueError):
            continue
        if value <= 0:
            continue
        priority = settings.getpriority(scrapy_name) or 0
        if settings.get(fleet_name) is None:
            carried = value if fleet_name == "FLEET_BUDGET_SECONDS" else int(value)
            settings.set(fleet_name, carried, priority)
            lines.append(f"{scrapy_name}={value:g} is the crawl's budget, fleet-wide "
                         f"({fleet_name}={carried:g}): the fleet stops at that many in all, "
                         f"not each worker")
        else:
            lines.append(f"{scrapy_name}={value:g} is left to {fleet_name}="
                         f"{settings.get(fleet_name)} (the fleet's budget, given)")
        settings.set(scrapy_name, 0, max(priority, 15))
    for line in lines:
        logger.info("%s", line)
    return lines


__all__ = [
    "CARRIED",
    "BudgetConfig",
    "FleetConfigError",
    "budget_config",
    "carry_closespider",
    "check_partitions",
]
