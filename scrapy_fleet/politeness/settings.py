"""The politeness settings (``FLEET_HOST_*``, ``FLEET_ROBOTSTXT_*``, ``FLEET_MAX_CRAWL_DELAY``,
``FLEET_BACKOFF_*`` and Scrapy's ``ROBOTSTXT_OBEY``; docs/politeness.md), read once into one
validated :class:`PolitenessConfig`; the catalog rows are in catalog.py, and
``FleetConfig.politeness`` holds the worker's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import boolean, check, number, setting_value
from scrapy_fleet.errors import FleetConfigError

#: values of FLEET_HOST_KEY (politeness.hosts.host_key)
HOST_KEY_MODES = ("host", "domain", "ip")

#: one host's override: (interval seconds or None, burst or None, concurrency or None,
#: interval from a rate?)
HostOverride = tuple[float | None, int | None, int | None, bool]


def host_overrides(value: Any) -> dict[str, HostOverride]:
    """``{"example.com": {"rate": 0.5, "burst": 2, "concurrency": 1, "delay": 3}}`` ->
    host -> (interval seconds or None, burst or None, concurrency or None, interval from a
    rate?).

    Raises:
        FleetConfigError: naming ``FLEET_HOST_OVERRIDES`` (or the host's entry) and the value.
    """
    name = "FLEET_HOST_OVERRIDES"
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise FleetConfigError(f"{name}={value!r} is invalid: expected a dict "
                                   "(JSON on the command line)") from None
    check(name, value, isinstance(value, dict), "a dict of host -> {rate, burst, "
           "concurrency, delay, recrawl_interval, budget_pages}")
    out: dict[str, HostOverride] = {}
    for host, spec in value.items():
        where = f"{name}[{host!r}]"
        check(where, spec, isinstance(host, str) and isinstance(spec, dict)
               and set(spec) <= {"rate", "burst", "concurrency", "delay", "recrawl_interval",
                                 "budget_pages"},  # (budget_settings.py reads budget_pages)
               "a dict with keys among rate, burst, concurrency, delay, recrawl_interval, "
               "budget_pages")
        interval = None
        is_rate = False
        if spec.get("rate") is not None:
            interval = 1.0 / number(f"{where}['rate']", spec["rate"], float, 0.0,
                                     "requests per second > 0", exclusive=True)
            is_rate = True
        if spec.get("delay") is not None:
            d = number(f"{where}['delay']", spec["delay"], float, 0.0, "seconds >= 0")
            if d >= (interval or 0.0):
                interval, is_rate = d, False
        burst = None if spec.get("burst") is None else number(
            f"{where}['burst']", spec["burst"], int, 1, "an integer >= 1")
        conc = None if spec.get("concurrency") is None else number(
            f"{where}['concurrency']", spec["concurrency"], int, 0, "an integer >= 0")
        out[host.lower()] = (interval, burst, conc, is_rate)
    return out


@dataclass(frozen=True)
class AdaptiveConfig:
    """``FLEET_ADAPTIVE_*``: the per-host controller (lua/adaptive.lua).  ``enabled``;
    ``beta`` (rate factor per overload event), ``step`` (fraction of the configured rate
    added per clean window), ``window`` (seconds), ``latency_factor`` (g; 0: no latency rule),
    ``min_rate`` (requests/s, the slowest it goes), ``overload_statuses`` (HTTP statuses
    that count as overload), ``memory`` (seconds a host's learned capacity is kept for the
    next crawls, fleet-wide; 0: not kept)."""

    enabled: bool = True
    beta: float = 0.5
    step: float = 0.05
    window: float = 1.0
    latency_factor: float = 2.0
    min_rate: float = 0.05
    overload_statuses: frozenset[int] = frozenset({429, 503})
    memory: float = 7 * 86400.0


def adaptive_config(settings: BaseSettings | Mapping[str, Any]) -> AdaptiveConfig:
    """Read and validate ``FLEET_ADAPTIVE*``.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    statuses = g("FLEET_ADAPTIVE_OVERLOAD_STATUSES")
    if isinstance(statuses, str):
        try:
            statuses = json.loads(statuses) if statuses.strip().startswith("[") else \
                [int(x) for x in statuses.split(",") if x.strip()]
        except ValueError:
            raise FleetConfigError(f"FLEET_ADAPTIVE_OVERLOAD_STATUSES={statuses!r} is invalid: "
                                   "expected a list of HTTP statuses") from None
    check("FLEET_ADAPTIVE_OVERLOAD_STATUSES", statuses,
          isinstance(statuses, (list, tuple, set, frozenset))
          and all(isinstance(x, int) and 100 <= x <= 599 for x in statuses),
          "a list of HTTP statuses (100-599)")
    factor = number("FLEET_ADAPTIVE_LATENCY_FACTOR", g("FLEET_ADAPTIVE_LATENCY_FACTOR"), float,
                    0.0, "0 or a float >= 1")
    check("FLEET_ADAPTIVE_LATENCY_FACTOR", factor, factor == 0 or factor >= 1,
          "0 or a float >= 1")
    beta = number("FLEET_ADAPTIVE_BETA", g("FLEET_ADAPTIVE_BETA"), float, 0.0,
                  "a float in (0, 1)", exclusive=True)
    check("FLEET_ADAPTIVE_BETA", beta, beta < 1, "a float in (0, 1)")
    step = number("FLEET_ADAPTIVE_STEP", g("FLEET_ADAPTIVE_STEP"), float, 0.0,
                  "a float in (0, 1]", exclusive=True)
    check("FLEET_ADAPTIVE_STEP", step, step <= 1, "a float in (0, 1]")
    min_rate = g("FLEET_ADAPTIVE_MIN_RATE")
    min_rate = 0.05 if min_rate is None else number(
        "FLEET_ADAPTIVE_MIN_RATE", min_rate, float, 0.0, "requests per second > 0",
        exclusive=True)
    return AdaptiveConfig(
        enabled=boolean("FLEET_ADAPTIVE", g("FLEET_ADAPTIVE")), beta=beta, step=step,
        window=number("FLEET_ADAPTIVE_WINDOW", g("FLEET_ADAPTIVE_WINDOW"), float, 0.0,
                      "seconds > 0", exclusive=True),
        latency_factor=factor, min_rate=min_rate, overload_statuses=frozenset(statuses),
        memory=number("FLEET_ADAPTIVE_MEMORY", g("FLEET_ADAPTIVE_MEMORY"), float, 0.0,
                      "seconds >= 0"))


@dataclass(frozen=True)
class PolitenessConfig:
    """Validated politeness settings, fleet-wide per host key.  Times are seconds.

    ``host_rate`` requests per second or None, ``host_burst`` (GCRA burst), ``host_delay``
    (seconds between two requests; the project's DOWNLOAD_DELAY by default),
    ``host_concurrency`` (requests in flight; 0: no cap), ``host_overrides`` (host ->
    :data:`HostOverride`), ``host_key`` (one of :data:`HOST_KEY_MODES`), ``robots_obey``
    (Scrapy's ROBOTSTXT_OBEY), ``robotstxt_ttl``, ``robotstxt_hold``,
    ``robotstxt_max_attempts`` (0: no limit), ``max_crawl_delay``, ``skip_crawl_delay_over``
    (s; None: no host skipped for its Crawl-delay), ``backoff_base``,
    ``backoff_max``, ``adaptive`` (:class:`AdaptiveConfig`).
    """

    host_rate: float | None = None
    host_burst: int = 1
    host_delay: float = 0.0
    host_concurrency: int = 8
    host_overrides: dict[str, HostOverride] = field(default_factory=dict)
    host_key: str = "host"
    robots_obey: bool = False
    robotstxt_ttl: float = 3600.0
    robotstxt_hold: float = 60.0
    robotstxt_max_attempts: int = 4
    max_crawl_delay: float | None = None  #: None: a Crawl-delay is not capped
    skip_crawl_delay_over: float | None = None
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    adaptive: AdaptiveConfig = field(default_factory=lambda: AdaptiveConfig())

    @property
    def host_interval(self) -> float:
        """Seconds between two requests to one host, fleet-wide: the longer of
        FLEET_HOST_DELAY (the project's DOWNLOAD_DELAY by default) and 1 / FLEET_HOST_RATE."""
        return max(self.host_delay, 1.0 / self.host_rate if self.host_rate else 0.0)

    @property
    def rate_sets_interval(self) -> bool:
        """Whether 1 / FLEET_HOST_RATE (a GCRA with its burst), not FLEET_HOST_DELAY, sets
        the interval."""
        return self.host_rate is not None and 1.0 / self.host_rate > self.host_delay


def politeness_config(settings: BaseSettings | Mapping[str, Any]) -> PolitenessConfig:
    """Read and validate the politeness settings.

    Raises:
        FleetConfigError: naming the first wrong setting and its value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    host_key = g("FLEET_HOST_KEY")
    check("FLEET_HOST_KEY", host_key, host_key in HOST_KEY_MODES, "one of host, domain, ip")
    rate = g("FLEET_HOST_RATE")
    if isinstance(rate, str) and rate.strip().lower() in ("", "none"):
        rate = None
    if rate is not None:
        rate = number("FLEET_HOST_RATE", rate, float, 0.0,
                      "requests per second > 0 or None", exclusive=True)
    # a value taken from the Scrapy setting it translates is refused under that setting's
    # name: the one the user wrote (issue 30)
    delay, delay_name = g("FLEET_HOST_DELAY"), "FLEET_HOST_DELAY"
    if delay is None:  # the add-on moves a valid DOWNLOAD_DELAY here, leaves a bad one
        delay = settings.get("DOWNLOAD_DELAY", 0) if hasattr(settings, "get") else 0
        delay_name = "DOWNLOAD_DELAY"
    concurrency, concurrency_name = g("FLEET_HOST_CONCURRENCY"), "FLEET_HOST_CONCURRENCY"
    if concurrency is None:  # Scrapy's own setting, read as Scrapy reads it (8.0 is 8)
        concurrency = settings.get("CONCURRENT_REQUESTS_PER_DOMAIN", 8)
        concurrency_name = "CONCURRENT_REQUESTS_PER_DOMAIN"
        if isinstance(concurrency, float) and concurrency.is_integer():
            concurrency = int(concurrency)
    overrides = host_overrides(g("FLEET_HOST_OVERRIDES"))
    return PolitenessConfig(
        host_rate=rate,
        host_burst=number("FLEET_HOST_BURST", g("FLEET_HOST_BURST"), int, 1, "an integer >= 1"),
        host_delay=number(delay_name, delay, float, 0.0, "seconds >= 0"),
        host_concurrency=number(concurrency_name, concurrency, int, 0,
                                "an integer >= 0 (0: no cap)"),
        host_overrides=overrides,
        host_key=host_key,
        robots_obey=boolean("ROBOTSTXT_OBEY", settings.get("ROBOTSTXT_OBEY", False) or False),
        robotstxt_ttl=number("FLEET_ROBOTSTXT_TTL", g("FLEET_ROBOTSTXT_TTL"), float, 1.0,
                             "seconds >= 1"),
        robotstxt_hold=number("FLEET_ROBOTSTXT_HOLD", g("FLEET_ROBOTSTXT_HOLD"), float, 0.0,
                              "seconds >= 0"),
        robotstxt_max_attempts=number("FLEET_ROBOTSTXT_MAX_ATTEMPTS",
                                      g("FLEET_ROBOTSTXT_MAX_ATTEMPTS"), int, 0,
                                      "an integer >= 0 (0: no limit)"),
        max_crawl_delay=None if g("FLEET_MAX_CRAWL_DELAY") in (None, "", "None", "none")
        else number("FLEET_MAX_CRAWL_DELAY", g("FLEET_MAX_CRAWL_DELAY"), float, 0.0,
                    "seconds >= 0 or None"),
        skip_crawl_delay_over=None if g("FLEET_SKIP_CRAWL_DELAY_OVER") in (
            None, "", "None", "none") else number(
            "FLEET_SKIP_CRAWL_DELAY_OVER", g("FLEET_SKIP_CRAWL_DELAY_OVER"), float, 0.0,
            "seconds > 0 or None", exclusive=True),
        backoff_base=number("FLEET_BACKOFF_BASE", g("FLEET_BACKOFF_BASE"), float, 0.0,
                            "seconds > 0", exclusive=True),
        backoff_max=number("FLEET_BACKOFF_MAX", g("FLEET_BACKOFF_MAX"), float, 0.0,
                           "seconds > 0", exclusive=True),
        adaptive=adaptive_config(settings),
    )
