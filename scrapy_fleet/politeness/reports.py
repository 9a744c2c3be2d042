"""What an answer tells the politeness of its host: its ``Retry-After`` (a hold), and the
download report for the host's adaptive controller (issue 35, lua/adaptive.lua): (outcome,
latency ms, reason), made from the response or the exception; docs/politeness.md."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

from scrapy import Request
from scrapy.http import Response
from twisted.internet.error import ConnectError, ConnectionLost
from twisted.web._newclient import ResponseNeverReceived

from scrapy_fleet.politeness.settings import AdaptiveConfig

#: outcomes of a download report (lua/adaptive.lua)
CLEAN, OVERLOAD, NEITHER = 0, 1, 2
#: statuses that neither lower nor raise a host's rate: bans stay per exit (proxies)
_BAN_STATUSES = frozenset({401, 403, 407})


def _latency_ms(request: Request) -> int:
    latency = request.meta.get("download_latency")
    return int(latency * 1000) if isinstance(latency, (int, float)) else -1


def response_report(request: Request, response: Response,
                    adaptive: AdaptiveConfig) -> tuple[int, int, str]:
    """(outcome, latency ms, reason) of *response* for its host's adaptive controller: an
    overload status (FLEET_ADAPTIVE_OVERLOAD_STATUSES, with or without Retry-After) is
    OVERLOAD, a ban or another 5xx NEITHER, any other answer CLEAN with Scrapy's
    ``download_latency`` (seconds, in the request's meta) in ms."""
    status = response.status
    if status in adaptive.overload_statuses:
        return (OVERLOAD, -1, str(status))
    if status in _BAN_STATUSES or status >= 500:
        return (NEITHER, -1, "")
    return (CLEAN, _latency_ms(request), "")


def exception_report(request: Request, exception: BaseException) -> tuple[int, int, str]:
    """(outcome, latency ms, reason) of a failed download: a timeout or a connection error
    (Scrapy's own retryable kinds: twisted's and the standard library's) is OVERLOAD (reason
    "timeout" or "error"); any other failure NEITHER."""
    name = type(exception).__name__
    if "Timeout" in name or "TimedOut" in name:
        return (OVERLOAD, -1, "timeout")
    if isinstance(exception, (ConnectionError, OSError, ConnectError, ConnectionLost,
                              ResponseNeverReceived)):
        return (OVERLOAD, -1, "error")
    return (NEITHER, -1, "")


def retry_after_seconds(response: Response) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date (RFC 9110
    section 10.2.3).  A date is measured against the response's ``Date`` header when it has
    one (the server's clock), else against this machine's clock.  None when absent/invalid."""
    value = response.headers.get(b"Retry-After")
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    date_header = response.headers.get(b"Date")
    try:
        now = parsedate_to_datetime(date_header.decode("latin-1")).timestamp() \
            if date_header else time.time()
    except (TypeError, ValueError):
        now = time.time()
    return max(0.0, when.timestamp() - now)
