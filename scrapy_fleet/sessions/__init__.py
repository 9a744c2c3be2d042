"""Sessions across the fleet (issue 32, docs/sessions.md).

* :mod:`.settings`: ``FLEET_COOKIES`` and ``FLEET_COOKIE_MAX_BYTES``.
* :mod:`.jar`: the fleet's cookie jars in Redis (one HASH per session, one field per cookie)
  and the Scrapy ``CookieJar`` rebuilt from one for each request.
* :mod:`.middleware`: ``FleetCookiesMiddleware``, put in place of Scrapy's
  ``CookiesMiddleware`` by the add-on unless ``FLEET_COOKIES`` is False.
* :mod:`.pool`: session records and pools (lua/sessions.lua).
* :mod:`.drawing`: ``FleetSessionsMiddleware`` (a request draws its session, waits for its
  login, is checked) and ``FleetSessionsSpiderMiddleware`` (children keep their session),
  listed by the add-on when ``FLEET_SESSION_POOL_SIZE`` is given; :mod:`.login` runs the
  spider's login once per session across the fleet.
"""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest

from scrapy_fleet.errors import FleetError


class CookieTooLargeError(IgnoreRequest, FleetError):
    """A cookie larger than ``FLEET_COOKIE_MAX_BYTES`` was set (by an answer, or by a
    request's own ``cookies``): it is not stored, the request fails with this error (its
    errback gets it) and is recorded with ``fleet_reason`` ``"cookie/too_large"``; the
    message names the cookie, its domain and size, never its value.  The other cookies of the
    same answer are stored."""

    fleet_reason = "cookie/too_large"


class SessionError(IgnoreRequest, FleetError):
    """A request could not get a usable session: its errback gets this error and it is
    recorded among the failed requests with :attr:`fleet_reason` (``session/unknown``: it
    was pinned, ``meta["fleet_session"]``, to a session that does not exist;
    ``session/login_failed``: the logins of several sessions of its pool failed in a row)."""

    def __init__(self, message: str, fleet_reason: str) -> None:
        super().__init__(message)
        self.fleet_reason = fleet_reason


__all__ = ["CookieTooLargeError", "SessionError"]
