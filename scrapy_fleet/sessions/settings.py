"""The fleet cookie jars' settings (``FLEET_COOKIES``, ``FLEET_COOKIE_MAX_BYTES``,
docs/sessions.md), read once into one validated :class:`CookieConfig`; the catalog rows are
in catalog.py, and ``FleetConfig.cookies`` holds the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import boolean, number, setting_value


@dataclass(frozen=True)
class CookieConfig:
    """``enabled``: Scrapy's cookie jars live in Redis, shared by the fleet (False: Scrapy's
    own per-process ``CookiesMiddleware``); ``max_bytes``: the largest cookie a jar stores,
    measured as RFC 6265 section 6.1 does (name, value and attributes: here domain and path),
    UTF-8 bytes."""

    enabled: bool = True
    max_bytes: int = 4096


def cookie_config(settings: BaseSettings | Mapping[str, Any]) -> CookieConfig:
    """Read and validate the cookie settings.

    Raises:
        FleetConfigError: naming the setting and the value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    return CookieConfig(
        enabled=boolean("FLEET_COOKIES", g("FLEET_COOKIES")),
        max_bytes=number("FLEET_COOKIE_MAX_BYTES", g("FLEET_COOKIE_MAX_BYTES"), int, 64,
                         "an integer >= 64 (bytes)"))
