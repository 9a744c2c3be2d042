"""A test site that judges by client address: the egress address the proxy binds.

Run as ``python tests/proxysite.py --config FILE.json --log FILE --bind 127.0.0.1 --bind
127.0.0.20`` (one port for every address; prints ``http://ADDR:PORT/`` per address, then
serves until killed).  Each host name (the ``Host`` header without port) has its own pages:
``/site/`` links to ``/site/p/0.html`` ... ``/site/p/<N-1>.html``; every page shows the
client address in ``<p id="addr">``.  Config (JSON)::

    {"pages": {"127.0.0.1": 60},
     "ban": [{"host": "127.0.0.1", "addr": "127.0.0.4", "every": 1, "kind": "status",
              "until": null, "prefix": "/"}],
     "limit": [{"host": null, "addr": "127.0.0.2", "first": 1, "retry_after": 3}],
     "delay": [{"host": null, "addr": "127.0.0.3", "after": 0, "seconds": 1.0}]}

* ban: the every-th matching request (counted per rule) is refused: ``kind`` "status" (403)
  or "challenge" (a 200 challenge page, ``<title>Just a moment...</title>``); ``until``
  (epoch seconds) ends the rule, ``first`` K limits it to the first K matching requests;
  null host/addr match any;
* limit: the first K matching requests answer 429 with ``Retry-After``;
* redirects: true: every page links to ``/go/<n>``, a 301 to ``/site/``;
* delay: hold matching answers (arriving after the epoch ``after``) that long.

Every request is logged as one JSON line ``{"t", "host", "addr", "path", "status", "ban",
"ticket"}`` (``t``: arrival, epoch seconds; ``ban``: 1 for a ban of any kind; ``ticket``: the
header ``X-Fleet-Test-Ticket`` as an int, or null: the fleet's choice of the exit, sent by
the test project's ``ProxyTicketHeaderMiddleware``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHALLENGE = (b"<html><head><title>Just a moment...</title></head><body>"
             b"<div id='challenge-platform'>checking your browser</div></body></html>")


class Site:
    def __init__(self, config: dict[str, Any], log_path: str) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.counts: dict[int, int] = {}
        self.log = open(log_path, "a", encoding="utf-8")

    @staticmethod
    def _match(rule: dict[str, Any], host: str, addr: str, path: str) -> bool:
        return ((rule.get("host") in (None, host)) and (rule.get("addr") in (None, addr))
                and path.startswith(rule.get("prefix", "/")))

    def answer(self, host: str, addr: str, path: str) -> tuple[int, dict[str, str], bytes,
                                                               int, float]:
        now = time.time()
        delay = 0.0
        for rule in self.config.get("delay", []):
            if self._match(rule, host, addr, path) and now >= rule.get("after", 0):
                delay = max(delay, float(rule["seconds"]))
        with self.lock:
            for n, rule in enumerate(self.config.get("limit", [])):
                if self._match(rule, host, addr, path):
                    key = 1000 + n
                    self.counts[key] = self.counts.get(key, 0) + 1
                    if self.counts[key] <= rule.get("first", 1):
                        return 429, {"Retry-After": str(rule["retry_after"])}, b"slow down", 0, \
                            delay
            for n, rule in enumerate(self.config.get("ban", [])):
                if not self._match(rule, host, addr, path):
                    continue
                if rule.get("until") is not None and now >= rule["until"]:
                    continue
                self.counts[n] = self.counts.get(n, 0) + 1
                if rule.get("first") is not None and self.counts[n] > rule["first"]:
                    continue
                if self.counts[n] % int(rule.get("every", 1)) == 0:
                    if rule.get("kind", "status") == "challenge":
                        return 200, {}, CHALLENGE, 1, delay
                    return 403, {}, b"<html><body>forbidden</body></html>", 1, delay
        pages = int(self.config.get("pages", {}).get(host, 0))
        if path.startswith("/go/"):  # a redirect back to the index (a duplicate by then)
            return 301, {"Location": "/site/"}, b"moved", 0, delay
        if path == "/site/":
            links = "".join(f'<a href="/site/p/{i}.html">{i}</a>\n' for i in range(pages))
            body = f'<html><body><p id="addr">{addr}</p>{links}</body></html>'
            return 200, {}, body.encode(), 0, delay
        if path.startswith("/site/p/") and path.endswith(".html"):
            num = path[len("/site/p/"):-len(".html")]
            if num.isdigit() and int(num) < pages:
                link = f'<a href="/go/{num}">again</a>' if self.config.get("redirects") else ""
                body = f'<html><head><title>p{num}</title></head><body><p id="addr">{addr}</p>' \
                       f"{link}</body></html>"
                return 200, {}, body.encode(), 0, delay
        return 404, {}, b"not found", 0, delay

    def record(self, **fields: Any) -> None:
        with self.lock:
            self.log.write(json.dumps(fields) + "\n")
            self.log.flush()


def handler(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            t = time.time()
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
            path = self.path
            if "://" in path:  # absolute form (a proxy passing it on as is)
                path = "/" + path.split("://", 1)[1].split("/", 1)[-1]
            path = path.split("?", 1)[0]
            addr = self.client_address[0]
            status, headers, body, ban, delay = site.answer(host, addr, path)
            ticket = self.headers.get("X-Fleet-Test-Ticket")
            site.record(t=t, host=host, addr=addr, path=path, status=status, ban=ban,
                        ticket=int(ticket) if ticket and ticket.isdigit() else None)
            if delay:
                time.sleep(delay)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--port", type=int, default=0)
    opts = parser.parse_args()
    with open(opts.config, encoding="utf-8") as fh:
        site = Site(json.load(fh), opts.log)
    port = opts.port
    servers = []
    for addr in opts.bind or ["127.0.0.1"]:
        srv = ThreadingHTTPServer((addr, port), handler(site))
        srv.daemon_threads = True
        port = srv.server_address[1]
        servers.append(srv)
        print(f"http://{addr}:{port}/", flush=True)
    for srv in servers[1:]:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        servers[0].serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
