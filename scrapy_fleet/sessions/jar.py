"""Fleet cookie jars: the cookies of one session in one Redis HASH, one field per cookie.

A session is what Scrapy calls a cookie jar: ``meta["cookiejar"]`` (any value; its ``str()``
names the session) or, without that key, the default jar (session :data:`DEFAULT_SESSION`).
Its jar is ``keys.CrawlKeys.cookie_jar(session)``: field ``"<domain>\\t<path>\\t<name>"``,
value ``"<expiry ms or 0>\\t<JSON attributes>"`` (lua/cookies_read.lua, lua/cookies_merge.lua).
Which cookies a request sends, and which ``Set-Cookie`` headers are accepted, is decided by
Python's ``http.cookiejar`` through Scrapy's ``CookieJar`` exactly as in one Scrapy process:
before each request the worker rebuilds a jar from the stored fields (:class:`FleetCookieJar`)
and lets the stdlib match domain, path, secure and expiry; after an answer it merges what the
stdlib accepted (and the deletions it asked for) field by field, in one atomic script call.

Expiry is the server's: a cookie's remaining life (``Max-Age``, or ``Expires`` minus the
worker's clock at once) goes to Redis as milliseconds from now, and Redis's clock ends it.
Non-standard attributes (``HttpOnly``, ``SameSite``) are not kept: the stdlib never uses
them to choose what a request sends.  Stored data is JSON, never pickle.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from http.cookiejar import Cookie, CookiePolicy
from http.cookiejar import CookieJar as StdCookieJar
from typing import Any

from scrapy.http.cookies import CookieJar

from scrapy_fleet import lua
from scrapy_fleet.keys.crawl import CrawlKeys

#: the session of requests without ``meta["cookiejar"]`` (Scrapy's default jar)
DEFAULT_SESSION = "default"


def session_id(jar_key: Any) -> str:
    """The session of a request whose ``meta["cookiejar"]`` is *jar_key* (None: the default
    jar).  ``str()`` of the key: the keys ``1`` and ``"1"`` are one session."""
    return DEFAULT_SESSION if jar_key is None else str(jar_key)


def field_of(cookie: Cookie) -> str:
    """The jar field of *cookie*: ``"<domain>\\t<path>\\t<name>"`` (the stdlib's own key)."""
    return f"{cookie.domain}\t{cookie.path}\t{cookie.name}"


def cookie_bytes(cookie: Cookie) -> int:
    """The size of *cookie* as RFC 6265 section 6.1 counts it: name, value and attributes
    (here domain and path), UTF-8 bytes."""
    text = cookie.name + (cookie.value or "") + cookie.domain + cookie.path
    return len(text.encode("utf-8", "surrogatepass"))


def to_attrs(cookie: Cookie) -> str:
    """The JSON stored for *cookie* (everything the stdlib's matching reads but the expiry)."""
    return json.dumps({"n": cookie.name, "v": cookie.value, "d": cookie.domain,
                       "p": cookie.path, "ver": cookie.version, "port": cookie.port,
                       "ps": cookie.port_specified, "ds": cookie.domain_specified,
                       "di": cookie.domain_initial_dot, "pp": cookie.path_specified,
                       "s": cookie.secure, "c": cookie.comment, "cu": cookie.comment_url,
                       "rfc": cookie.rfc2109}, separators=(",", ":"), sort_keys=True)


def from_attrs(attrs: str | bytes, ms_left: int, now: float) -> Cookie:
    """The cookie stored as *attrs* with *ms_left* ms to live (-1: a session cookie), its
    expiry on this worker's clock *now* (epoch seconds).

    Raises:
        ValueError, KeyError, TypeError: *attrs* is not what :func:`to_attrs` writes.
    """
    a = json.loads(attrs)
    expires = None if ms_left < 0 else math.ceil(now + ms_left / 1000)
    return Cookie(version=a["ver"], name=str(a["n"]), value=a["v"], port=a["port"],
                  port_specified=bool(a["ps"]), domain=str(a["d"]),
                  domain_specified=bool(a["ds"]), domain_initial_dot=bool(a["di"]),
                  path=str(a["p"]), path_specified=bool(a["pp"]), secure=bool(a["s"]),
                  expires=expires, discard=expires is None, comment=a["c"],
                  comment_url=a["cu"], rest={}, rfc2109=bool(a["rfc"]))


def ttl_of(cookie: Cookie, now: float) -> str:
    """The merge script's ttl of *cookie*: ``"-1"`` without expiry, else the ms it has left
    by this worker's clock *now*, or ``"del"`` when none."""
    if cookie.expires is None:
        return "-1"
    ms = math.ceil((cookie.expires - now) * 1000)
    return str(ms) if ms > 0 else "del"


class _RecordingJar(StdCookieJar):
    """The stdlib jar, noting what is set and cleared once :attr:`recording` is on: the
    cookies the policy accepted (``set_cookie``) and the deletions a ``Set-Cookie`` with a
    past expiry asked for (``clear(domain, path, name)``, as the stdlib calls it)."""

    def __init__(self, policy: CookiePolicy | None) -> None:
        super().__init__(policy)
        self.recording = False
        self.loaded: dict[str, str] = {}  #: field -> attrs of the cookies the jar was read with
        self.stored: dict[str, Cookie] = {}
        self.cleared: set[str] = set()

    def set_cookie(self, cookie: Cookie) -> None:
        super().set_cookie(cookie)
        if not self.recording:
            return
        field = field_of(cookie)
        if cookie.expires is None and self.loaded.get(field) == to_attrs(cookie):
            return  # a request's own cookie already in the jar: nothing to write
        self.stored[field] = cookie
        self.cleared.discard(field)

    def clear(self, domain: str | None = None, path: str | None = None,
              name: str | None = None) -> None:
        if self.recording and domain is not None and path is not None and name is not None:
            field = f"{domain}\t{path}\t{name}"
            self.cleared.add(field)
            self.stored.pop(field, None)
        super().clear(domain, path, name)


class FleetCookieJar(CookieJar):
    """Scrapy's ``CookieJar`` holding one session's stored cookies, recording the changes
    made to it after :meth:`record` (:attr:`stored`, :attr:`cleared`)."""

    def __init__(self, cookies: Iterable[tuple[Cookie, str]] = (),
                 policy: CookiePolicy | None = None):
        """*cookies*: (cookie, its stored attributes: :func:`to_attrs`) pairs."""
        super().__init__(policy)
        self.jar: _RecordingJar = _RecordingJar(self.policy)
        for cookie, attrs in cookies:
            self.jar.set_cookie(cookie)
            self.jar.loaded[field_of(cookie)] = attrs
        self.jar.recording = True

    @property
    def stored(self) -> dict[str, Cookie]:
        """field -> cookie accepted since the jar was built (not already stored alike)."""
        return self.jar.stored

    @property
    def cleared(self) -> set[str]:
        """Fields whose deletion a ``Set-Cookie`` asked for since the jar was built."""
        return self.jar.cleared


class CookieStore:
    """The fleet's cookie jars of one crawl, through a redis-py asyncio client.

    Raises:
        redis.RedisError, OSError: from any call when Redis fails.
    """

    def __init__(self, client: Any, keys: CrawlKeys, parts: int = 1) -> None:
        self.client = client
        self.keys = keys
        #: FLEET_PARTITIONS: with P > 1 a session's jar is split by site, each part in its
        #: site's partition (:meth:`CrawlKeys.site_cookie_jar`)
        self.parts = parts
        self._read = lua.load(client, "cookies_read.lua")
        self._merge = lua.load(client, "cookies_merge.lua")
        #: stored fields that could not be read (not JSON of :func:`to_attrs`): skipped
        self.corrupt = 0

    async def read(self, session: str, site: str = "") -> list[Any]:
        """*session*'s live cookies for the hosts of *site* (:meth:`CrawlKeys.site_cookie_jar`;
        with one partition, all of them) as lua/cookies_read.lua answers them (one read): pass
        the reply to :meth:`jar`, once per request (a jar records what its request changes)."""
        return list(await self._read(
            keys=[self.keys.site_cookie_jar(session, site, self.parts)]))

    def jar(self, reply: list[Any]) -> FleetCookieJar:
        """A jar holding the cookies of a :meth:`read` reply, added in the order of their
        fields (the stdlib sends the longest paths first, then in that order)."""
        now = time.time()
        cookies = []
        for attrs, ms_left in zip(reply[::2], reply[1::2], strict=True):
            try:
                text = attrs.decode("utf-8", "surrogateescape") if isinstance(attrs, bytes) \
                    else attrs
                cookies.append((from_attrs(text, int(ms_left), now), text))
            except (ValueError, KeyError, TypeError):
                self.corrupt += 1
        # in field order: a request sends its cookies in the same order on every worker
        return FleetCookieJar(sorted(cookies, key=lambda pair: field_of(pair[0])))

    async def load(self, session: str, site: str = "") -> FleetCookieJar:
        """:meth:`jar` of a :meth:`read` of *session* for *site*."""
        return self.jar(await self.read(session, site))

    async def merge(self, session: str, stored: Iterable[Cookie],
                    cleared: Iterable[str], site: str = "") -> tuple[int, int, int]:
        """Write *stored* cookies and delete *cleared* fields of *session*'s jar for *site*
        (the site of the request that received or sent them: every cookie it may set applies
        to that site's hosts only), atomically (one call).  Returns (stored, deleted,
        expired) as lua/cookies_merge.lua counts them."""
        now = time.time()
        args: list[str] = []
        for cookie in stored:
            args += [field_of(cookie), ttl_of(cookie, now), to_attrs(cookie)]
        for field in cleared:
            args += [field, "del", ""]
        if not args:
            return 0, 0, 0
        reply = await self._merge(keys=[self.keys.site_cookie_jar(session, site, self.parts)],
                                  args=args)
        return int(reply[0]), int(reply[1]), int(reply[2])
