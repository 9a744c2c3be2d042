"""All ``FLEET_*`` settings, read once into one validated :class:`FleetConfig`.

Every component of the fleet gets its configuration from :func:`FleetConfig.from_settings`
(cached per settings object), never by reading ``settings`` itself, so that a wrong value
fails at start with an error naming the setting and the value.  docs/settings.md lists each
setting with its type, default and meaning.
"""

from __future__ import annotations

import codecs
import math
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import redis
from scrapy.settings import BaseSettings

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.redact import redact

T = TypeVar("T")
#: the frontier's pseudo-host of stored responses (stages/records.py, lua/hosts.lua)
STAGE_HOST = "~parse"

#: Import paths of the Request classes that may be rebuilt from the frontier (see codec).
DEFAULT_REQUEST_CLASSES = (
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
)

_CRAWL_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_START_MODES = ("once", "always", "never")

#: What error messages point at for the valid values: a listing every installation has
#: (docs/settings.md is only in the source tree).
SETTINGS_HELP = "`scrapy fleet settings` or `scrapy-fleet settings`"

#: Setting sections, in the order ``scrapy fleet settings`` lists them.
SECTIONS = ("connection", "identity", "frontier", "dupefilter", "bounds", "politeness",
            "sinks", "mongo", "failures", "monitoring", "proxies", "stages", "browser")


@dataclass(frozen=True)
class Setting:
    """One ``FLEET_*`` setting: its default, the type and range :meth:`FleetConfig.from_settings`
    (or ``MongoConfig``) accepts, one line of meaning, and the page documenting it."""

    name: str
    default: Any
    type: str
    meaning: str
    section: str
    #: the doc page with the full description (docs/settings.md links to it)
    doc: str = "docs/settings.md"


_BP, _POL, _MONGO = "docs/backpressure.md", "docs/politeness.md", "docs/mongo.md"
_STAGES, _BROWSER, _MON = "docs/stages.md", "docs/browser.md", "docs/monitoring.md"
_PROXY = "docs/proxies.md"

#: Every ``FLEET_*`` setting this package reads: the one source of the defaults
#: (:data:`DEFAULTS`), of ``scrapy fleet settings`` and of the unknown-setting warning.
#: A setting read without a row here is a programming error (:func:`_get` raises KeyError).
SETTINGS: tuple[Setting, ...] = (
    Setting("FLEET_REDIS_URL", "redis://127.0.0.1:6379/0",
            "redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL",
            "Redis of the fleet; the password never appears in logs", "connection"),
    Setting("FLEET_REDIS_TIMEOUT", 10.0, "float > 0",
            "socket connect and read timeout of every Redis call, seconds", "connection"),
    Setting("FLEET_REDIS_RETRIES", 3, "int >= 0",
            "retries of a frontier call after a connection error or timeout", "connection"),
    Setting("FLEET_REDIS_WAIT_REPLICAS", 0, "int >= 0",
            "after a push without a parent, WAIT until this many replicas have it",
            "connection", "docs/deployment.md"),
    Setting("FLEET_CRAWL_ID", None, "str or None (the spider's name)",
            "namespace of the crawl in Redis (1-100 of A-Za-z0-9_.-)", "identity"),
    Setting("FLEET_KEY_PREFIX", "fleet", "str",
            "first part of every key name (1-50 of A-Za-z0-9_.-:)", "identity"),
    Setting("FLEET_WORKER_ID", None, "str or None (<hostname>:<pid>:<start>)",
            "name of this worker in leases and status", "identity"),
    Setting("FLEET_LEASE_TIMEOUT", 30.0, "float >= 1",
            "seconds a leased request stays with a worker without a heartbeat", "frontier"),
    Setting("FLEET_MAX_LEASES", 3, "int >= 1",
            "lease expiries after which a request goes to the dead letters", "frontier"),
    Setting("FLEET_PREFETCH", 16, "int >= 1",
            "requests a worker keeps leased and decoded locally", "frontier"),
    Setting("FLEET_POLL_INTERVAL", 0.5, "float > 0",
            "seconds between polls of an empty frontier", "frontier"),
    Setting("FLEET_FLUSH_INTERVAL", 0.005, "float >= 0",
            "seconds the pump gathers acknowledgements and pushes into one call", "frontier"),
    Setting("FLEET_IDLE_TIMEOUT", None, "float >= 0 or None",
            "close every worker once the fleet is idle this long; None: wait forever",
            "frontier"),
    Setting("FLEET_START_REQUESTS", "once", "once, always or never",
            "who consumes the spider's start requests", "frontier"),
    Setting("FLEET_REQUEST_CLASSES", list(DEFAULT_REQUEST_CLASSES), "list of import paths",
            "Request classes that may be rebuilt from the frontier", "frontier"),
    Setting("FLEET_DUPEFILTER_CAPACITY", 1_000_000, "int >= 1",
            "fingerprints the first Bloom slice holds", "dupefilter"),
    Setting("FLEET_DUPEFILTER_ERROR_RATE", 0.001, "float in (0, 0.5]",
            "false-positive rate of the first Bloom slice", "dupefilter"),
    Setting("FLEET_QUEUE_MAX", 1_000_000, "int >= 0 or None",
            "bound on the frontier's size, fleet-wide; 0 or None: unbounded", "bounds", _BP),
    Setting("FLEET_QUEUE_LOW_WATERMARK", 0.9, "float in (0, 1)",
            "fraction of FLEET_QUEUE_MAX below which waiting producers resume", "bounds", _BP),
    Setting("FLEET_HOST_QUEUE_MAX", None, "int >= 0 or None",
            "bound on the entries of one host; 0 or None: unbounded", "bounds", _BP),
    Setting("FLEET_BACKPRESSURE_DELAY", 10.0, "float >= 0",
            "seconds a deferred request waits before it is fetched again", "bounds", _BP),
    Setting("FLEET_HOST_RATE", None, "float > 0 or None",
            "requests per second per host, fleet-wide (GCRA)", "politeness", _POL),
    Setting("FLEET_HOST_BURST", 1, "int >= 1", "GCRA burst with FLEET_HOST_RATE",
            "politeness", _POL),
    Setting("FLEET_HOST_DELAY", None, "float >= 0 (the project's DOWNLOAD_DELAY)",
            "minimum seconds between two requests to one host, fleet-wide", "politeness",
            _POL),
    Setting("FLEET_HOST_CONCURRENCY", None,
            "int >= 0 (the project's CONCURRENT_REQUESTS_PER_DOMAIN)",
            "requests in flight to one host, fleet-wide; 0: no cap", "politeness", _POL),
    Setting("FLEET_HOST_OVERRIDES", {}, "dict (JSON on the command line)",
            "per host key: {rate, burst, concurrency, delay}", "politeness", _POL),
    Setting("FLEET_HOST_KEY", "host", "host, domain or ip", "what counts as one host",
            "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_TTL", 3600.0, "float >= 1",
            "seconds a fetched robots.txt is used by the fleet", "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_HOLD", 60.0, "float >= 0",
            "seconds a host is held when its robots.txt answers 5xx/429 or fails",
            "politeness", _POL),
    Setting("FLEET_ROBOTSTXT_MAX_ATTEMPTS", 4, "int >= 0",
            "failed robots.txt fetches of an origin before its requests fail; 0: never",
            "politeness", _POL),
    Setting("FLEET_MAX_CRAWL_DELAY", 60.0, "float >= 0", "cap on a robots.txt Crawl-delay",
            "politeness", _POL),
    Setting("FLEET_BACKOFF_BASE", 1.0, "float > 0",
            "first back-off (seconds) of a failing host without Retry-After", "politeness",
            _POL),
    Setting("FLEET_BACKOFF_MAX", 300.0, "float > 0", "longest back-off (seconds)",
            "politeness", _POL),
    Setting("FLEET_JSONL_PATH", None, "str or None",
            "append one JSON line per item to this file (placeholders %(worker)s...)",
            "sinks"),
    Setting("FLEET_JSONL_FSYNC", False, "bool", "also fsync each JSON line", "sinks"),
    Setting("FLEET_MONGO_URI", None, "str or None",
            "mongodb:// URI; unset: the MongoDB pipeline is disabled", "mongo", _MONGO),
    Setting("FLEET_MONGO_DATABASE", "scrapy", "str", "database name", "mongo", _MONGO),
    Setting("FLEET_MONGO_COLLECTION", None, "str or None (the spider's name)",
            "collection name, a %-template with spider and item_class", "mongo", _MONGO),
    Setting("FLEET_MONGO_ID_FIELDS", ["url"], "list of str",
            "item fields whose values make the stable _id", "mongo", _MONGO),
    Setting("FLEET_MONGO_ID_FUNCTION", None, "callable or import path",
            "f(adapter) -> _id, instead of FLEET_MONGO_ID_FIELDS", "mongo", _MONGO),
    Setting("FLEET_MONGO_BATCH_SIZE", 100, "int, 1-100000",
            "a collection's batch is sent when it holds this many items", "mongo", _MONGO),
    Setting("FLEET_MONGO_FLUSH_INTERVAL", 1.0, "float >= 0",
            "... or when its oldest item waited this long (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_MAX_PENDING", 10_000, "int >= 1",
            "items held by the pipeline at most; more wait (back pressure)", "mongo", _MONGO),
    Setting("FLEET_MONGO_CONCURRENCY", 2, "int >= 1",
            "threads (and batches in flight) running pymongo", "mongo", _MONGO),
    Setting("FLEET_MONGO_RETRY_BACKOFF", 0.5, "float > 0",
            "first delay before retrying a failed batch (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_RETRY_MAX_BACKOFF", 30.0, "float >= FLEET_MONGO_RETRY_BACKOFF",
            "cap of that delay (seconds)", "mongo", _MONGO),
    Setting("FLEET_MONGO_UPDATED_FIELD", "updated_at", "str",
            "field set to the write time on every write", "mongo", _MONGO),
    Setting("FLEET_MONGO_FIRST_SEEN_FIELD", "first_seen_at", "str",
            "field set to the write time when the document is created", "mongo", _MONGO),
    Setting("FLEET_MONGO_TTL", None, "int >= 1 or None",
            "documents not re-written for this many seconds are deleted", "mongo", _MONGO),
    Setting("FLEET_MONGO_UNIQUE_FIELDS", [], "list of str",
            "a unique index on these fields (a secondary key)", "mongo", _MONGO),
    Setting("FLEET_MONGO_CLIENT_FACTORY", None, "callable or import path",
            "f(uri) -> client (default MongoClient(uri, appname='scrapy-fleet'))", "mongo",
            _MONGO),
    Setting("FLEET_FAILED_MAX", 10_000, "int >= 1",
            "failed requests kept for `failed` and `retry`; the oldest are trimmed past it",
            "failures", "docs/failures.md"),
    Setting("FLEET_HEARTBEAT_INTERVAL", 5.0, "float > 0",
            "a worker calls Redis at least this often (seconds), with its heartbeat",
            "monitoring", _MON),
    Setting("FLEET_WORKER_DEAD_AFTER", 15.0, "float > 0",
            "a worker silent this long (seconds) is shown dead", "monitoring", _MON),
    Setting("FLEET_WORKER_FORGET_AFTER", 120.0, "float >= FLEET_WORKER_DEAD_AFTER",
            "a worker silent this long (seconds) leaves the worker list and its keys",
            "monitoring", _MON),
    Setting("FLEET_STALL_AFTER", 120.0, "float > 0",
            "a worker holding leases with no acknowledgement this long is stalled",
            "monitoring", _MON),
    Setting("FLEET_BAN_STATUSES", [403], "list of int",
            "HTTP statuses counted as bans in the fleet-wide counters", "monitoring", _MON),
    Setting("FLEET_DRAIN_TIMEOUT", 30.0, "float >= 0",
            "seconds a SIGTERMed worker lets its requests finish before it releases them",
            "monitoring", _MON),
    Setting("FLEET_ALERT_DEPTH_MINUTES", 10, "int >= 1",
            "alert when the due depth grew for this many minutes", "monitoring", _MON),
    Setting("FLEET_ALERT_BLOCK_RATE", 0.2, "float in [0, 1]",
            "alert when a host's block rate is above this", "monitoring", _MON),
    Setting("FLEET_ALERT_BLOCK_MIN_PAGES", 20, "int >= 1",
            "... once the host has this many responses", "monitoring", _MON),
    Setting("FLEET_ALERT_MEMORY_RATIO", 0.9, "float in (0, 1]",
            "alert when Redis used_memory / maxmemory is above this", "monitoring", _MON),
    Setting("FLEET_PROXIES", None, "list of proxy URLs, a file path, or None",
            "exits added to the crawl's proxy pool when a worker starts; enables the pool",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_POOL", None, "str or None (the crawl id)",
            "name of a proxy pool shared by crawls", "proxies", _PROXY),
    Setting("FLEET_PROXY_MAX_RETRIES", 3, "int >= 0",
            "retries through other exits after a ban; then ProxyBanError", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_STATUSES", [403], "list of int", "statuses that are a ban",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_PATTERNS", [], "list of regex",
            "a body matching one is a ban (challenge pages)", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_HEADERS", {}, "dict header -> regex",
            "a matching header value is a ban", "proxies", _PROXY),
    Setting("FLEET_PROXY_BAN_POLICY", "scrapy_fleet.proxies.verdicts.BanPolicy", "import path",
            "class asked first for each verdict; may answer None", "proxies", _PROXY),
    Setting("FLEET_PROXY_COOLDOWN_BASE", 30.0, "float > 0",
            "cool-down (seconds) of an (exit, site) after a ban, doubled per ban, jittered",
            "proxies", _PROXY),
    Setting("FLEET_PROXY_COOLDOWN_MAX", 1800.0, "float >= FLEET_PROXY_COOLDOWN_BASE",
            "cap of that cool-down (seconds)", "proxies", _PROXY),
    Setting("FLEET_PROXY_DEAD_AFTER", 3, "int >= 1",
            "proxy_dead verdicts in a row that mark an exit dead fleet-wide", "proxies", _PROXY),
    Setting("FLEET_PROXY_DEAD_RECHECK", 120.0, "float > 0",
            "seconds before a dead exit gets one re-check request", "proxies", _PROXY),
    Setting("FLEET_PROXY_RATE", None, "float > 0 or None",
            "requests per second per exit, fleet-wide (GCRA)", "proxies", _PROXY),
    Setting("FLEET_PROXY_CONCURRENCY", None, "int >= 1 or None",
            "requests in flight per exit, fleet-wide", "proxies", _PROXY),
    Setting("FLEET_PROXY_SESSION_TTL", 600.0, "float >= 1",
            "life (seconds) of a sticky session's binding, renewed on use", "proxies", _PROXY),
    Setting("FLEET_PROXY_TICKET_TTL", None, "float >= 1 or None (DOWNLOAD_TIMEOUT + 60)",
            "seconds an unreported choice holds its exit's in-flight slot", "proxies", _PROXY),
    Setting("FLEET_ROLE", "all", "all, fetch or parse",
            "fetch: store responses for parse workers; parse: parse stored responses",
            "stages", _STAGES),
    Setting("FLEET_RESPONSE_QUEUE_MAX", 1000, "int >= 1",
            "stored responses above which fetch workers lease no more", "stages", _STAGES),
    Setting("FLEET_RESPONSE_QUEUE_BYTES", 256 * 1024 * 1024, "int >= 1",
            "bytes of stored responses above which fetch workers lease no more", "stages",
            _STAGES),
    Setting("FLEET_MAX_STORED_RESPONSE", 8 * 1024 * 1024, "int >= 1",
            "largest stored response (bytes, compressed)", "stages", _STAGES),
    Setting("FLEET_LARGE_RESPONSE", "parse", "parse or fail",
            "a bigger one: parsed by the fetch worker, or failed", "stages", _STAGES),
    Setting("FLEET_PLAYWRIGHT", False, "bool",
            "install scrapy-playwright's download handlers and the asyncio reactor",
            "browser", _BROWSER),
    Setting("FLEET_PLAYWRIGHT_ABORT", ["image", "media", "font"], "list of resource types",
            "browser sub-requests not loaded (they bypass the fleet's politeness)", "browser",
            _BROWSER),
)

#: name -> default of every setting (from :data:`SETTINGS`)
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
assert len(DEFAULTS) == len(SETTINGS), "a setting is listed twice"


def unknown_settings(names: Any) -> list[tuple[str, str | None]]:
    """``(name, closest known setting or None)`` for each ``FLEET_*`` name among *names*
    (a settings object or any iterable of names) that no row of :data:`SETTINGS` knows: a
    typo (one letter too many, say) would otherwise be ignored silently.  The closest name
    is :func:`difflib.get_close_matches`' best (ratio >= 0.6)."""
    import difflib

    out = []
    for name in sorted({str(n) for n in names}):
        if name.startswith("FLEET_") and name not in DEFAULTS:
            close = difflib.get_close_matches(name, DEFAULTS, n=1)
            out.append((name, close[0] if close else None))
    return out


def format_default(value: Any) -> str:
    """*value* as one would write it in settings.py (``None``, ``10.0``, ``"once"``...)."""
    return repr(value).replace("'", '"')


def settings_listing() -> str:
    """Plain-text table of every setting (``scrapy fleet settings``): name, type, default and
    one line of meaning, by section, from :data:`SETTINGS`."""
    width = max(len(s.name) for s in SETTINGS)
    lines = []
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        if not rows:
            continue
        lines.append(f"{section} (details: {rows[0].doc})")
        for s in rows:
            lines.append(f"  {s.name:<{width}}  {s.type}; default {format_default(s.default)}")
            lines.append(f"  {'':<{width}}  {s.meaning}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _stages(g: Callable[[str], Any]) -> dict[str, Any]:
    """FLEET_ROLE and the bounds of the response queue (stages/roles.py)."""
    role = g("FLEET_ROLE")
    _check("FLEET_ROLE", role, role in ("all", "fetch", "parse"), '"all", "fetch" or "parse"')
    large = g("FLEET_LARGE_RESPONSE")
    _check("FLEET_LARGE_RESPONSE", large, large in ("parse", "fail"), '"parse" or "fail"')
    out: dict[str, Any] = {"role": role, "large_response": large}
    for name, attr in (("FLEET_RESPONSE_QUEUE_MAX", "response_queue_max"),
                       ("FLEET_RESPONSE_QUEUE_BYTES", "response_queue_bytes"),
                       ("FLEET_MAX_STORED_RESPONSE", "max_stored_response")):
        out[attr] = _number(name, g(name), int, 1, "an integer >= 1")
    return out


def _browser(g: Callable[[str], Any]) -> dict[str, Any]:
    """FLEET_PLAYWRIGHT and FLEET_PLAYWRIGHT_ABORT (browser/handler.py)."""
    from scrapy_fleet.browser.handler import RESOURCE_TYPES

    enabled = _bool("FLEET_PLAYWRIGHT", g("FLEET_PLAYWRIGHT"))
    abort = g("FLEET_PLAYWRIGHT_ABORT")
    if isinstance(abort, str):
        abort = [part.strip() for part in abort.split(",") if part.strip()]
    _check("FLEET_PLAYWRIGHT_ABORT", abort,
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
    return {"playwright": enabled, "playwright_abort": tuple(abort)}


def _get(settings: BaseSettings | Mapping[str, Any], name: str) -> Any:
    """The value of *name*, or its default when unset or None.

    Raises:
        KeyError: *name* has no row in :data:`SETTINGS` (a programming error).
    """
    default = DEFAULTS[name]
    value = settings.get(name, default)
    return default if value is None else value


def _check(name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")


def _number(name: str, value: Any, cast: Callable[[Any], T], minimum: float,
            expected: str, exclusive: bool = False) -> T:
    if isinstance(value, bool):
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")
    try:
        number = cast(value)
    except (TypeError, ValueError):
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}") from None
    if cast is int and isinstance(value, float) and not float(value).is_integer():
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")
    if not math.isfinite(number):  # type: ignore[arg-type]
        raise FleetConfigError(f"{name}={value!r} is invalid: expected a finite number, "
                               f"{expected}")
    below = number <= minimum if exclusive else number < minimum  # type: ignore[operator]
    if below:
        raise FleetConfigError(f"{name}={value!r} is invalid: expected {expected}")
    return number


def _is_fraction(value: Any) -> bool:
    try:
        return 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        return False


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "0", "true", "false", "yes",
                                                             "no", "on", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise FleetConfigError(f"{name}={value!r} is invalid: expected a boolean")


def _bound(name: str, value: Any) -> int | None:
    """A size bound: an integer >= 1, or None for unbounded; 0 (and "0", "", "None" on the
    command line) also means unbounded, as in ``scrapy-fleet --queue-max 0`` and the bounds
    the workers store in Redis."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    number = _number(name, value, int, 0, "an integer >= 0 or None (0 or None: unbounded)")
    return number or None


def _optional_int(name: str, value: Any) -> int | None:
    """An integer >= 1, or None (None, "" or "none")."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    return _number(name, value, int, 1, "an integer >= 1 or None")


def _host_overrides(value: Any) -> dict[str, tuple[float | None, int | None, int | None, bool]]:
    """``{"example.com": {"rate": 0.5, "burst": 2, "concurrency": 1, "delay": 3}}`` ->
    host -> (interval seconds or None, burst or None, concurrency or None, interval from a
    rate?)."""
    name = "FLEET_HOST_OVERRIDES"
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise FleetConfigError(f"{name}={value!r} is invalid: expected a dict "
                                   "(JSON on the command line)") from None
    _check(name, value, isinstance(value, dict), "a dict of host -> {rate, burst, "
           "concurrency, delay}")
    out: dict[str, tuple[float | None, int | None, int | None, bool]] = {}
    for host, spec in value.items():
        where = f"{name}[{host!r}]"
        _check(where, spec, isinstance(host, str) and isinstance(spec, dict)
               and set(spec) <= {"rate", "burst", "concurrency", "delay"},
               "a dict with keys among rate, burst, concurrency, delay")
        interval = None
        is_rate = False
        if spec.get("rate") is not None:
            interval = 1.0 / _number(f"{where}['rate']", spec["rate"], float, 0.0,
                                     "requests per second > 0", exclusive=True)
            is_rate = True
        if spec.get("delay") is not None:
            d = _number(f"{where}['delay']", spec["delay"], float, 0.0, "seconds >= 0")
            if d >= (interval or 0.0):
                interval, is_rate = d, False
        burst = None if spec.get("burst") is None else _number(
            f"{where}['burst']", spec["burst"], int, 1, "an integer >= 1")
        conc = None if spec.get("concurrency") is None else _number(
            f"{where}['concurrency']", spec["concurrency"], int, 0, "an integer >= 0")
        out[host.lower()] = (interval, burst, conc, is_rate)
    return out


#: redis-py URL options that change what the client returns: the fleet reads every reply as
#: bytes (msgpack from its scripts, raw payloads) and builds key names as UTF-8, so these
#: would make every frontier call fail (decode_responses: UnicodeDecodeError, also with
#: "False", which redis-py takes as a true string) or silently name other keys (encoding).
_REPLY_OPTIONS = {
    "decode_responses": "the fleet reads Redis replies as bytes; remove it from the URL",
    "encoding": "key names and arguments are sent as UTF-8; remove it from the URL",
}


def _check_url_options(url: str, name: str) -> None:
    """Refuse the URL options that break the fleet's replies, and those redis-py does not
    know (which would fail at the first command with a TypeError)."""
    for option, values in parse_qs(urlsplit(url).query).items():
        why = _REPLY_OPTIONS.get(option)
        if option == "encoding" and values and _is_utf8(values[0]):
            continue
        if why:
            raise FleetConfigError(f"{name}={redact(url)!r} is invalid: the URL option "
                                   f"{option!r} is not supported ({why})")
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        return  # Cluster and Sentinel URLs: redis_url.parse checked their options
    try:
        pool = redis.ConnectionPool.from_url(url)
        pool.make_connection()  # builds the connection object only: no I/O
    except (TypeError, ValueError, redis.RedisError) as exc:  # RedisError: "protocol must be..."
        found = re.search(r"argument '(\w+)'|for '(\w+)'", str(exc))
        named = next((g for g in found.groups() if g), None) if found else None
        what = f"the URL option {named!r} is unknown or has a bad value" if named else str(exc)
        raise FleetConfigError(f"{name}={redact(url)!r} is invalid: {what} (redis-py "
                               "connection options only)") from None


def _is_utf8(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def validate_redis_url(url: Any, name: str = "FLEET_REDIS_URL") -> str:
    """Return *url* if it names a Redis deployment (scrapy_fleet/redis_url.py lists the
    schemes: one server, Cluster, Sentinel, each with or without TLS) with valid options.

    Raises:
        FleetConfigError: naming *name*, the URL (password redacted) and what is wrong.
    """
    from scrapy_fleet import redis_url

    redis_url.parse(url, name)
    _check_url_options(url, name)
    return str(url)


#: values of FLEET_HOST_KEY (politeness.host_key)
HOST_KEY_MODES = ("host", "domain", "ip")


def validate_key_prefix(prefix: Any, name: str = "FLEET_KEY_PREFIX") -> str:
    """*prefix* of every key of the crawl (no ``{``: the hash tag is the crawl id's).

    Raises:
        FleetConfigError: naming *name* and the value.
    """
    _check(name, prefix,
           isinstance(prefix, str) and bool(re.match(r"^[A-Za-z0-9_.\-:]{1,50}$", prefix)),
           "1-50 characters of letters, digits, '_.-:'")
    return str(prefix)


def validate_crawl_id(value: Any, name: str = "FLEET_CRAWL_ID") -> str:
    """A crawl id is 1-100 characters of letters, digits, ``_ . -``."""
    _check(name, value, isinstance(value, str) and bool(_CRAWL_ID_RE.match(value)),
           "1-100 characters of letters, digits, '_', '.', '-'")
    return str(value)


def default_worker_id() -> str:
    """``host:pid:start``: unique per process (a recycled pid has another start time, unix
    seconds), readable in ``scrapy fleet status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{int(_PROCESS_START)}"


_PROCESS_START = time.time()


def _ban_statuses(value: Any) -> tuple[int, ...]:
    name = "FLEET_BAN_STATUSES"
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    ok = isinstance(value, (list, tuple)) and all(
        not isinstance(v, bool) and str(v).isdigit() and 100 <= int(v) <= 599 for v in value)
    _check(name, value, ok, "a list of HTTP status codes (100-599)")
    return tuple(sorted({int(v) for v in value}))


#: schemes of proxy URLs Scrapy's HTTP download handler can use
PROXY_SCHEMES = ("http", "https")


def _proxy_urls(value: Any) -> tuple[str, ...]:
    """``FLEET_PROXIES``: a list of URLs, or a string: the path of a file (one URL a line,
    ``#`` comments) or URLs separated by commas or white space.  Errors never show a
    password."""
    from scrapy_fleet.redact import redact

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
    _check(name, pattern, isinstance(pattern, (str, bytes)), "a regular expression")
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
    g = lambda name: _get(settings, name)  # noqa: E731
    pool = g("FLEET_PROXY_POOL")
    if isinstance(pool, str) and pool.strip().lower() in ("", "none"):
        pool = None
    if pool is not None:
        validate_crawl_id(pool, "FLEET_PROXY_POOL")
    statuses = _json_or("FLEET_PROXY_BAN_STATUSES", g("FLEET_PROXY_BAN_STATUSES"))
    if isinstance(statuses, str):
        statuses = [s for s in re.split(r"[\s,]+", statuses) if s]
    _check("FLEET_PROXY_BAN_STATUSES", statuses, isinstance(statuses, (list, tuple, set)),
           "a list of HTTP status codes")
    codes = {_number("FLEET_PROXY_BAN_STATUSES", s, int, 100, "HTTP status codes 100-599")
             for s in statuses}
    _check("FLEET_PROXY_BAN_STATUSES", statuses,
           all(c < 600 for c in codes) and not codes & {404, 410, 429, 407},
           "HTTP status codes 100-599, not 404/410 (never a ban), 429 (rate_limited) or 407 "
           "(proxy_dead)")
    patterns = _json_or("FLEET_PROXY_BAN_PATTERNS", g("FLEET_PROXY_BAN_PATTERNS"))
    if isinstance(patterns, (str, bytes)):
        patterns = [patterns]
    _check("FLEET_PROXY_BAN_PATTERNS", patterns, isinstance(patterns, (list, tuple)),
           "a list of regular expressions")
    headers = _json_or("FLEET_PROXY_BAN_HEADERS", g("FLEET_PROXY_BAN_HEADERS"))
    _check("FLEET_PROXY_BAN_HEADERS", headers, isinstance(headers, Mapping),
           "a dict of header name -> regular expression")
    policy = g("FLEET_PROXY_BAN_POLICY")
    _check("FLEET_PROXY_BAN_POLICY", policy, isinstance(policy, str) and bool(policy),
           "the import path of a ban policy class")
    try:
        from scrapy.utils.misc import load_object

        policy_cls = load_object(policy)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise FleetConfigError(f"FLEET_PROXY_BAN_POLICY={policy!r} is invalid: {exc}") from None
    _check("FLEET_PROXY_BAN_POLICY", policy, isinstance(policy_cls, type)
           and callable(getattr(policy_cls, "response_verdict", None)),
           "a class with response_verdict(request, response, site)")
    base = _number("FLEET_PROXY_COOLDOWN_BASE", g("FLEET_PROXY_COOLDOWN_BASE"), float, 0.0,
                   "seconds > 0", exclusive=True)
    cap = _number("FLEET_PROXY_COOLDOWN_MAX", g("FLEET_PROXY_COOLDOWN_MAX"), float, 0.0,
                  "seconds > 0", exclusive=True)
    _check("FLEET_PROXY_COOLDOWN_MAX", cap, cap >= base, "seconds >= FLEET_PROXY_COOLDOWN_BASE")
    rate = g("FLEET_PROXY_RATE")
    if isinstance(rate, str) and rate.strip().lower() in ("", "none"):
        rate = None
    ticket_ttl = g("FLEET_PROXY_TICKET_TTL")
    if ticket_ttl is None:
        ticket_ttl = float(settings.get("DOWNLOAD_TIMEOUT", 180) or 180) + 60.0
    conc = _optional_int("FLEET_PROXY_CONCURRENCY", g("FLEET_PROXY_CONCURRENCY"))
    return ProxyConfig(
        proxies=_proxy_urls(g("FLEET_PROXIES")),
        pool=pool,
        max_retries=_number("FLEET_PROXY_MAX_RETRIES", g("FLEET_PROXY_MAX_RETRIES"), int, 0,
                            "an integer >= 0"),
        ban_statuses=frozenset(codes),
        ban_patterns=tuple(_regex("FLEET_PROXY_BAN_PATTERNS", p) for p in patterns),
        ban_headers=tuple((str(k).lower(), _regex(f"FLEET_PROXY_BAN_HEADERS[{k!r}]", v))
                          for k, v in headers.items()),
        ban_policy=policy,
        cooldown_base=base,
        cooldown_max=cap,
        dead_after=_number("FLEET_PROXY_DEAD_AFTER", g("FLEET_PROXY_DEAD_AFTER"), int, 1,
                           "an integer >= 1"),
        dead_recheck=_number("FLEET_PROXY_DEAD_RECHECK", g("FLEET_PROXY_DEAD_RECHECK"), float,
                             0.0, "seconds > 0", exclusive=True),
        rate=None if rate is None else _number("FLEET_PROXY_RATE", rate, float, 0.0,
                                               "requests per second > 0 or None",
                                               exclusive=True),
        concurrency=conc or 0,
        session_ttl=_number("FLEET_PROXY_SESSION_TTL", g("FLEET_PROXY_SESSION_TTL"), float,
                            1.0, "seconds >= 1"),
        ticket_ttl=_number("FLEET_PROXY_TICKET_TTL", ticket_ttl, float, 1.0, "seconds >= 1"),
    )


@dataclass(frozen=True)
class FleetConfig:
    """Validated fleet settings.  Times are seconds; see docs/settings.md.

    Raises:
        FleetConfigError: from :meth:`from_settings` when a value is wrong; the message names
            the setting and the value.
    """

    redis_url: str
    redis_timeout: float
    redis_retries: int
    redis_wait_replicas: int
    crawl_id: str | None
    key_prefix: str
    worker_id: str
    lease_timeout: float
    max_leases: int
    prefetch: int
    poll_interval: float
    flush_interval: float
    idle_timeout: float | None
    start_requests: str
    request_classes: tuple[str, ...]
    dupefilter_capacity: int
    dupefilter_error_rate: float
    queue_max: int | None
    queue_low_watermark: float
    host_queue_max: int | None
    backpressure_delay: float
    host_rate: float | None
    host_burst: int
    host_delay: float
    host_concurrency: int
    host_overrides: dict[str, tuple[float | None, int | None, int | None, bool]]
    host_key: str
    robots_obey: bool
    robotstxt_ttl: float
    robotstxt_hold: float
    robotstxt_max_attempts: int
    max_crawl_delay: float
    backoff_base: float
    backoff_max: float
    jsonl_path: str | None
    jsonl_fsync: bool
    role: str = "all"
    response_queue_max: int = 1000
    response_queue_bytes: int = 256 * 1024 * 1024
    max_stored_response: int = 8 * 1024 * 1024
    large_response: str = "parse"
    playwright: bool = False
    playwright_abort: tuple[str, ...] = ("image", "media", "font")
    heartbeat_interval: float = 5.0
    worker_dead_after: float = 15.0
    worker_forget_after: float = 120.0
    stall_after: float = 120.0
    ban_statuses: tuple[int, ...] = (403,)
    drain_timeout: float = 30.0
    alert_depth_minutes: int = 10
    alert_block_rate: float = 0.2
    alert_block_min_pages: int = 20
    alert_memory_ratio: float = 0.9
    proxy: ProxyConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    failed_max: int = 10_000  #: FLEET_FAILED_MAX (docs/failures.md)

    @classmethod
    def from_settings(cls, settings: BaseSettings | Mapping[str, Any]) -> FleetConfig:
        """Read and validate every ``FLEET_*`` setting of the fleet core.

        Raises:
            FleetConfigError: naming the first wrong setting and its value.
        """
        if isinstance(settings, BaseSettings):
            cached = getattr(settings, "_fleet_config", None)
            frozen = getattr(settings, "frozen", False)
            if cached is not None and frozen:
                return cached  # type: ignore[no-any-return]
        g = lambda name: _get(settings, name)  # noqa: E731
        crawl_id = g("FLEET_CRAWL_ID")
        if crawl_id is not None:
            validate_crawl_id(crawl_id)
        prefix = validate_key_prefix(g("FLEET_KEY_PREFIX"))
        worker_id = g("FLEET_WORKER_ID") or default_worker_id()
        _check("FLEET_WORKER_ID", worker_id, isinstance(worker_id, str) and len(worker_id) <= 200,
               "a string of at most 200 characters")
        idle = g("FLEET_IDLE_TIMEOUT")
        if isinstance(idle, str) and idle.strip().lower() in ("", "none", "null"):
            idle = None
        start_mode = g("FLEET_START_REQUESTS")
        _check("FLEET_START_REQUESTS", start_mode, start_mode in _START_MODES,
               f"one of {', '.join(_START_MODES)}")
        classes = g("FLEET_REQUEST_CLASSES")
        if isinstance(classes, str):
            classes = [c.strip() for c in classes.split(",") if c.strip()]
        _check("FLEET_REQUEST_CLASSES", classes,
               isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes),
               "a list of import paths")
        error_rate = _number("FLEET_DUPEFILTER_ERROR_RATE", g("FLEET_DUPEFILTER_ERROR_RATE"),
                             float, 0.0, "a probability between 0 and 0.5", exclusive=True)
        _check("FLEET_DUPEFILTER_ERROR_RATE", error_rate, error_rate <= 0.5,
               "a probability between 0 and 0.5")
        low = _number("FLEET_QUEUE_LOW_WATERMARK", g("FLEET_QUEUE_LOW_WATERMARK"), float, 0.0,
                      "a fraction of FLEET_QUEUE_MAX between 0 and 1", exclusive=True)
        _check("FLEET_QUEUE_LOW_WATERMARK", low, low < 1.0,
               "a fraction of FLEET_QUEUE_MAX between 0 and 1")
        capacity = _number("FLEET_DUPEFILTER_CAPACITY", g("FLEET_DUPEFILTER_CAPACITY"), int, 1,
                           "an integer >= 1")
        from scrapy_fleet.frontier.bloom import MAX_SLICE_BITS, slice_params

        _check("FLEET_DUPEFILTER_CAPACITY", capacity,
               slice_params(capacity, error_rate, 0).bits <= MAX_SLICE_BITS,
               "a capacity whose first Bloom slice fits in one Redis string (512 MB)")
        host_key = g("FLEET_HOST_KEY")
        _check("FLEET_HOST_KEY", host_key, host_key in HOST_KEY_MODES,
               "one of host, domain, ip")
        rate = g("FLEET_HOST_RATE")
        if isinstance(rate, str) and rate.strip().lower() in ("", "none"):
            rate = None
        if rate is not None:
            rate = _number("FLEET_HOST_RATE", rate, float, 0.0,
                           "requests per second > 0 or None", exclusive=True)
        delay = g("FLEET_HOST_DELAY")
        if delay is None:  # the add-on moves the project's DOWNLOAD_DELAY here
            delay = settings.get("DOWNLOAD_DELAY", 0) if hasattr(settings, "get") else 0
        concurrency = g("FLEET_HOST_CONCURRENCY")
        if concurrency is None:
            concurrency = settings.get("CONCURRENT_REQUESTS_PER_DOMAIN", 8)
        overrides = _host_overrides(g("FLEET_HOST_OVERRIDES"))
        jsonl = g("FLEET_JSONL_PATH")
        _check("FLEET_JSONL_PATH", jsonl, jsonl is None or (isinstance(jsonl, str) and jsonl != ""),
               "a file path or None")
        if jsonl is not None:
            try:
                jsonl % {"worker": "w", "pid": 1, "spider": "s", "crawl_id": "c"}
            except (KeyError, ValueError, TypeError) as exc:
                raise FleetConfigError(
                    f"FLEET_JSONL_PATH={jsonl!r} is invalid: placeholders may be %(worker)s, "
                    f"%(pid)s, %(spider)s, %(crawl_id)s; write %% for a % ({exc!r})") from None
        classes_ok = True
        for path in classes:
            try:
                from scrapy import Request
                from scrapy.utils.misc import load_object

                loaded = load_object(path)
                classes_ok = classes_ok and isinstance(loaded, type) and issubclass(loaded,
                                                                                   Request)
            except (ImportError, NameError, ValueError, AttributeError):
                classes_ok = False
        _check("FLEET_REQUEST_CLASSES", classes, classes_ok,
               "import paths of scrapy.Request subclasses")
        dead_after = _number("FLEET_WORKER_DEAD_AFTER", g("FLEET_WORKER_DEAD_AFTER"), float, 0.0,
                             "seconds > 0", exclusive=True)
        forget_after = _number("FLEET_WORKER_FORGET_AFTER", g("FLEET_WORKER_FORGET_AFTER"),
                               float, 0.0, "seconds > 0", exclusive=True)
        _check("FLEET_WORKER_FORGET_AFTER", g("FLEET_WORKER_FORGET_AFTER"),
               forget_after >= dead_after,
               "seconds >= FLEET_WORKER_DEAD_AFTER (a dead worker is shown until forgotten)")
        heartbeat = _number("FLEET_HEARTBEAT_INTERVAL", g("FLEET_HEARTBEAT_INTERVAL"), float,
                            0.0, "seconds > 0", exclusive=True)
        _check("FLEET_HEARTBEAT_INTERVAL", g("FLEET_HEARTBEAT_INTERVAL"), heartbeat < dead_after,
               f"seconds < FLEET_WORKER_DEAD_AFTER={dead_after!r} (else a live worker is "
               "shown dead between two heartbeats)")
        for name in ("FLEET_ALERT_BLOCK_RATE", "FLEET_ALERT_MEMORY_RATIO"):
            value = g(name)
            _check(name, value, not isinstance(value, bool) and isinstance(value, (int, float, str))
                   and _is_fraction(value), "a fraction between 0 and 1")
        config = cls(
            redis_url=validate_redis_url(g("FLEET_REDIS_URL")),
            redis_timeout=_number("FLEET_REDIS_TIMEOUT", g("FLEET_REDIS_TIMEOUT"), float, 0.0,
                                  "seconds > 0", exclusive=True),
            redis_retries=_number("FLEET_REDIS_RETRIES", g("FLEET_REDIS_RETRIES"), int, 0,
                                  "an integer >= 0"),
            redis_wait_replicas=_number("FLEET_REDIS_WAIT_REPLICAS",
                                        g("FLEET_REDIS_WAIT_REPLICAS"), int, 0,
                                        "an integer >= 0"),
            crawl_id=crawl_id,
            key_prefix=prefix,
            worker_id=worker_id,
            lease_timeout=_number("FLEET_LEASE_TIMEOUT", g("FLEET_LEASE_TIMEOUT"), float, 1.0,
                                  "seconds >= 1"),
            max_leases=_number("FLEET_MAX_LEASES", g("FLEET_MAX_LEASES"), int, 1,
                               "an integer >= 1"),
            prefetch=_number("FLEET_PREFETCH", g("FLEET_PREFETCH"), int, 1, "an integer >= 1"),
            poll_interval=_number("FLEET_POLL_INTERVAL", g("FLEET_POLL_INTERVAL"), float, 0.0,
                                  "seconds > 0", exclusive=True),
            flush_interval=_number("FLEET_FLUSH_INTERVAL", g("FLEET_FLUSH_INTERVAL"), float, 0.0,
                                   "seconds >= 0"),
            idle_timeout=None if idle is None else _number(
                "FLEET_IDLE_TIMEOUT", idle, float, 0.0, "seconds >= 0 or None"),
            start_requests=start_mode,
            request_classes=tuple(classes),
            dupefilter_capacity=capacity,
            dupefilter_error_rate=error_rate,
            queue_max=_bound("FLEET_QUEUE_MAX", g("FLEET_QUEUE_MAX")),
            queue_low_watermark=low,
            host_queue_max=_bound("FLEET_HOST_QUEUE_MAX", g("FLEET_HOST_QUEUE_MAX")),
            backpressure_delay=_number("FLEET_BACKPRESSURE_DELAY",
                                       g("FLEET_BACKPRESSURE_DELAY"), float, 0.0,
                                       "seconds >= 0"),
            host_rate=rate,
            host_burst=_number("FLEET_HOST_BURST", g("FLEET_HOST_BURST"), int, 1,
                               "an integer >= 1"),
            host_delay=_number("FLEET_HOST_DELAY", delay, float, 0.0, "seconds >= 0"),
            host_concurrency=_number("FLEET_HOST_CONCURRENCY", concurrency, int, 0,
                                     "an integer >= 0 (0: no cap)"),
            host_overrides=overrides,
            host_key=host_key,
            robots_obey=_bool("ROBOTSTXT_OBEY", settings.get("ROBOTSTXT_OBEY", False) or False),
            robotstxt_ttl=_number("FLEET_ROBOTSTXT_TTL", g("FLEET_ROBOTSTXT_TTL"), float, 1.0,
                                  "seconds >= 1"),
            robotstxt_hold=_number("FLEET_ROBOTSTXT_HOLD", g("FLEET_ROBOTSTXT_HOLD"), float,
                                   0.0, "seconds >= 0"),
            robotstxt_max_attempts=_number("FLEET_ROBOTSTXT_MAX_ATTEMPTS",
                                           g("FLEET_ROBOTSTXT_MAX_ATTEMPTS"), int, 0,
                                           "an integer >= 0 (0: no limit)"),
            max_crawl_delay=_number("FLEET_MAX_CRAWL_DELAY", g("FLEET_MAX_CRAWL_DELAY"), float,
                                    0.0, "seconds >= 0"),
            backoff_base=_number("FLEET_BACKOFF_BASE", g("FLEET_BACKOFF_BASE"), float, 0.0,
                                 "seconds > 0", exclusive=True),
            backoff_max=_number("FLEET_BACKOFF_MAX", g("FLEET_BACKOFF_MAX"), float, 0.0,
                                "seconds > 0", exclusive=True),
            jsonl_path=jsonl,
            jsonl_fsync=_bool("FLEET_JSONL_FSYNC", g("FLEET_JSONL_FSYNC")),
            failed_max=_number("FLEET_FAILED_MAX", g("FLEET_FAILED_MAX"), int, 1,
                               "an integer >= 1"),
            heartbeat_interval=heartbeat,
            worker_dead_after=dead_after,
            worker_forget_after=forget_after,
            stall_after=_number("FLEET_STALL_AFTER", g("FLEET_STALL_AFTER"), float, 0.0,
                                "seconds > 0", exclusive=True),
            ban_statuses=_ban_statuses(g("FLEET_BAN_STATUSES")),
            drain_timeout=_number("FLEET_DRAIN_TIMEOUT", g("FLEET_DRAIN_TIMEOUT"), float, 0.0,
                                  "seconds >= 0"),
            alert_depth_minutes=_number("FLEET_ALERT_DEPTH_MINUTES",
                                        g("FLEET_ALERT_DEPTH_MINUTES"), int, 1,
                                        "an integer >= 1 (minutes)"),
            alert_block_rate=_number("FLEET_ALERT_BLOCK_RATE", g("FLEET_ALERT_BLOCK_RATE"),
                                     float, 0.0, "a fraction between 0 and 1"),
            alert_block_min_pages=_number("FLEET_ALERT_BLOCK_MIN_PAGES",
                                          g("FLEET_ALERT_BLOCK_MIN_PAGES"), int, 1,
                                          "an integer >= 1"),
            alert_memory_ratio=_number("FLEET_ALERT_MEMORY_RATIO", g("FLEET_ALERT_MEMORY_RATIO"),
                                       float, 0.0, "a fraction between 0 and 1",
                                       exclusive=True),
            proxy=proxy_config(settings),
            **_browser(g),
            **_stages(g),
        )
        if isinstance(settings, BaseSettings) and getattr(settings, "frozen", False):
            try:
                settings._fleet_config = config  # type: ignore[attr-defined]
            except AttributeError:
                pass
        return config

    def frontier_params(self) -> Any:
        """The per-call constants of lua/frontier.lua (a ``frontier.FrontierParams``)."""
        from scrapy_fleet.frontier.client import FrontierParams

        return FrontierParams(self.lease_timeout, self.max_leases, self.dupefilter_capacity,
                              self.dupefilter_error_rate, self.queue_max, self.host_queue_max,
                              self.backpressure_delay, self.host_interval,
                              self.host_burst if self.host_rate else 1, self.host_concurrency,
                              self.robots_obey,
                              self.host_rate is not None
                              and 1.0 / self.host_rate > self.host_delay,
                              lease_only_host=STAGE_HOST if self.role == "parse" else "",
                              lease_except_host=STAGE_HOST if self.role == "fetch" else "",
                              failed_max=self.failed_max)

    @property
    def host_interval(self) -> float:
        """Seconds between two requests to one host, fleet-wide: the longer of
        FLEET_HOST_DELAY (the project's DOWNLOAD_DELAY by default) and 1 / FLEET_HOST_RATE."""
        return max(self.host_delay, 1.0 / self.host_rate if self.host_rate else 0.0)

    @property
    def queue_low(self) -> int | None:
        """Size under which paused producers resume (FLEET_QUEUE_LOW_WATERMARK of the max,
        at least 1: an empty frontier always lets them go on)."""
        if self.queue_max is None:
            return None
        return max(int(self.queue_max * self.queue_low_watermark), 1)

    def resolve_crawl_id(self, spider_name: str) -> str:
        """The crawl's namespace: ``FLEET_CRAWL_ID`` or else the spider's name."""
        return validate_crawl_id(self.crawl_id or spider_name,
                                 "FLEET_CRAWL_ID" if self.crawl_id else "spider name")
