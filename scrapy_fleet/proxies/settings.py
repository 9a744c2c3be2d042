"""The proxy pool's settings (``FLEET_PROXIES``, ``FLEET_PROXY_*``), read once into one
validated :class:`ProxyConfig` (docs/proxies.md); the catalog rows are in catalog.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import check, number, optional_int, setting_value, validate_crawl_id
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.redact import redact

#: schemes of proxy URLs Scrapy's HTTP download handler can use
PROXY_SCHEMES = ("http", "https")


def proxy_urls(value: Any) -> tuple[str, ...]:
    """``FLEET_PROXIES``: a list of URLs, or a string: the path of a file (one URL a line,
    ``#`` comments) or URLs separated by commas or white space.  Errors never show a
    password."""
    name = "FLEET_PROXIES"
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text and "://" not in text.split()[0] and os.path.isfile(text):
            try:
                with open(text, encoding="utf-8") as fh:
                    lines = [line.split("#", 1)[0].strip() for line in fh]
            except (OSError, UnicodeDecodeError) as exc:
                raise FleetConfigError(f"{name}={text!r} is invalid: cannot read the file "
                                       f"({type(exc).__name__})") from None
            value = [line for line in lines if line]
        elif text and "://" not in text:
            raise FleetConfigError(f"{name}={text!r} is invalid: no such file, and not a "
                                   "list of proxy URLs")
        else:
            value = [u for u in re.split(r"[\s,]+", text) if u]
    if not isinstance(value, (list, tuple)) or not all(isinstance(u, str) for u in value):
        raise FleetConfigError(f"{name} is invalid: expected a list of proxy URLs or a file "
                               f"path, got {type(value).__name__}")
    out: list[str] = []
    for url in value:
        url = url.strip()
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in PROXY_SCHEMES or not parts.hostname or port is None:
            raise FleetConfigError(f"{name}: {redact(url)!r} is invalid: expected "
                                   "http://[user:password@]host:port (or https://)")
        if url not in out:
            out.append(url)
    return tuple(out)


@dataclass(frozen=True)
class ProxyConfig:
    """Validated ``FLEET_PROXIES`` and ``FLEET_PROXY_*`` settings (docs/proxies.md), in seconds.

    ``proxies`` are the URLs of ``FLEET_PROXIES`` (credentials included: never log them, use
    :func:`scrapy_fleet.proxies.pool.describe`); ``pool`` is None for the crawl's own pool.
    """

    proxies: tuple[str, ...] = field(repr=False)  # credentials: never in a repr
    pool: str | None
    max_retries: int
    ban_statuses: frozenset[int]
    ban_patterns: tuple[re.Pattern[bytes], ...]
    ban_headers: tuple[tuple[str, re.Pattern[bytes]], ...]
    ban_policy: str
    cooldown_base: float
    cooldown_max: float
    dead_after: int
    dead_recheck: float
    rate: float | None
    concurrency: int
    session_ttl: float
    ticket_ttl: float

    @property
    def enabled(self) -> bool:
        """Proxies are used when FLEET_PROXIES lists some or FLEET_PROXY_POOL names a pool."""
        return bool(self.proxies) or self.pool is not None

    def pool_name(self, crawl_id: str) -> str:
        return self.pool or crawl_id


def _regex(name: str, pattern: Any) -> re.Pattern[bytes]:
    check(name, pattern, isinstance(pattern, (str, bytes)), "a regular expression")
    try:
        return re.compile(pattern.encode("utf-8") if isinstance(pattern, str) else pattern)
    except re.error as exc:
        raise FleetConfigError(f"{name}={pattern!r} is invalid: {exc}") from None


def _json_or(name: str, value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        import json

        try:
            return json.loads(value)
        except ValueError:
            raise FleetConfigError(f"{name}={value!r} is invalid: not JSON") from None
    return value


def proxy_config(settings: BaseSettings | Mapping[str, Any]) -> ProxyConfig:
    """Read and validate the ``FLEET_PROXIES`` and ``FLEET_PROXY_*`` settings.

    Raises:
        FleetConfigError: naming the setting (a proxy URL only with its password hidden).
    """
    g = lambda name: setting_value(settings, name)  # noqa: E731
    pool = g("FLEET_PROXY_POOL")
    if isinstance(pool, str) and pool.strip().lower() in ("", "none"):
        pool = None
    if pool is not None:
        validate_crawl_id(pool, "FLEET_PROXY_POOL")
    statuses = _json_or("FLEET_PROXY_BAN_STATUSES", g("FLEET_PROXY_BAN_STATUSES"))
    if isinstance(statuses, str):
        statuses = [s for s in re.split(r"[\s,]+", statuses) if s]
    check("FLEET_PROXY_BAN_STATUSES", statuses, isinstance(statuses, (list, tuple, set)),
           "a list of HTTP status codes")
    codes = {number("FLEET_PROXY_BAN_STATUSES", s, int, 100, "HTTP status codes 100-599")
             for s in statuses}
    check("FLEET_PROXY_BAN_STATUSES", statuses,
           all(c < 600 for c in codes) and not codes & {404, 410, 429, 407},
           "HTTP status codes 100-599, not 404/410 (never a ban), 429 (rate_limited) or 407 "
           "(proxy_dead)")
    patterns = _json_or("FLEET_PROXY_BAN_PATTERNS", g("FLEET_PROXY_BAN_PATTERNS"))
    if isinstance(patterns, (str, bytes)):
        patterns = [patterns]
    check("FLEET_PROXY_BAN_PATTERNS", patterns, isinstance(patterns, (list, tuple)),
           "a list of regular expressions")
    headers = _json_or("FLEET_PROXY_BAN_HEADERS", g("FLEET_PROXY_BAN_HEADERS"))
    check("FLEET_PROXY_BAN_HEADERS", headers, isinstance(headers, Mapping),
           "a dict of header name -> regular expression")
    policy = g("FLEET_PROXY_BAN_POLICY")
    check("FLEET_PROXY_BAN_POLICY", policy, isinstance(policy, str) and bool(policy),
           "the import path of a ban policy class")
    try:
        from scrapy.utils.misc import load_object

        policy_cls = load_object(policy)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise FleetConfigError(f"FLEET_PROXY_BAN_POLICY={policy!r} is invalid: {exc}") from None
    check("FLEET_PROXY_BAN_POLICY", policy, isinstance(policy_cls, type)
           and callable(getattr(policy_cls, "response_verdict", None)),
           "a class with response_verdict(request, response, site)")
    base = number("FLEET_PROXY_COOLDOWN_BASE", g("FLEET_PROXY_COOLDOWN_BASE"), float, 0.0,
                   "seconds > 0", exclusive=True)
    cap = number("FLEET_PROXY_COOLDOWN_MAX", g("FLEET_PROXY_COOLDOWN_MAX"), float, 0.0,
                  "seconds > 0", exclusive=True)
    check("FLEET_PROXY_COOLDOWN_MAX", cap, cap >= base, "seconds >= FLEET_PROXY_COOLDOWN_BASE")
    rate = g("FLEET_PROXY_RATE")
    if isinstance(rate, str) and rate.strip().lower() in ("", "none"):
        rate = None
    ticket_ttl = g("FLEET_PROXY_TICKET_TTL")
    if ticket_ttl is None:
        ticket_ttl = float(settings.get("DOWNLOAD_TIMEOUT", 180) or 180) + 60.0
    conc = optional_int("FLEET_PROXY_CONCURRENCY", g("FLEET_PROXY_CONCURRENCY"))
    return ProxyConfig(
        proxies=proxy_urls(g("FLEET_PROXIES")),
        pool=pool,
        max_retries=number("FLEET_PROXY_MAX_RETRIES", g("FLEET_PROXY_MAX_RETRIES"), int, 0,
                            "an integer >= 0"),
        ban_statuses=frozenset(codes),
        ban_patterns=tuple(_regex("FLEET_PROXY_BAN_PATTERNS", p) for p in patterns),
        ban_headers=tuple((str(k).lower(), _regex(f"FLEET_PROXY_BAN_HEADERS[{k!r}]", v))
                          for k, v in headers.items()),
        ban_policy=policy,
        cooldown_base=base,
        cooldown_max=cap,
        dead_after=number("FLEET_PROXY_DEAD_AFTER", g("FLEET_PROXY_DEAD_AFTER"), int, 1,
                           "an integer >= 1"),
        dead_recheck=number("FLEET_PROXY_DEAD_RECHECK", g("FLEET_PROXY_DEAD_RECHECK"), float,
                             0.0, "seconds > 0", exclusive=True),
        rate=None if rate is None else number("FLEET_PROXY_RATE", rate, float, 0.0,
                                               "requests per second > 0 or None",
                                               exclusive=True),
        concurrency=conc or 0,
        session_ttl=number("FLEET_PROXY_SESSION_TTL", g("FLEET_PROXY_SESSION_TTL"), float,
                            1.0, "seconds >= 1"),
        ticket_ttl=number("FLEET_PROXY_TICKET_TTL", ticket_ttl, float, 1.0, "seconds >= 1"),
    )
