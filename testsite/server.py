"""A small static-file HTTP server for tests: observable and programmable.

:class:`SiteServer` serves one directory with Twisted Web on one or more loopback addresses
(``127.0.0.1``, ``127.0.0.2``, ...; on Linux the whole ``127.0.0.0/8`` is local), all on the
same port, so that several addresses look like several hosts to a crawler.

Serving: ``/x/`` answers ``x/index.html``; ``/x`` for a directory redirects (301) to ``/x/``;
the query string is ignored; unknown paths answer 404.  A redirect chain: ``/_hops/N/REST``
answers 302 to ``/_hops/N-1/REST``, and ``/_hops/0/REST`` 302 to ``/REST`` (N + 1 redirects).

Observing: every request is appended to the log file as one JSON line::

    {"t": 1712345678.123, "host": "127.0.0.2:8000", "addr": "127.0.0.2", "path": "/site/",
     "status": 200, "concurrent": 3}

``t`` is the server's ``time.time()`` (seconds) when the request arrived, ``host`` the
``Host`` header, ``addr`` the local address that accepted the connection, ``concurrent``
the number of requests to the same host name (``Host`` without port) in flight at arrival,
this one included. The server is single-threaded: a request answered at once is finished
before the next one is read, so only held (delayed) responses overlap. The server also
keeps the maximum of ``concurrent`` per host name; ``GET /_testsite/stats`` returns
``{"requests": N, "max_concurrent": {host: n}}`` (control paths are neither logged nor
counted).

Programming (:class:`Behaviour`, from ``--config FILE.json`` or ``PUT /_testsite/config``
with the same JSON)::

    {"delays":   [{"prefix": "/slow/", "seconds": 2.0, "host": null}],
     "failures": [{"prefix": "/busy/", "status": 429, "retry_after": 5, "first": 3,
                   "host": "127.0.0.2"}],
     "robots":   {"127.0.0.2": "User-agent: *\\nDisallow: /private/\\n"},
     "robots_status": {"127.0.0.3": 503}}

* a delay holds the response for ``seconds`` without blocking the server (``callLater``);
* a failure answers ``status`` (429, 503, ...) with ``Retry-After: retry_after`` (seconds or
  an HTTP date; omitted when null) to matching requests: all of them, or only the ``first``
  K matching ones;
* ``robots`` gives the body of ``/robots.txt`` per host name (otherwise the file from the
  served directory, or 404); ``robots_status`` makes ``/robots.txt`` answer that status.

``"capacity": [{"prefix": "/site/p/", "phases": [[15, 20], [60, 5], [100, 20]],
"status": 429, "host": "127.0.0.2"}]`` (adaptive politeness): a token bucket per rule whose
rate (requests/s) follows the phases, counted from the rule's first matching request; a
request over capacity is answered ``status`` (``retry_after`` adds the header).  With
``"latency": 0.05`` the rule refuses nothing: the host is one FIFO server of the phase's rate
and each answer is held ``latency`` s plus its wait in that queue (logged as ``"held"``).

``host`` null or absent matches every host. Delays also apply to failures.

``"changing"`` (recrawl): pages whose content changes by Poisson processes of known rates,
with ETag, Last-Modified and 304s (testsite/changing.py has its fields); ``GET
/_testsite/changes`` returns their truth (every change time).
"""

from __future__ import annotations

import json
import mimetypes
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import unquote

from twisted.internet import reactor as _reactor
from twisted.web import resource, server

CONTROL_PREFIX = "/_testsite/"


def host_name(host_header: str) -> str:
    """``"127.0.0.2:8000"`` -> ``"127.0.0.2"``; lower case; IPv6 brackets kept."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


@dataclass
class Delay:
    """Hold responses to paths starting with ``prefix`` for ``seconds`` (float, s)."""

    prefix: str
    seconds: float
    host: str | None = None


@dataclass
class Failure:
    """Answer ``status`` to paths starting with ``prefix``; only the ``first`` K if set.

    ``retry_after``: value of the ``Retry-After`` header (int seconds or an HTTP date).
    """

    prefix: str
    status: int = 429
    retry_after: int | str | None = None
    first: int | None = None
    host: str | None = None
    hits: int = 0  # matching requests seen so far


@dataclass
class Capacity:
    """A token bucket of ``rate`` requests/s per phase: ``phases`` [[until s, rate], ...]
    counted from the first matching request (the last phase's rate after its end), holding at
    most ``burst`` tokens (1 s of the phase's rate by default); a matching request without a
    token is answered ``status`` (with ``Retry-After: retry_after`` when set) and costs none.

    ``latency`` (s) set: nothing is refused; the host is one FIFO server serving ``rate``
    requests/s, and an answer is held ``latency`` plus its wait for that server
    (:meth:`queue_delay`), so that latency grows with the site's queue."""

    prefix: str
    phases: list[list[float]]
    status: int = 429
    retry_after: int | None = None
    burst: float | None = None
    host: str | None = None
    start: float | None = None
    tokens: float = 0.0
    last: float = 0.0
    latency: float | None = None
    free_at: float = 0.0  # latency mode: when the server is done with the queue so far

    def rate_at(self, elapsed: float) -> float:
        return next((r for until, r in self.phases if elapsed < until), self.phases[-1][1])

    def queue_delay(self, now: float) -> float:
        """Latency mode: seconds to hold a request arriving at *now* (s): ``latency`` plus the
        wait for the one server of the current phase's rate (a deterministic-service FIFO
        queue: the request is served from max(now, when the server is free), for 1/rate s)."""
        if self.start is None:
            self.start = now
        begin = max(now, self.free_at)
        self.free_at = begin + 1.0 / self.rate_at(now - self.start)
        return (self.latency or 0.0) + begin - now

    def admit(self, now: float) -> bool:
        """Whether a request arriving at *now* (s) is within capacity (takes its token)."""
        if self.start is None:
            self.start, self.last = now, now
            self.tokens = self.burst or self.rate_at(0.0)
        rate = self.rate_at(now - self.start)
        self.tokens = min(self.burst or rate, self.tokens + (now - self.last) * rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class Behaviour:
    """Everything the server does besides serving files. See the module docstring."""

    delays: list[Delay] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    robots: dict[str, str] = field(default_factory=dict)
    robots_status: dict[str, int] = field(default_factory=dict)
    #: recrawl: pages that change (testsite/changing.py), or None
    changing: Any = None
    #: adaptive politeness: hosts of a limited capacity (token buckets)
    capacity: list[Capacity] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Behaviour:
        unknown = set(data) - {"delays", "failures", "robots", "robots_status", "changing",
                               "capacity"}
        if unknown:
            raise ValueError(f"unknown behaviour keys: {sorted(unknown)}")
        return cls(
            delays=[Delay(**d) for d in data.get("delays", [])],
            failures=[Failure(**f) for f in data.get("failures", [])],
            robots={host_name(h): str(b) for h, b in data.get("robots", {}).items()},
            robots_status={host_name(h): int(s) for h, s in data.get("robots_status", {}).items()},
            changing=_changing(data.get("changing")),
            capacity=[Capacity(**c) for c in data.get("capacity", [])],
        )

    def delay_for(self, host: str, path: str) -> float:
        """Seconds to hold a response (the largest matching delay, 0.0 if none)."""
        return max(
            (d.seconds for d in self.delays if _matches(d.prefix, d.host, host, path)),
            default=0.0,
        )

    def failure_for(self, host: str, path: str) -> Failure | None:
        """The failure rule that applies to this request, counting it as a hit."""
        for rule in self.failures:
            if _matches(rule.prefix, rule.host, host, path):
                rule.hits += 1
                if rule.first is None or rule.hits <= rule.first:
                    return rule
        return None


def _changing(spec: Any) -> Any:
    if not spec:
        return None
    from testsite.changing import ChangingPages

    return ChangingPages(dict(spec))


def _hop(path: str) -> str | None:
    """Where ``/_hops/N/REST`` redirects (see the module docstring), or None for another
    path."""
    parts = path.split("/", 3)  # "", "_hops", N, REST
    if len(parts) < 4 or parts[1] != "_hops" or not parts[2].isdigit():
        return None
    n = int(parts[2])
    return f"/_hops/{n - 1}/{parts[3]}" if n > 0 else "/" + parts[3]


def _matches(prefix: str, rule_host: str | None, host: str, path: str) -> bool:
    return path.startswith(prefix) and (rule_host is None or host_name(rule_host) == host)


class _Root(resource.Resource):
    isLeaf = True

    def __init__(self, owner: SiteServer) -> None:
        super().__init__()
        self.owner = owner

    def render(self, request: server.Request) -> bytes | int:
        return self.owner.handle(request)


class _QuietSite(server.Site):
    def log(self, request: Any) -> None:  # Twisted's access log: not wanted
        pass


class SiteServer:
    """Serve ``root`` on ``port`` of every address in ``binds``; see the module docstring.

    :param root: directory to serve
    :param binds: local addresses to listen on, e.g. ``["127.0.0.1", "127.0.0.2"]``
    :param port: TCP port; 0 picks a free one (the same for every address)
    :param log_path: JSON-lines request log (appended, flushed per line); None: no log
    :param behaviour: initial :class:`Behaviour`
    :param reactor: Twisted reactor (default: the global one)
    """

    def __init__(
        self,
        root: Path,
        binds: list[str] | None = None,
        port: int = 0,
        log_path: Path | None = None,
        behaviour: Behaviour | None = None,
        reactor: Any = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.binds = binds or ["127.0.0.1"]
        self.port = port
        self.behaviour = behaviour or Behaviour()
        self.reactor: Any = reactor or _reactor
        self.in_flight: dict[str, int] = {}
        self.max_concurrent: dict[str, int] = {}
        self.requests = 0
        self._log: TextIO | None = None
        if log_path:
            self._log = open(log_path, "a", encoding="utf-8")  # closed in stop()
        self._ports: list[Any] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Listen on every address; return the base URLs (``http://ADDR:PORT/``)."""
        tcp = self.reactor
        site = _QuietSite(_Root(self))
        for addr in self.binds:
            listening: Any = tcp.listenTCP(self.port, site, interface=addr)
            self.port = listening.getHost().port  # port 0: reuse the picked one for the rest
            self._ports.append(listening)
        return [f"http://{addr}:{self.port}/" for addr in self.binds]

    def stop(self) -> None:
        for listening in self._ports:
            listening.stopListening()
        self._ports.clear()
        if self._log:
            self._log.close()
            self._log = None

    # -- requests ----------------------------------------------------------------------------

    def handle(self, request: server.Request) -> bytes | int:
        path = request.path.decode("utf-8", "replace")
        if path.startswith(CONTROL_PREFIX):
            return self._control(request, path)
        host_header = (request.getHeader("host") or "").strip()
        host = host_name(host_header)
        arrived = time.time()
        self.requests += 1
        concurrent = self.in_flight.get(host, 0) + 1
        self.in_flight[host] = concurrent
        self.max_concurrent[host] = max(self.max_concurrent.get(host, 0), concurrent)

        def finished(_: object) -> None:
            self.in_flight[host] -= 1

        request.notifyFinish().addBoth(finished)
        queued = self._queue_delay(host, path, arrived)
        status, headers, body = self._respond(host, path, {
            k.decode("latin-1").lower(): vs[0].decode("latin-1")
            for k, vs in request.requestHeaders.getAllRawHeaders()})
        self._write_log(
            {
                "t": round(arrived, 6),
                "host": host_header,
                "addr": request.getHost().host,
                "path": path,
                "status": status,
                "concurrent": concurrent,
                **({"version": headers["X-Testsite-Version"]}
                   if "X-Testsite-Version" in headers and status == 200 else {}),
                **({"held": round(queued, 6)} if queued is not None else {}),
            }
        )
        delay = max(self.behaviour.delay_for(host, path), queued or 0.0)
        if delay <= 0:
            return self._send(request, status, headers, body)
        self.reactor.callLater(delay, self._send_later, request, status, headers, body)
        return server.NOT_DONE_YET

    def _queue_delay(self, host: str, path: str, now: float) -> float | None:
        """Seconds a latency-mode capacity rule holds this request (None: no such rule)."""
        for cap in self.behaviour.capacity:
            if cap.latency is not None and _matches(cap.prefix, cap.host, host, path):
                return cap.queue_delay(now)
        return None

    def _respond(self, host: str, path: str, request_headers: dict[str, str] | None = None
                 ) -> tuple[int, dict[str, str], bytes]:
        """Decide the answer: (status, headers, body)."""
        for cap in self.behaviour.capacity:
            if cap.latency is None and _matches(cap.prefix, cap.host, host, path) \
                    and not cap.admit(time.time()):
                headers = {"Content-Type": "text/plain; charset=utf-8"}
                if cap.retry_after is not None:
                    headers["Retry-After"] = str(cap.retry_after)
                return cap.status, headers, b"over capacity\n"
        rule = self.behaviour.failure_for(host, path)
        if rule is not None:
            headers = {"Content-Type": "text/plain; charset=utf-8"}
            if rule.retry_after is not None:
                headers["Retry-After"] = str(rule.retry_after)
            return rule.status, headers, f"{rule.status} from the test site\n".encode()
        hops = _hop(path)
        if hops is not None:
            return 302, {"Location": hops, "Content-Type": "text/plain"}, b"redirect\n"
        changing = self.behaviour.changing
        if changing is not None and path.startswith(changing.prefix):
            return changing.respond(path, request_headers or {})
        if path == "/robots.txt":
            if host in self.behaviour.robots_status:
                status = self.behaviour.robots_status[host]
                return status, {"Content-Type": "text/plain"}, b"robots.txt unavailable\n"
            if host in self.behaviour.robots:
                body = self.behaviour.robots[host].encode()
                return 200, {"Content-Type": "text/plain; charset=utf-8"}, body
        target = (self.root / unquote(path).lstrip("/")).resolve()
        if not target.is_relative_to(self.root):
            return 404, {"Content-Type": "text/plain"}, b"not found\n"
        if target.is_dir():
            if not path.endswith("/"):
                return 301, {"Location": path + "/"}, b""
            target = target / "index.html"
        if not target.is_file():
            return 404, {"Content-Type": "text/plain"}, b"not found\n"
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if ctype.startswith("text/"):
            ctype += "; charset=utf-8"
        return 200, {"Content-Type": ctype}, target.read_bytes()

    def _send(self, request: server.Request, status: int, headers: dict[str, str], body: bytes):
        request.setResponseCode(status)
        for name, value in headers.items():
            request.setHeader(name, value)
        return body

    def _send_later(self, request: server.Request, status, headers, body) -> None:
        if request.finished or request.channel is None:  # client went away meanwhile
            return
        request.write(self._send(request, status, headers, body))
        request.finish()

    def _control(self, request: server.Request, path: str) -> bytes:
        request.setHeader("Content-Type", "application/json")
        if path == CONTROL_PREFIX + "stats":
            return json.dumps(
                {"requests": self.requests, "max_concurrent": self.max_concurrent}
            ).encode()
        if path == CONTROL_PREFIX + "config" and request.method in (b"PUT", b"POST"):
            raw = request.content.read() if request.content else b""
            try:
                self.behaviour = Behaviour.from_dict(json.loads(raw or b"{}"))
            except (ValueError, TypeError) as exc:
                request.setResponseCode(400)
                return json.dumps({"error": str(exc)}).encode()
            return b'{"ok": true}'
        if path == CONTROL_PREFIX + "changes" and self.behaviour.changing is not None:
            return json.dumps(self.behaviour.changing.truth()).encode()
        request.setResponseCode(404)
        return b'{"error": "unknown control path"}'

    def _write_log(self, record: dict[str, Any]) -> None:
        if self._log:
            self._log.write(json.dumps(record) + "\n")
            self._log.flush()
