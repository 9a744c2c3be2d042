"""The fleet's proxy pool: one pool in Redis shared by every worker (docs/proxies.md).

* :mod:`.pool`: the Redis client of ``lua/proxies.lua`` (choice, reports, admin calls).
* :mod:`.verdicts`: what an answer says about the exit that carried it, and the ban policy.
* :mod:`.middleware`: ``FleetProxyMiddleware``, enabled by the add-on when ``FLEET_PROXIES``
  or ``FLEET_PROXY_POOL`` is set.
* :mod:`.actions`: ``scrapy fleet proxies list|add|remove|drain|reset``.
"""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest

from scrapy_fleet.errors import FleetError


class ProxyBanError(IgnoreRequest, FleetError):
    """A request given up on because of its exits: banned (or carried by dead exits) through
    ``FLEET_PROXY_MAX_RETRIES + 1`` exits, or for another reason the middleware names.

    The request's errback gets it; the callback never sees the banned page.  ``fleet_reason``
    is a short machine-readable reason such as ``"proxy_ban:max_retries"`` or
    ``"proxy_dead:max_retries"`` (the crawl's record of failed requests stores it).
    """

    def __init__(self, message: str, fleet_reason: str) -> None:
        super().__init__(message)
        self.fleet_reason = fleet_reason


__all__ = ["ProxyBanError"]


#: meta key of the exit a request goes through: ``"<exit id>|<ticket>"`` (set by
#: ``FleetProxyMiddleware``; ticket 0 once judged)
EXIT_META = "fleet_proxy_exit"


def exit_id(meta: dict[str, object]) -> str:
    """The id of the proxy exit a request (its *meta*) went through; "" when none."""
    value = meta.get(EXIT_META)
    return value.partition("|")[0] if isinstance(value, str) and "|" in value else ""
