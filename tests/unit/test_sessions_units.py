"""Fleet cookie jars without Redis (issue 32 item 1): the session id travels with a request
through the frontier's codec, cookie headers are logged without values, and the add-on puts
the fleet's middleware in place of Scrapy's unless told not to."""

from __future__ import annotations

import re

import pytest
from scrapy import FormRequest
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.settings import Settings

from scrapy_fleet import codec
from scrapy_fleet.addon import Addon
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.redact import cookie_header
from scrapy_fleet.sessions.jar import DEFAULT_SESSION, session_id
from scrapy_fleet.sessions.middleware import FleetCookiesMiddleware
from scrapy_fleet.sessions.settings import CookieConfig, cookie_config


@pytest.mark.parametrize("jar", [1, "alice", ("a", 2)])
def test_the_session_key_and_dont_merge_cookies_survive_the_frontier(jar):
    request = FormRequest("http://example.com/login", formdata={"u": "x"},
                          meta={"cookiejar": jar, "dont_merge_cookies": False},
                          cookies={"consent": "yes"})
    back = codec.decode(codec.encode(request), None, DEFAULT_REQUEST_CLASSES)
    assert back.meta == {"cookiejar": jar, "dont_merge_cookies": False}
    assert back.cookies == {"consent": "yes"}
    assert session_id(back.meta["cookiejar"]) == session_id(jar)


def test_session_ids():
    assert session_id(None) == DEFAULT_SESSION == "default"
    assert session_id(1) == session_id("1") == "1"


def test_cookie_headers_are_logged_without_values():
    assert cookie_header("sid=abc; lang=fr") == "sid=***; lang=***"
    assert cookie_header("sid=abc=def; Path=/; HttpOnly", set_cookie=True) == \
        "sid=***; Path=/; HttpOnly"
    assert cookie_header("flag", set_cookie=True) == "flag"


def _middlewares(**settings):
    s = Settings({"COOKIES_ENABLED": True, **settings})
    Addon().update_settings(s)
    return s.getdict("DOWNLOADER_MIDDLEWARES")


def test_the_addon_replaces_scrapys_cookie_middleware_unless_told_not_to():
    assert _middlewares() == {**_middlewares(), CookiesMiddleware: None,
                              FleetCookiesMiddleware: 700}
    off = _middlewares(FLEET_COOKIES=False)
    assert CookiesMiddleware not in off and FleetCookiesMiddleware not in off
    # a project that lists (or disables) Scrapy's own keeps its choice
    own = _middlewares(DOWNLOADER_MIDDLEWARES={
        "scrapy.downloadermiddlewares.cookies.CookiesMiddleware": None})
    assert FleetCookiesMiddleware not in own


def test_cookie_settings_are_checked():
    assert cookie_config({}) == CookieConfig(enabled=True, max_bytes=4096)
    assert cookie_config({"FLEET_COOKIES": "false"}).enabled is False
    with pytest.raises(FleetConfigError, match="FLEET_COOKIES='maybe'"):
        cookie_config({"FLEET_COOKIES": "maybe"})
    with pytest.raises(FleetConfigError, match="FLEET_COOKIE_MAX_BYTES=10"):
        cookie_config({"FLEET_COOKIE_MAX_BYTES": 10})


def test_session_settings_are_checked():
    from scrapy_fleet.sessions.settings import SessionConfig, session_config

    assert session_config({}) == SessionConfig()
    assert session_config({}).enabled is False
    got = session_config({"FLEET_SESSION_POOL_SIZE": "2", "FLEET_SESSION_RETIRE_STATUSES":
                          "403, 429", "FLEET_SESSION_INHERIT": "false"})
    assert (got.pool_size, got.retire_statuses, got.inherit) == (2, (403, 429), False)
    for name, value in (("FLEET_SESSION_POOL_SIZE", -1), ("FLEET_SESSION_MAX_USES", 2.5),
                        ("FLEET_SESSION_MAX_AGE", "soon"),
                        ("FLEET_SESSION_RETIRE_STATUSES", [403, 99]),
                        ("FLEET_SESSION_LOGIN_TIMEOUT", 0),
                        ("FLEET_SESSION_CONCURRENCY", -1), ("FLEET_SESSION_DELAY", "often"),
                        ("FLEET_SESSION_INHERIT", "maybe")):
        given = re.escape(f"{name}={value!r}")
        with pytest.raises(FleetConfigError, match=f"^{given} is invalid"):
            session_config({name: value})


def test_the_addon_lists_the_session_middlewares_only_with_a_pool_size():
    from scrapy.utils.misc import load_object

    from scrapy_fleet.sessions.drawing import (
        FleetSessionsMiddleware,
        FleetSessionsSpiderMiddleware,
    )

    def spider_mws(**settings: object) -> dict[object, int]:
        s = Settings({"ADDONS": {Addon: 500}, **settings})
        Addon().update_settings(s)
        return {load_object(k) if isinstance(k, str) else k: v
                for k, v in s.getdict("SPIDER_MIDDLEWARES").items()}

    assert FleetSessionsMiddleware not in _middlewares()
    assert FleetSessionsSpiderMiddleware not in spider_mws()
    assert _middlewares(FLEET_SESSION_POOL_SIZE=2)[FleetSessionsMiddleware] == 545
    assert spider_mws(FLEET_SESSION_POOL_SIZE=2)[FleetSessionsSpiderMiddleware] == 800
