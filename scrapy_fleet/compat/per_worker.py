"""Scrapy settings that would act per worker without a word: one start-up warning each.

The audit of every Scrapy setting, component, command and signal that keeps state in one
process is docs/scrapy-compat.md.  Most rows are fleet-wide (the frontier, the filter, the
politeness, the meta keys that travel with a request) or per worker by design (a worker's own
memory, stats, consoles).  The settings here behave per worker although a user means the
crawl: each gets one WARNING line at start-up naming what to use instead, until the fleet has
its own form of them (``CLOSESPIDER_ERRORCOUNT``, ``_*_NO_ITEM``: the budget to use
instead; ``_PAGECOUNT``, ``_TIMEOUT`` and ``_ITEMCOUNT`` are the fleet's budgets, addon.py;
AutoThrottle only with FLEET_ADAPTIVE = False: the default turns it off and carries it over,
addon.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from scrapy.settings import BaseSettings

#: Scrapy's CloseSpider settings (scrapy/extensions/closespider.py), each counted by the
#: process that reads it
CLOSESPIDER = ("CLOSESPIDER_PAGECOUNT", "CLOSESPIDER_ITEMCOUNT", "CLOSESPIDER_ERRORCOUNT",
               "CLOSESPIDER_TIMEOUT", "CLOSESPIDER_PAGECOUNT_NO_ITEM",
               "CLOSESPIDER_TIMEOUT_NO_ITEM")


def _number(settings: BaseSettings, name: str) -> float:
    # settings[name], not getfloat(): Scrapy's get() warns about a deprecated setting
    # (CONCURRENT_REQUESTS_PER_IP, Scrapy 2.19) and Scrapy warns once already
    try:
        return float(settings[name] or 0)
    except (TypeError, ValueError):
        return 0.0  # Scrapy itself reports a value it cannot read


#: what a user may set instead of a CloseSpider setting the fleet does not carry over
#: (CLOSESPIDER_PAGECOUNT, _TIMEOUT and _ITEMCOUNT become FLEET_BUDGET_PAGES / _SECONDS /
#: _ITEMS: budget_settings.py)
_INSTEAD = {"CLOSESPIDER_ITEMCOUNT": "FLEET_BUDGET_ITEMS",
            "CLOSESPIDER_ERRORCOUNT": "FLEET_BUDGET_PAGES (pages, not errors)",
            "CLOSESPIDER_PAGECOUNT_NO_ITEM": "FLEET_BUDGET_PAGES",
            "CLOSESPIDER_TIMEOUT": "FLEET_BUDGET_SECONDS",
            "CLOSESPIDER_TIMEOUT_NO_ITEM": "FLEET_BUDGET_SECONDS"}


def _closespider(settings: BaseSettings) -> Iterator[str]:
    for name in CLOSESPIDER:
        value = _number(settings, name)
        if value > 0:
            yield (f"{name}={value:g} is counted by each worker, not by the fleet: N workers "
                   f"go on until each has reached it; the fleet-wide budget is "
                   f"{_INSTEAD.get(name, 'FLEET_BUDGET_PAGES')} (docs/control.md)")


def _autothrottle(settings: BaseSettings) -> Iterator[str]:
    if settings.getbool("AUTOTHROTTLE_ENABLED"):
        yield ("AUTOTHROTTLE_ENABLED: each worker runs its own AutoThrottle, which adjusts only "
               "its own delay (N workers are N controllers) because FLEET_ADAPTIVE is off; the "
               "fleet's one controller per host is FLEET_ADAPTIVE = True (the default), which "
               "turns AutoThrottle off and carries its settings over")


def _slots(settings: BaseSettings) -> Iterator[str]:
    slots = settings.getdict("DOWNLOAD_SLOTS")
    if slots:
        yield (f"DOWNLOAD_SLOTS ({', '.join(sorted(map(str, slots)))}) sets a concurrency and "
               f"delay in each worker: N workers send N times as much to such a slot; the "
               f"fleet-wide form is FLEET_HOST_OVERRIDES = {{host: {{\"concurrency\": N, "
               f"\"delay\": S}}}}")
    per_ip = _number(settings, "CONCURRENT_REQUESTS_PER_IP")
    if per_ip > 0:
        yield (f"CONCURRENT_REQUESTS_PER_IP={per_ip:g} caps each worker's requests per IP "
               f"address, not the fleet's; the fleet-wide cap per IP is FLEET_HOST_KEY = "
               f"\"ip\" with FLEET_HOST_CONCURRENCY = {per_ip:g}")


def _local_state(settings: BaseSettings) -> Iterator[str]:
    if settings.get("JOBDIR"):
        yield ("JOBDIR is not needed by a fleet worker: its queue and seen requests are in "
               "Redis, and a stopped crawl resumes from there; only spider.state is kept in "
               "JOBDIR, by each worker for itself")
    feeds = [str(uri) for uri in settings.getdict("FEEDS")
             if "://" not in str(uri) or str(uri).startswith("file://")]
    if feeds:
        yield (f"FEEDS ({', '.join(feeds)}): each worker writes the items it scraped to its own "
               f"feed, kept in memory until it closes (a killed worker's are lost; workers on "
               f"one machine given the same file name overwrite each other's); durable items "
               f"per worker: FLEET_JSONL_PATH = \"items-%(worker)s.jsonl\"")


_CHECKS: tuple[Callable[[BaseSettings], Iterator[str]], ...] = (
    _closespider, _autothrottle, _slots, _local_state)


def idle_handlers(signal_manager: Any) -> list[Any]:
    """The receivers of ``spider_idle`` connected so far to *signal_manager* (a crawler's
    ``signals``: the spider's, connected in its ``from_crawler``; extensions built after the
    fleet's start-up check are not seen)."""
    from pydispatch import dispatcher  # Scrapy's signal dispatcher
    from scrapy import signals

    return list(dispatcher.getAllReceivers(signal_manager.sender, signals.spider_idle))


def idle_warning(signal_manager: Any, idle_timeout: float | None) -> str | None:
    """The warning for a ``spider_idle`` handler that a worker never calls: a fleet worker
    sends ``spider_idle`` once the whole fleet has been idle for ``FLEET_IDLE_TIMEOUT``
    seconds, so never with ``FLEET_IDLE_TIMEOUT = None`` (the default).  None: no such
    handler, or a timeout is set."""
    if idle_timeout is not None or not idle_handlers(signal_manager):
        return None
    return ("a spider_idle handler is connected, but a fleet worker sends spider_idle only "
            "once the whole fleet has been idle for FLEET_IDLE_TIMEOUT seconds, and never with "
            "FLEET_IDLE_TIMEOUT=None (the default): set FLEET_IDLE_TIMEOUT, or feed the crawl "
            "with scrapy fleet push")


def per_worker_settings(settings: BaseSettings) -> list[str]:
    """One line (no trailing period) for each Scrapy setting in *settings* that acts in each
    worker alone although the user means the crawl (docs/scrapy-compat.md), in a fixed
    order; empty when there is none."""
    return [line for check in _CHECKS for line in check(settings)]


def warn_per_worker_settings(settings: BaseSettings, warn: Callable[..., Any]) -> int:
    """Call *warn* (``logger.warning``) once per line of :func:`per_worker_settings`;
    returns how many."""
    lines = per_worker_settings(settings)
    for line in lines:
        warn("%s", line)
    return len(lines)
