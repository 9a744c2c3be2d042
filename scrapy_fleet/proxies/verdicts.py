"""What an answer says about the exit that carried it (docs/proxies.md#verdicts).

Five verdicts, each with a reason:

* ``ok``: the exit works for the site (2xx, 3xx, other 4xx; 404 and 410 are never a ban).
* ``ban``: the site refuses this exit: a status in ``FLEET_PROXY_BAN_STATUSES`` (403), a
  header matching ``FLEET_PROXY_BAN_HEADERS``, or a body matching
  ``FLEET_PROXY_BAN_PATTERNS`` (challenge pages, also on a 200).  Cools the exit down for
  that site only.
* ``rate_limited``: 429.  The politeness middleware puts the host on hold for the fleet
  (``Retry-After``); no exit is cooled down or retired.
* ``proxy_dead``: the exit itself failed: 407 (or a proxy's own auth challenge), a refused or
  failed connection to the proxy, a tunnel error, a connection lost or timed out through it
  while the site answers others.  Repeated, across sites, it marks the exit dead fleet-wide.
* ``site_error``: 5xx from the site, or a timeout on a request that already timed out through
  another exit (the site, not the exit, fails).  Feeds the host's back-off, not the exit's.

A ban policy (``FLEET_PROXY_BAN_POLICY``) is asked first, per request; it may answer
:data:`None` ("don't know"), and then these rules decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from scrapy import exceptions as scrapy_exceptions
from scrapy.exceptions import IgnoreRequest
from twisted.internet import error as neterror
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from scrapy_fleet.proxies.settings import ProxyConfig

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

VERDICTS = ("ok", "ban", "rate_limited", "proxy_dead", "site_error")
#: bytes of a body the ban patterns look at
BODY_SCAN_BYTES = 65536



def _scrapy_errors(*names: str) -> tuple[type[BaseException], ...]:
    """Scrapy's own download exceptions (Scrapy >= 2.14 wraps Twisted's in them)."""
    return tuple(getattr(scrapy_exceptions, n) for n in names if hasattr(scrapy_exceptions, n))


@lru_cache(maxsize=1)
def _connect_errors() -> tuple[type[BaseException], ...]:
    """Failures to reach or talk to the proxy itself (with a proxy, every connection goes to
    it).  Built at the first verdict on a failure: Scrapy's HTTP/1.1 handler (TunnelError),
    about a second of start-up on a loaded machine, is imported by a worker's downloader
    anyway, and never by the commands, which read this module to check
    FLEET_PROXY_BAN_POLICY."""
    from scrapy.core.downloader.handlers.http11 import TunnelError

    return (neterror.ConnectionRefusedError, neterror.ConnectError, neterror.DNSLookupError,
            neterror.NoRouteError, TunnelError, ConnectionRefusedError,
            *_scrapy_errors("DownloadConnectionRefusedError", "CannotResolveHostError"))


#: failures while waiting for the answer: the exit or the site
_LOST_ERRORS: tuple[type[BaseException], ...] = (
    neterror.TimeoutError, neterror.TCPTimedOutError, neterror.ConnectionLost,
    neterror.ConnectionDone, ResponseNeverReceived, ResponseFailed, TimeoutError,
    ConnectionResetError,
    *_scrapy_errors("DownloadTimeoutError", "DownloadFailedError", "ResponseDataLossError"))


@dataclass(frozen=True)
class Verdict:
    """``kind``: one of :data:`VERDICTS`; ``reason``: short, e.g. ``"status:403"``."""

    kind: str
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in VERDICTS:
            raise ValueError(f"unknown verdict {self.kind!r}: expected one of {VERDICTS}")


class VerdictRules:
    """The settings' rules (``FLEET_PROXY_BAN_*``), used when the policy does not know."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config

    def response_verdict(self, request: Request, response: Response) -> Verdict:
        status = response.status
        if status == 407 or (status == 401 and b"Proxy-Authenticate" in response.headers):
            return Verdict("proxy_dead", f"status:{status}")
        if status in (404, 410):
            return Verdict("ok", f"status:{status}")
        if status == 429:
            return Verdict("rate_limited", "status:429")
        if status in self.config.ban_statuses:
            return Verdict("ban", f"status:{status}")
        for name, pattern in self.config.ban_headers:
            for value in response.headers.getlist(name):
                if pattern.search(value):
                    return Verdict("ban", f"header:{name}")
        if self.config.ban_patterns:
            body = response.body[:BODY_SCAN_BYTES]
            for n, pattern in enumerate(self.config.ban_patterns):
                if pattern.search(body):
                    return Verdict("ban", f"body:{n}")
        if status >= 500:
            return Verdict("site_error", f"status:{status}")
        return Verdict("ok", f"status:{status}")

    def exception_verdict(self, request: Request, exception: BaseException,
                          timed_out_elsewhere: bool) -> Verdict | None:
        """None for exceptions that say nothing about the exit (IgnoreRequest...)."""
        if isinstance(exception, IgnoreRequest):
            return None
        name = type(exception).__name__
        if isinstance(exception, _connect_errors()):
            return Verdict("proxy_dead", f"error:{name}")
        if isinstance(exception, _LOST_ERRORS):
            if timed_out_elsewhere:
                return Verdict("site_error", f"error:{name}")
            return Verdict("proxy_dead", f"error:{name}")
        return Verdict("site_error", f"error:{name}")


class BanPolicy:
    """The default ban policy: always "don't know", so the settings' rules decide.

    Subclass it and name the class in ``FLEET_PROXY_BAN_POLICY`` to judge some sites
    yourself; return a :class:`Verdict`, or None to let the rules decide.  Built with
    ``from_crawler(crawler)`` when it has one, else without arguments.  *site* is the
    request's politeness host key (``FLEET_HOST_KEY``).
    """

    def response_verdict(self, request: Request, response: Response,
                         site: str) -> Verdict | None:
        return None

    def exception_verdict(self, request: Request, exception: BaseException,
                          site: str) -> Verdict | None:
        return None


def build_policy(path: str, crawler: Any) -> Any:
    """The policy object named by ``FLEET_PROXY_BAN_POLICY``.

    Raises:
        FleetConfigError: the path does not name a class with ``response_verdict``.
    """
    from scrapy.utils.misc import build_from_crawler, load_object

    from scrapy_fleet.errors import FleetConfigError

    try:
        cls = load_object(path)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise FleetConfigError(f"FLEET_PROXY_BAN_POLICY={path!r} is invalid: {exc}") from None
    if not isinstance(cls, type) or not callable(getattr(cls, "response_verdict", None)):
        raise FleetConfigError(f"FLEET_PROXY_BAN_POLICY={path!r} is invalid: expected a class "
                               "with response_verdict(request, response, site)")
    return build_from_crawler(cls, crawler) if hasattr(cls, "from_crawler") else cls()
