"""Checks of setting values, shared by the fleet's config (config.py) and each feature's own
config (proxies/settings.py, pipelines/mongo_config.py, ...): the bottom layer, importing
nothing of the package but the catalog and the errors.

Every check raises :class:`~scrapy_fleet.errors.FleetConfigError` naming the setting (or the
command-line option) and the value, and what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from scrapy.settings import BaseSettings

from scrapy_fleet.catalog import DEFAULTS
from scrapy_fleet.errors import FleetConfigError

T = TypeVar("T")
_CRAWL_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


def setting_value(settings: BaseSettings | Mapping[str, Any], name: str) -> Any:
    """The value of *name*, or its default when unset or None.

    Raises:
        KeyError: *name* has no row in :data:`SETTINGS` (a programming error).
    """
    default = DEFAULTS[name]
    value = settings.get(name, default)
    return default if value is None else value


def check(name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")


def number(name: str, value: Any, cast: Callable[[Any], T], minimum: float,
            expected: str, exclusive: bool = False) -> T:
    # an int setting refuses every float, integral or not: `-s NAME=4.0` (the string "4.0")
    # is refused by int(), so 4.0 in settings.py or custom_settings is refused too
    if isinstance(value, bool) or (cast is int and isinstance(value, float)):
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")
    try:
        number = cast(value)
    except (TypeError, ValueError):
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}") from None
    if not math.isfinite(number):  # type: ignore[arg-type]
        raise FleetConfigError(f"{name}={value!r} is invalid: expected a finite number, "
                               f"{expected}")
    below = number <= minimum if exclusive else number < minimum  # type: ignore[operator]
    if below:
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")
    return number


def is_fraction(value: Any) -> bool:
    try:
        return 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        return False


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "0", "true", "false", "yes",
                                                             "no", "on", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise FleetConfigError(f"{name}={value!r} is invalid: expected a boolean")


def status_codes(name: str, value: Any) -> tuple[int, ...]:
    """HTTP status codes, sorted and unique: a list or tuple of them, or a string of them
    separated by commas or spaces (``-s NAME=401,403``).

    Raises:
        FleetConfigError: *value* holds anything but integers 100-599.
    """
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    ok = isinstance(value, (list, tuple)) and all(
        not isinstance(v, bool) and str(v).isdigit() and 100 <= int(v) <= 599 for v in value)
    check(name, value, ok, "a list of HTTP status codes (100-599)")
    return tuple(sorted({int(v) for v in value}))


def bound(name: str, value: Any) -> int | None:
    """A size bound: an integer >= 1, or None for unbounded; 0 (and "0", "", "None" on the
    command line) also means unbounded, as in ``scrapy-fleet --queue-max 0`` and the bounds
    the workers store in Redis."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    found = number(name, value, int, 0, "an integer >= 0 or None (0 or None: unbounded)")
    return found or None


def optional_int(name: str, value: Any) -> int | None:
    """An integer >= 1, or None (None, "" or "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    return number(name, value, int, 1, "an integer >= 1 or None")


def validate_key_prefix(prefix: Any, name: str = "FLEET_KEY_PREFIX") -> str:
    """*prefix* of every key of the crawl (no ``{``: the hash tag is the crawl id's).

    Raises:
        FleetConfigError: naming *name* and the value.
    """
    check(name, prefix,
           isinstance(prefix, str) and bool(re.match(r"^[A-Za-z0-9_.\-:]{1,50}$", prefix)),
           "1-50 characters of letters, digits, '_.-:'")
    return str(prefix)


def validate_crawl_id(value: Any, name: str = "FLEET_CRAWL_ID") -> str:
    """A crawl id is 1-100 characters of letters, digits, ``_ . -``."""
    check(name, value, isinstance(value, str) and bool(_CRAWL_ID_RE.match(value)),
           "1-100 characters of letters, digits, '_', '.', '-'")
    return str(value)
