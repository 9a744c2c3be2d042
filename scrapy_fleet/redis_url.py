"""``FLEET_REDIS_URL``: which Redis deployment a URL names, and its connection options.

Schemes (docs/deployment.md gives a recipe for each)::

    redis://[USER:PASSWORD@]HOST[:PORT][/DB][?OPTIONS]          one server
    rediss://...                                                 one server over TLS
    unix://[USER:PASSWORD@]/PATH/TO/SOCKET[?db=DB]               one server, Unix socket
    redis+cluster://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][?OPTIONS]
                                                                 Redis Cluster: any nodes
                                                                 (list several: a client
                                                                 made while one is down
                                                                 starts from another)
    rediss+cluster://...                                         Redis Cluster over TLS
    redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]
    rediss+sentinel://...                                        Sentinel, TLS to every node

OPTIONS are redis-py's URL options (``socket_timeout``, ...) and the TLS ones:
``ssl_ca_certs`` (PEM file of the CA that signed the server's certificate; default: the
system's CAs), ``ssl_certfile`` and ``ssl_keyfile`` (client certificate, for servers with
``tls-auth-clients yes``), ``ssl_cert_reqs`` (``required``, the default; ``none`` turns
verification off and is reported by a warning at start), ``ssl_check_hostname``.  Sentinel
URLs also take ``sentinel_username`` and ``sentinel_password`` (the sentinels' own ACL user;
the user in the URL is the data nodes' one).  A TLS option on a URL without TLS, an unknown
``ssl_cert_reqs`` or a file that cannot be read is one :class:`FleetConfigError` at start.
"""

from __future__ import annotations

import codecs
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import redis

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.redact import redact, userinfo

#: scheme -> (kind, TLS?)
SCHEMES: dict[str, tuple[str, bool]] = {
    "redis": ("standalone", False),
    "rediss": ("standalone", True),
    "unix": ("standalone", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
EXPECTED = ("a redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
            "redis+sentinel:// or rediss+sentinel:// URL")
#: URL options naming files read at connection time
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
CERT_REQS = ("none", "optional", "required")
SENTINEL_DEFAULT_PORT = 26379
#: options of the sentinels themselves (not passed to the data nodes)
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class RedisTarget:
    """A parsed ``FLEET_REDIS_URL``.

    ``url`` is what redis-py's ``from_url`` gets (a ``redis://``/``rediss://`` URL: for a
    cluster, its first start-up node); ``hosts`` lists (host, port) of a cluster's start-up
    nodes or of the sentinels; ``service`` is the name of the master the sentinels monitor
    (a Sentinel ``url`` carries the master's user, password, database and options; its host
    is a placeholder).
    """

    kind: str  #: "standalone", "cluster" or "sentinel"
    url: str
    tls: bool
    options: dict[str, str] = field(default_factory=dict)  #: query options, as given
    hosts: tuple[tuple[str, int], ...] = ()
    service: str = ""

    @property
    def unverified(self) -> bool:
        """TLS without certificate verification (``ssl_cert_reqs=none``, given explicitly)."""
        return self.tls and self.options.get("ssl_cert_reqs", "required").lower() == "none"

    @property
    def sentinel_options(self) -> dict[str, str]:
        return {k.removeprefix("sentinel_"): v for k, v in self.options.items()
                if k in SENTINEL_OPTIONS}


def _fail(name: str, url: str, expected: str) -> FleetConfigError:
    return FleetConfigError(f"{name}={redact(url)!r} is invalid: expected {expected}")


def _host_port(text: str, default: int, name: str, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise _fail(name, url, "a host in every HOST:PORT")
    try:
        number = int(port) if port else default
    except ValueError:
        raise _fail(name, url, f"a port number, not {port!r}") from None
    if not 0 < number < 65536:
        raise _fail(name, url, f"a port between 1 and 65535, not {number}")
    return host, number


def parse(url: Any, name: str = "FLEET_REDIS_URL") -> RedisTarget:
    """Parse and check *url* (see the module docstring).

    Raises:
        FleetConfigError: naming *name*, the URL (password redacted) and what is wrong.
    """
    if not isinstance(url, str) or "://" not in url:
        raise FleetConfigError(f"{name}={url!r} is invalid: expected {EXPECTED}")
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise _fail(name, url, EXPECTED)
    kind, tls = SCHEMES[scheme]
    body = url.partition("://")[2]
    after = userinfo(url)[3]
    raw_userinfo = body[: len(body) - len(after)]  # "user:password@" as written, or ""
    rest, _, query = after.partition("?")
    query = query.partition("#")[0]
    options = dict(parse_qsl(query, keep_blank_values=True))
    if kind == "sentinel":
        netloc, _, path = rest.partition("/")
        sentinels = tuple(_host_port(h.strip(), SENTINEL_DEFAULT_PORT, name, url)
                          for h in netloc.split(",") if h.strip())
        if not sentinels:
            raise _fail(name, url, "at least one sentinel HOST:PORT")
        service, _, db = path.strip("/").partition("/")
        if not service:
            raise _fail(name, url, "the monitored master's name: "
                        "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB]")
        if db and not db.isdigit():
            raise _fail(name, url, f"a database number after the service name, not {db!r}")
        master_query = urlencode([(k, v) for k, v in parse_qsl(query, True)
                                  if k not in SENTINEL_OPTIONS])
        master_url = (f"{'rediss' if tls else 'redis'}://{raw_userinfo}sentinel-master/"
                      f"{db or 0}" + (f"?{master_query}" if master_query else ""))
        target = RedisTarget(kind, master_url, tls, options, sentinels, service)
    else:
        hosts: tuple[tuple[str, int], ...] = ()
        plain = url
        if kind == "cluster":
            netloc, slash, path = rest.partition("/")
            hosts = tuple(_host_port(h.strip(), 6379, name, url)
                          for h in netloc.split(",") if h.strip())
            if not hosts:
                raise _fail(name, url, "a host in the URL")
            first = netloc.split(",")[0].strip()
            plain = (f"{'rediss' if tls else 'redis'}://{raw_userinfo}{first}{slash}{path}"
                     + (f"?{query}" if query else ""))
        parts = urlsplit(plain)
        if scheme != "unix":
            if not parts.hostname:
                raise _fail(name, url, "a host in the URL")
            try:
                parts.port  # noqa: B018 - raises ValueError on a bad port
            except ValueError:
                raise FleetConfigError(f"{name}={redact(url)!r} is invalid: bad port") from None
        elif not parts.path:
            raise _fail(name, url, "a socket path in the unix:// URL")
        if kind == "cluster" and parts.path.strip("/") not in ("", "0"):
            raise _fail(name, url, "no database number, or 0 (Redis Cluster has database 0 "
                        "only)")
        target = RedisTarget(kind, plain, tls, options, hosts)
    _check_tls(target, name, url)
    return target


def _check_tls(target: RedisTarget, name: str, url: str) -> None:
    ssl_options = sorted(k for k in target.options if k.startswith("ssl"))
    if ssl_options and not target.tls:
        raise _fail(name, url, f"a rediss:// scheme for the TLS option(s) "
                    f"{', '.join(ssl_options)} (redis:// does not use TLS)")
    reqs = target.options.get("ssl_cert_reqs")
    if reqs is not None and reqs.lower() not in CERT_REQS:
        raise _fail(name, url, f"ssl_cert_reqs among {', '.join(CERT_REQS)}, not {reqs!r}")
    for option in TLS_FILES:
        path = target.options.get(option)
        if path is not None and not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not readable"
            raise _fail(name, url, f"a readable PEM file for {option}, but {path!r}: {why}")
    if ("ssl_keyfile" in target.options) != ("ssl_certfile" in target.options):
        raise _fail(name, url, "ssl_certfile and ssl_keyfile together (the client "
                    "certificate and its key)")


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
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        return  # Cluster and Sentinel URLs: redis_url.parse checked their options
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        # redis-py would silently use database 0 for redis://host/x
        raise FleetConfigError(f"{name}={redact(url)!r} is invalid: the database number "
                               f"{db!r} is not a number (redis://HOST:PORT/0)")
    try:
        pool = redis.ConnectionPool.from_url(url)
        pool.make_connection()  # builds the connection object only: no I/O
    except (TypeError, ValueError, redis.RedisError) as exc:  # RedisError: "protocol must be..."
        # "for 'x'" (current redis-py) or "for `x`" (redis-py 5.0)
        found = re.search(r"argument '(\w+)'|for ['`](\w+)['`]", str(exc))
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
    parse(url, name)
    _check_url_options(url, name)
    return str(url)
