"""The fleet sessions' settings (``FLEET_COOKIES``, ``FLEET_COOKIE_MAX_BYTES`` and the
``FLEET_SESSION_*`` of pools and logins, docs/sessions.md), read once into validated
:class:`CookieConfig` and :class:`SessionConfig`; the catalog rows are in catalog.py, and
``FleetConfig.cookies`` / ``FleetConfig.sessions`` hold the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import boolean, number, setting_value, status_codes


@dataclass(frozen=True)
class CookieConfig:
    """``enabled``: Scrapy's cookie jars live in Redis, shared by the fleet (False: Scrapy's
    own per-process ``CookiesMiddleware``); ``max_bytes``: the largest cookie a jar stores,
    measured as RFC 6265 section 6.1 does (name, value and attributes: here domain and path),
    UTF-8 bytes."""

    enabled: bool = True
    max_bytes: int = 4096


@dataclass(frozen=True)
class SessionConfig:
    """Session pools (docs/sessions.md).  ``pool_size``: sessions per pool (0: no pools, a
    request's ``meta["cookiejar"]`` is its session as in Scrapy); ``max_uses``: requests a
    session serves before it is retired (0: no limit); ``max_age``: seconds a session lives
    from its creation (0: no limit); ``max_idle``: seconds a session may go unused (since its
    last use, or its creation) before it is retired (0: no limit); ``retire_statuses``: HTTP
    statuses that retire the session of their response; ``max_errors``: validity-check
    failures in a row (one per generation) that retire a session (0: never);
    ``login_timeout``: seconds a worker's claim on a login lasts (another worker takes it over
    after); ``inherit``: a request yielded from
    a response of a session, to the same pool, is pinned to that session; ``concurrency``:
    requests of one session in flight at once, fleet-wide (0: no cap); ``delay``: seconds
    between the starts of two requests of one session, fleet-wide (0: none)."""

    pool_size: int = 0
    max_uses: int = 0
    max_age: float = 0.0
    max_idle: float = 0.0
    retire_statuses: tuple[int, ...] = (401, 403)
    max_errors: int = 3
    login_timeout: float = 60.0
    inherit: bool = True
    concurrency: int = 1
    delay: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.pool_size > 0


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


def session_config(settings: BaseSettings | Mapping[str, Any]) -> SessionConfig:
    """Read and validate the ``FLEET_SESSION_*`` settings.

    Raises:
        FleetConfigError: naming the setting and the value.
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    return SessionConfig(
        pool_size=number("FLEET_SESSION_POOL_SIZE", g("FLEET_SESSION_POOL_SIZE"), int, 0,
                         "an integer >= 0 (sessions per pool; 0: no pools)"),
        max_uses=number("FLEET_SESSION_MAX_USES", g("FLEET_SESSION_MAX_USES"), int, 0,
                        "an integer >= 0 (requests; 0: no limit)"),
        max_age=number("FLEET_SESSION_MAX_AGE", g("FLEET_SESSION_MAX_AGE"), float, 0.0,
                       "seconds >= 0 (0: no limit)"),
        max_idle=number("FLEET_SESSION_MAX_IDLE", g("FLEET_SESSION_MAX_IDLE"), float, 0.0,
                        "seconds >= 0 (0: no limit)"),
        retire_statuses=status_codes("FLEET_SESSION_RETIRE_STATUSES",
                                  g("FLEET_SESSION_RETIRE_STATUSES")),
        max_errors=number("FLEET_SESSION_MAX_ERRORS", g("FLEET_SESSION_MAX_ERRORS"), int, 0,
                          "an integer >= 0 (0: never retire for failed checks)"),
        login_timeout=number("FLEET_SESSION_LOGIN_TIMEOUT", g("FLEET_SESSION_LOGIN_TIMEOUT"),
                             float, 0.0, "seconds > 0", exclusive=True),
        inherit=boolean("FLEET_SESSION_INHERIT", g("FLEET_SESSION_INHERIT")),
        concurrency=number("FLEET_SESSION_CONCURRENCY", g("FLEET_SESSION_CONCURRENCY"), int, 0,
                           "an integer >= 0 (requests in flight; 0: no cap)"),
        delay=number("FLEET_SESSION_DELAY", g("FLEET_SESSION_DELAY"), float, 0.0,
                     "seconds >= 0 (0: none)"))
