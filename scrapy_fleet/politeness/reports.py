"""What a download tells its host's adaptive controller (issue 35, lua/adaptive.lua): each
download report carries (outcome, latency ms, reason), made here from the response or the
exception; docs/politeness.md "Adaptive politeness"."""

from __future__ import annotations

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
