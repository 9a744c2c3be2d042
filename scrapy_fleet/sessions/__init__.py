"""Sessions across the fleet (issue 32, docs/sessions.md).

* :mod:`.settings`: ``FLEET_COOKIES`` and ``FLEET_COOKIE_MAX_BYTES``.
* :mod:`.jar`: the fleet's cookie jars in Redis (one HASH per session, one field per cookie)
  and the Scrapy ``CookieJar`` rebuilt from one for each request.
* :mod:`.middleware`: ``FleetCookiesMiddleware``, put in place of Scrapy's
  ``CookiesMiddleware`` by the add-on unless ``FLEET_COOKIES`` is False.
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


__all__ = ["CookieTooLargeError"]
