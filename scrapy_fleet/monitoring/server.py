"""``scrapy fleet monitor SPIDER --port P``: one HTTP process for the whole fleet.

Routes (all GET; standard library ``ThreadingHTTPServer``, one thread per request):

    /                    the dashboard (static/dashboard.html + .js + .css; no CDN, nothing
                         fetched from elsewhere): depth and pages/min over time, workers,
                         hosts, alerts; refreshes itself every ``refresh`` seconds
    /metrics             Prometheus text exposition (metrics.FleetCollector: one snapshot
                         per scrape)
    /api/snapshot        the snapshot as JSON (the stable JSON of ``scrapy fleet status
                         --json``); 503 {"error", "error_since", "last_snapshot"} while
                         Redis cannot be read
    /api/series?name=A[,B...][&name=C]&tier=10s[&since=UNIX_S]
                         {"tier", "step_s", "series": {name: [[unix_s, value|null], ...]}};
                         400 for an unknown name or tier, 503 while Redis cannot be read
    /healthz             "ok" while the process serves (Redis state: /metrics scrapy_fleet_up)

Every reply is built from the data side's read API (``monitoring.snapshot``); this module
keeps nothing but the last good snapshot (for the error reply) and an error counter.
"""

from __future__ import annotations

import html
import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scrapy_fleet.monitoring import metrics
from scrapy_fleet.monitoring.source import READ_ERRORS, VIEW_SERIES, Source

STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".html": "text/html; charset=utf-8", ".png": "image/png"}
#: the fewest seconds between two dashboard refreshes
MIN_REFRESH = 0.5


def _static(name: str) -> bytes:
    return resources.files("scrapy_fleet.monitoring").joinpath("static", name).read_bytes()


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class MonitorState:
    """What the handler threads share: the source, the metrics registry, the dashboard's
    settings and the last good snapshot."""

    def __init__(self, source: Source, crawl_id: str, refresh: float = 2.0,
                 host_metrics: int = 0, tiers: dict[str, tuple[int, int]] | None = None
                 ) -> None:
        self.source = source
        self.crawl_id = crawl_id
        self.refresh = max(MIN_REFRESH, float(refresh))
        self.registry = metrics.registry(source, host_metrics)
        self.tiers = tiers if tiers is not None else dict(getattr(source, "tiers", {}))
        self.last_snapshot: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def error_reply(self, exc: BaseException) -> dict[str, Any]:
        with self._lock:
            last = self.last_snapshot
        return {"error": f"cannot read Redis: {type(exc).__name__}: {exc}",
                "error_since": getattr(self.source, "error_since", None),
                "last_snapshot": last}

    def snapshot(self) -> dict[str, Any]:
        snap = self.source.snapshot()
        with self._lock:
            self.last_snapshot = snap
        return snap


class Handler(BaseHTTPRequestHandler):
    server_version = "scrapy-fleet-monitor"
    state: MonitorState  # set on the subclass by make_server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape would flood the terminal

    def _send(self, status: int, body: bytes, content_type: str,
              cache: str = "no-store") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        body = json.dumps(_json_safe(payload), sort_keys=True).encode()
        self._send(status, body, "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        try:
            if path == "/":
                self._dashboard()
            elif path == "/metrics":
                self._send(200, generate_latest(self.state.registry), CONTENT_TYPE_LATEST)
            elif path == "/api/snapshot":
                self._snapshot()
            elif path == "/api/series":
                self._series(parse_qs(url.query))
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path.startswith("/static/") and "/" not in path[len("/static/"):]:
                name = path[len("/static/"):]
                ext = name[name.rfind("."):] if "." in name else ""
                try:
                    body = _static(name)
                except (FileNotFoundError, IsADirectoryError):
                    body = b""
                if body and ext in STATIC_TYPES:
                    self._send(200, body, STATIC_TYPES[ext], cache="max-age=60")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    def _dashboard(self) -> None:
        page = _static("dashboard.html").decode()
        page = (page.replace("{{crawl}}", html.escape(self.state.crawl_id))
                .replace("{{refresh_ms}}", str(int(self.state.refresh * 1000)))
                .replace("{{tiers}}", html.escape(",".join(self.state.tiers) or "10s")))
        self._send(200, page.encode(), STATIC_TYPES[".html"])

    def _snapshot(self) -> None:
        try:
            snap = self.state.snapshot()
        except READ_ERRORS as exc:
            self._json(503, self.state.error_reply(exc))
            return
        self._json(200, snap)

    def _series(self, query: dict[str, list[str]]) -> None:
        names = [n for value in query.get("name", []) for n in value.split(",") if n]
        tier = (query.get("tier") or ["10s"])[-1]
        since: float | None = None
        if query.get("since"):
            try:
                since = float(query["since"][-1])
            except ValueError:
                self._json(400, {"error": "since must be a number of unix seconds"})
                return
        try:
            data = self.state.source.series(names or list(VIEW_SERIES), tier, since)
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
            return
        except READ_ERRORS as exc:
            self._json(503, self.state.error_reply(exc))
            return
        step = self.state.tiers.get(tier, (None, None))[0]
        self._json(200, {"tier": tier, "step_s": step,
                         "series": {k: [list(p) for p in v] for k, v in data.items()}})


def make_server(state: MonitorState, host: str = "127.0.0.1", port: int = 0
                ) -> ThreadingHTTPServer:
    """Bind (``port`` 0: a free one; see ``server.server_address``); raises OSError when the
    address cannot be bound."""
    handler = type("FleetHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def run_monitor(source: Source, crawl_id: str, host: str, port: int, refresh: float,
                host_metrics: int) -> int:
    """Serve until Ctrl-C (exit 0) or SIGTERM; returns the exit status (2: cannot bind)."""
    state = MonitorState(source, crawl_id, refresh=refresh, host_metrics=host_metrics)
    try:
        server = make_server(state, host, port)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    bound_host, bound_port = (str(part) for part in server.server_address[:2])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"monitoring crawl {crawl_id!r}: dashboard http://{shown}:{bound_port}/ , metrics "
          f"http://{shown}:{bound_port}/metrics (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
