"""A test site with a login (fleet sessions, issue 32).

Run as ``python tests/loginsite.py --pages N --log FILE [--flaky K] [--expire U] [--ban U]
[--login-delay S] [--page-delay S]`` (prints ``http://127.0.0.1:PORT/``, then serves until killed):

* ``GET /login``: the login form (``<form id="login">``);
* ``POST /login`` with ``user=...&password=secret``: a 302 to ``/members/`` that sets a new
  session cookie ``sid`` (``Path=/; HttpOnly``); a wrong password gets the form again;
* ``/members/`` and ``/members/p/<i>.html`` (i < N): with a valid ``sid`` the page
  (``<h1 id="member">``; the index links to the N pages), else the login form, status 200,
  as a real site answers; with ``--flaky K`` the first request of every K-th members page
  (logged in or not) answers 503, so that it is retried;
* ``--expire U``: a session cookie is valid for U members pages (then the login form, as for
  no cookie: the record says ``"expired": true`` for its first such answer);
  ``--ban U``: after U members pages, its session answers 403 to every request;
  ``--login-delay S``: the first ``POST /login`` is logged as ``{"started": true}`` when it
  arrives and answered S seconds later; ``--page-delay S``: every ``/members/p/`` page is
  answered S seconds after it is logged (so that a crawl of N pages outlasts the start of
  every worker: one fast worker cannot fetch them all before the others lease any);
* ``--ban-addr-after U``: the first client address (a proxy exit's egress) to fetch U
  members pages is banned: it gets 403 to every request after (``"addr_banned": true``);
* ``--conflict S``: a members page with a session cookie is answered after S seconds, and a
  request that carries a session cookie while another request of it is being answered gets
  409 (``"conflict": true``): one request per session at a time;
* ``/big.html``: sets a cookie ``big`` of 5,000 bytes;
* ``/mark/``: links to ``/mark/<i>.html`` (i < N), each of which sets its own cookie
  ``m<i>=<i>`` (``Path=/``) and shows how many cookies the request carried.

Each request is logged as one JSON line ``{"method", "path", "member": the request carried a
valid sid, "cookies": names of the cookies it carried, "login": a login was granted, "sid":
the session cookie it carried or was given, "expired"/"banned": its first answer after
its session's end}``, and ``"addr"``: the client address it came from.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import threading
import time
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

FORM = (b'<html><body><form id="login" method="post" action="/login">'
        b'<input name="user"><input name="password" type="password"></form></body></html>')


class Site:
    def __init__(self, pages: int, log_path: str, flaky: int = 0, expire: int = 0,
                 ban: int = 0) -> None:
        self.pages = pages
        self.expire, self.ban = expire, ban
        self.login_delay = 0.0
        self.page_delay = 0.0
        self.uses: dict[str, int] = {}
        self.banned: set[str] = set()
        self.flaky = flaky
        self.failed: set[str] = set()
        self.lock = threading.Lock()
        self.sessions: set[str] = set()
        self.tokens = itertools.count(1)
        self.log = open(log_path, "a", encoding="utf-8")
        self.ban_addr_after = 0
        self.addr_pages: dict[str, int] = {}
        self.banned_addr: str | None = None
        self.conflict = 0.0
        self.in_flight: set[str] = set()

    def enter(self, sid: str | None) -> bool:
        """--conflict: *sid* starts a request; False when one of it is in flight."""
        with self.lock:
            if sid is None or sid in self.in_flight:
                return sid is None
            self.in_flight.add(sid)
            return True

    def leave(self, sid: str) -> None:
        with self.lock:
            self.in_flight.discard(sid)

    def addr_banned(self, addr: str, members: bool) -> bool:
        """--ban-addr-after: is *addr* banned (counting one more members page when
        *members*)?"""
        with self.lock:
            if not self.ban_addr_after or addr == self.banned_addr:
                return addr == self.banned_addr
            if members and self.banned_addr is None:
                self.addr_pages[addr] = self.addr_pages.get(addr, 0) + 1
                if self.addr_pages[addr] > self.ban_addr_after:
                    self.banned_addr = addr
                    return True
            return False

    def record(self, **fields: Any) -> None:
        with self.lock:
            self.log.write(json.dumps(fields) + "\n")
            self.log.flush()

    def login(self, body: bytes) -> str | None:
        form = parse_qs(body.decode("utf-8", "replace"))
        if form.get("password") != ["secret"]:
            return None
        with self.lock:
            token = f"t{next(self.tokens)}"
            self.sessions.add(token)
        return token

    def use(self, sid: str | None) -> tuple[bool, dict[str, bool]]:
        """Is *sid* a valid session for one more members page?  (Counts the use; ends the
        session at --expire / --ban uses.)  Also the flags of the request's record."""
        with self.lock:
            if sid is None or sid not in self.sessions:
                return False, {}
            if sid in self.banned:
                return False, {"banned_again": True}
            self.uses[sid] = self.uses.get(sid, 0) + 1
            if self.expire and self.uses[sid] > self.expire:
                self.sessions.discard(sid)
                return False, {"expired": True}
            if self.ban and self.uses[sid] > self.ban:
                self.banned.add(sid)
                return False, {"banned": True}
            return True, {}

    def page(self, path: str, member: bool) -> tuple[int, dict[str, str], bytes]:
        if path == "/members/" and member:
            links = "".join(f'<a href="/members/p/{i}.html">{i}</a>' for i in range(self.pages))
            return 200, {}, f'<html><body><h1 id="member">index</h1>{links}</body></html>'.encode()
        if path.startswith("/members/p/") and path.endswith(".html") and member:
            num = path[len("/members/p/"):-len(".html")]
            if self.flaky and num.isdigit() and int(num) % self.flaky == 0:
                with self.lock:
                    first, _ = path not in self.failed, self.failed.add(path)
                if first:
                    return 503, {}, b"try again"
            return 200, {}, f'<html><body><h1 id="member">page {num}</h1></body></html>'.encode()
        if path == "/login" or path.startswith("/members/"):
            return 200, {}, FORM
        if path == "/mark/":
            links = "".join(f'<a href="/mark/{i}.html">{i}</a>' for i in range(self.pages))
            return 200, {}, f"<html><body>{links}</body></html>".encode()
        if path == "/big.html":  # a cookie over 4096 bytes, next to a small one
            return 200, {"Set-Cookie": "big=" + "b" * 5000 + "; Path=/"}, b"<html>big</html>"
        if path.startswith("/mark/") and path.endswith(".html"):
            num = path[len("/mark/"):-len(".html")]
            return 200, {"Set-Cookie": f"m{num}={num}; Path=/"}, b"<html><body>mark</body></html>"
        return 404, {}, b"not found"


class Handler(BaseHTTPRequestHandler):
    site: Site

    def log_message(self, *args: Any) -> None:
        pass

    def _cookies(self) -> dict[str, str]:
        jar: SimpleCookie = SimpleCookie()
        jar.load(self.headers.get("Cookie", ""))
        return {k: m.value for k, m in jar.items()}

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refused(self, method: str, path: str) -> bool:
        addr = self.client_address[0]
        if not self.site.addr_banned(addr, path.startswith("/members/p/")):
            return False
        cookies = self._cookies()
        self.site.record(method=method, path=self.path, member=False, cookies=sorted(cookies),
                         login=False, sid=cookies.get("sid"), addr=addr, addr_banned=True)
        self._send(403, {}, b"forbidden")
        return True

    def do_GET(self) -> None:
        cookies = self._cookies()
        path = self.path.split("?")[0]
        if self._refused("GET", path):
            return
        sid = cookies.get("sid")
        if self.site.conflict and path.startswith("/members/") and sid:
            if not self.site.enter(sid):
                self.site.record(method="GET", path=self.path, member=False,
                                 cookies=sorted(cookies), login=False, sid=sid,
                                 addr=self.client_address[0], conflict=True)
                self._send(409, {}, b"conflict")
                return
            try:
                time.sleep(self.site.conflict)
            finally:
                self.site.leave(sid)  # (before the answer: the next request may follow it)
        self._get(path, cookies)

    def _get(self, path: str, cookies: dict[str, str]) -> None:
        if path.startswith("/members/"):
            member, flags = self.site.use(cookies.get("sid"))
        else:
            member, flags = cookies.get("sid") in self.site.sessions, {}
        self.site.record(method="GET", path=self.path, member=member, cookies=sorted(cookies),
                         login=False, sid=cookies.get("sid"), addr=self.client_address[0],
                         **flags)
        if self.site.page_delay and path.startswith("/members/p/"):
            time.sleep(self.site.page_delay)
        if flags.get("banned") or flags.get("banned_again"):
            self._send(403, {}, b"forbidden")
            return
        self._send(*self.site.page(path, member))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self._refused("POST", self.path):
            return
        with self.site.lock:
            delay, self.site.login_delay = self.site.login_delay, 0.0
        if delay:  # the first login only: its worker can be killed meanwhile
            self.site.record(method="POST", path=self.path, started=True)
            time.sleep(delay)
        token = self.site.login(body) if self.path == "/login" else None
        self.site.record(method="POST", path=self.path, member=False,
                         cookies=sorted(self._cookies()), login=token is not None, sid=token,
                         addr=self.client_address[0])
        if token is None:
            self._send(200, {}, FORM)
            return
        self._send(302, {"Location": "/members/", "Set-Cookie": f"sid={token}; Path=/; HttpOnly"},
                   b"")


def launch(log: str, pages: int, **options: Any) -> tuple[subprocess.Popen[str], str]:
    """Start this site in a process (for the tests): its log at *log*, *pages* members pages,
    *options* the command line's (``page_delay=0.4`` for ``--page-delay 0.4``).  Returns the
    process and the site's URL (``http://127.0.0.1:PORT/``); the caller stops the process."""
    args = [sys.executable, __file__, "--pages", str(pages), "--log", str(log)]
    for name, value in options.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        raise RuntimeError(proc.stderr.read() if proc.stderr else url)
    return proc, url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--log", required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--flaky", type=int, default=0)
    parser.add_argument("--expire", type=int, default=0)
    parser.add_argument("--ban", type=int, default=0)
    parser.add_argument("--login-delay", type=float, default=0.0)
    parser.add_argument("--page-delay", type=float, default=0.0)
    parser.add_argument("--ban-addr-after", type=int, default=0)
    parser.add_argument("--conflict", type=float, default=0.0)
    args = parser.parse_args()
    Handler.site = Site(args.pages, args.log, args.flaky, args.expire, args.ban)
    Handler.site.login_delay = args.login_delay
    Handler.site.page_delay = args.page_delay
    Handler.site.ban_addr_after = args.ban_addr_after
    Handler.site.conflict = args.conflict
    server = ThreadingHTTPServer((args.bind, 0), Handler)
    server.daemon_threads = True
    print(f"http://{args.bind}:{server.server_address[1]}/", flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
