"""Spiders of tests/e2e/test_sessions_crawl.py (tests/loginsite.py): plain Scrapy spiders that
use only Scrapy's own cookie handling, nothing of the fleet."""

from __future__ import annotations

from typing import Any

import scrapy


class LoginMembersSpider(scrapy.Spider):
    """Logs in with a FormRequest (POST /login, a 302 with the session cookie to /members/),
    then follows every members link; each page is an item saying whether it was the members'
    page or the login form."""

    name = "login_members"
    site = "http://127.0.0.1/"

    async def start(self) -> Any:
        yield scrapy.FormRequest(self.site + "login", formdata={"user": "u",
                                                                "password": "secret"},
                                 callback=self.parse)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "member": bool(response.css("#member")),
               "login_form": bool(response.css("form#login"))}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse)


class CookieMarksSpider(scrapy.Spider):
    """Fetches /mark/ and every /mark/<i>.html, each of which sets a cookie of its own, all in
    one session (the default jar, or ``-a jar=NAME``: ``meta["cookiejar"]``); ``-a
    extra=PATH`` fetches that path of the site too, with an errback that makes an item of the
    failure."""

    name = "cookie_marks"
    site = "http://127.0.0.1/"
    jar = ""
    extra = ""

    async def start(self) -> Any:
        meta = {"cookiejar": self.jar} if self.jar else {}
        yield scrapy.Request(self.site + "mark/", meta=meta, callback=self.parse)
        if self.extra:
            yield scrapy.Request(self.site + self.extra, meta=meta, callback=self.parse,
                                 errback=self.failed)

    def failed(self, failure: Any) -> Any:
        yield {"failed": failure.request.url, "error": type(failure.value).__name__}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
        meta = {"cookiejar": self.jar} if self.jar else {}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse, meta=meta)


class PoolMembersSpider(scrapy.Spider):
    """A spider with a session pool (issue 32 items 2 and 4): its login is declared with
    ``fleet_session_login`` and run by the fleet once per session, its validity check
    ``fleet_session_check`` sees the login form; two start requests (the members index,
    twice) draw the two sessions of the pool, and the links each index yields keep its
    session (FLEET_SESSION_INHERIT)."""

    name = "pool_members"
    site = "http://127.0.0.1/"
    custom_settings = {"FLEET_SESSION_POOL_SIZE": 2}

    async def start(self) -> Any:
        for query in ("", "?from=2"):
            yield scrapy.Request(self.site + "members/" + query, callback=self.parse)

    def fleet_session_login(self, session: Any) -> Any:
        return scrapy.FormRequest(self.site + "login", formdata={"user": session.id,
                                                                "password": "secret"})

    def fleet_session_check(self, response: Any) -> bool:
        return not response.css("form#login")

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "member": bool(response.css("#member")),
               "login_form": bool(response.css("form#login")),
               "session": response.meta.get("fleet_session")}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, self.parse)


class PoolBigCookiesSpider(scrapy.Spider):
    """A pool of one session (issue 32 item 5's slot leak): ``-a pages=N`` requests of
    ``/big.html?i=<i>``, each answered with a cookie too large for the fleet's jar, so the
    cookies middleware raises ``CookieTooLargeError`` in ``process_response``, after the
    download and before the sessions middleware sees the answer; each failure is an item."""

    name = "pool_big_cookies"
    site = "http://127.0.0.1/"
    pages = "5"
    custom_settings = {"FLEET_SESSION_POOL_SIZE": 1}

    async def start(self) -> Any:
        for i in range(int(self.pages)):
            yield scrapy.Request(f"{self.site}big.html?i={i}", callback=self.parse,
                                 errback=self.failed)

    def failed(self, failure: Any) -> Any:
        yield {"failed": failure.request.url, "error": type(failure.value).__name__,
               "session": failure.request.meta.get("fleet_session")}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
