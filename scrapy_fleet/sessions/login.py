"""The spider's session hooks (docs/sessions.md, "Logins"): a login run once per session
across the fleet, and the validity check of responses.

A spider declares them as methods, both optional::

    def fleet_session_login(self, session: SessionView) -> scrapy.Request | None: ...
    def fleet_session_check(self, response) -> bool: ...

The login request is downloaded through the downloader middlewares only (as Scrapy's
robots.txt middleware fetches robots.txt: redirects followed, cookies merged into the
session's fleet jar), in the session's jar; then its callback, if any, is called with the
final response and returns False (the login failed), a Request (the next step of the login,
at most :data:`MAX_STEPS`), or anything else (it succeeded).  Without a callback the login
succeeded when ``fleet_session_check`` passes on the final response, or, without a check,
when its status is below 400.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.http import Response

from scrapy_fleet import engine_hooks
from scrapy_fleet.sessions.pool import jar_name

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: requests one login may take (its request, then those its callbacks return)
MAX_STEPS = 5


@dataclass(frozen=True)
class SessionView:
    """What ``fleet_session_login`` gets: the session ``id``, its ``pool`` and its
    ``generation`` (its logins so far: this login, if it succeeds, makes it
    ``generation + 1``)."""

    id: str
    pool: str
    generation: int


def spider_hook(spider: Any, name: str) -> Callable[..., Any] | None:
    hook = getattr(spider, name, None)
    return hook if callable(hook) else None


def passes(check: Callable[[Response], Any] | None, response: Response) -> bool:
    """Does *response* pass the spider's check (no check: it does)?  A check that raises
    counts as failed (logged)."""
    if check is None:
        return True
    try:
        return bool(check(response))
    except Exception:
        logger.exception("fleet_session_check raised on %s: counted as a failed check",
                         response)
        return False


async def run_login(crawler: Crawler, session: SessionView) -> tuple[bool, str]:
    """Run the spider's login for *session*: (succeeded, failure reason ``login/...``).
    Never raises: an error of the spider's code or of a download is a failed login
    (logged with the session, never with a cookie)."""
    spider = crawler.spider
    login = spider_hook(spider, "fleet_session_login")
    if login is None:
        return True, ""
    try:
        request = login(session)
    except Exception:
        logger.exception("fleet_session_login raised for session %s", session.id)
        return False, "login/error"
    for _ in range(MAX_STEPS):
        if request is None:
            return True, ""
        if not isinstance(request, Request):
            logger.error("fleet_session_login of session %s gave %r, not a Request",
                         session.id, type(request).__name__)
            return False, "login/error"
        request = request.replace(dont_filter=True, meta={
            **request.meta, "fleet_session": session.id, "fleet_session_login": True,
            "cookiejar": jar_name(session.id)})
        try:
            response = await engine_hooks.download(crawler, request)
        except Exception as exc:
            logger.warning("login of session %s failed: %s: %s", session.id,
                           type(exc).__name__, exc)
            return False, "login/download"
        callback = request.callback
        if callback is None:
            check = spider_hook(spider, "fleet_session_check")
            ok = passes(check, response) if check else response.status < 400
            return ok, "" if ok else "login/rejected"
        try:
            request = callback(response)
        except Exception:
            logger.exception("the login callback raised for session %s", session.id)
            return False, "login/error"
        if request is False:
            return False, "login/rejected"
        if not isinstance(request, Request):
            return True, ""
    return False, "login/too_many_steps"
