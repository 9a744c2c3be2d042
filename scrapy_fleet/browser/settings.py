"""The browser's settings (``FLEET_PLAYWRIGHT``, ``FLEET_PLAYWRIGHT_ABORT``), read once into
one validated :class:`BrowserConfig` (docs/browser.md); the catalog rows are in catalog.py,
and ``FleetConfig.browser`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.browser.handler import DEFAULT_ABORT, RESOURCE_TYPES, abort_types
from scrapy_fleet.checks import boolean, check, setting_value
from scrapy_fleet.errors import FleetConfigError


@dataclass(frozen=True)
class BrowserConfig:
    """Validated browser settings: pages rendered by scrapy-playwright (``playwright``) and
    the Playwright resource types its pages do not load (``abort``)."""

    playwright: bool = False
    abort: tuple[str, ...] = DEFAULT_ABORT


def browser_config(settings: BaseSettings | Mapping[str, Any]) -> BrowserConfig:
    """Read and validate the browser settings.

    Raises:
        FleetConfigError: naming the setting and the value, or, with FLEET_PLAYWRIGHT on,
            when scrapy-playwright is not installed.
    """
    enabled = boolean("FLEET_PLAYWRIGHT", setting_value(settings, "FLEET_PLAYWRIGHT"))
    abort = abort_types(setting_value(settings, "FLEET_PLAYWRIGHT_ABORT"))
    check("FLEET_PLAYWRIGHT_ABORT", abort,
           isinstance(abort, (list, tuple)) and all(t in RESOURCE_TYPES for t in abort),
           f"a list of Playwright resource types ({', '.join(sorted(RESOURCE_TYPES))})")
    if enabled:
        try:
            import scrapy_playwright  # noqa: F401
        except ImportError:
            raise FleetConfigError(
                "FLEET_PLAYWRIGHT=True needs scrapy-playwright: pip install scrapy-playwright "
                "(and a browser: PLAYWRIGHT_LAUNCH_OPTIONS = {\"executable_path\": ...})"
            ) from None
    return BrowserConfig(playwright=enabled, abort=tuple(abort))
