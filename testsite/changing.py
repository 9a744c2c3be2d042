"""A changing site for the recrawl (docs/recrawl.md, bench/bench_freshness.py): pages whose
content changes by Poisson processes of known rates, most of them never, with validators.

Configured in the server's behaviour (testsite/server.py) as ``"changing"``::

    {"prefix": "/changing/", "pages": 100, "static_share": 0.6, "rate_min": 0.001,
     "rate_max": 0.1, "seed": 1, "periods": {"7": 2.5}}

Page ``i`` (``<prefix><i>.html``, 0 <= i < pages; ``<prefix>`` itself links to all) never
changes when it is among the first ``static_share`` of a seeded shuffle; the others change at
rate ``rate_i`` (changes per second, log-uniform in [rate_min, rate_max]), at the times of a
seeded Poisson process counted from the server's start; ``periods`` maps a page to a fixed
period instead (a change every so many seconds: deterministic, for tests).  A page's body
is a paragraph of words drawn from (i, version), plus noise that must not count as a change
(the time of the answer and a random token); ``"kind": "price"`` makes it a product whose
only change is its price (``<p class="price">12.35</p>``: a number), ``"kind": "edit"`` a
500-word article whose versions differ in one sentence.  It answers with ``ETag:
"<i>-<version>"`` and ``Last-Modified`` (the version's start), and 304 without a body to a
matching ``If-None-Match`` (or, without one, an ``If-Modified-Since`` not older than the
version); ``"validators": false`` sends neither (as many dynamic pages: every revisit is a
200).  Every answer carries ``X-Testsite-Version: <i>-<version>`` (logged by the server: the
versions served).
``GET /_testsite/changes`` returns the truth: ``{"start": t0, "pages": {path: {"rate": r,
"changes": [t...]}}}`` (times in seconds, ``time.time()``, up to now).
"""

from __future__ import annotations

import math
import random
import secrets
import time
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

_WORDS = ("river stone market garden winter paper window signal orange harbor violet engine "
          "forest copper lantern meadow silver thunder canvas island velvet marble falcon "
          "ember quartz willow saddle anchor prism tundra cobalt glacier mosaic").split()


class ChangingPages:
    """The changing pages of one server (module docstring)."""

    def __init__(self, spec: dict[str, Any], start: float | None = None) -> None:
        self.prefix = str(spec.get("prefix", "/changing/"))
        self.pages = int(spec.get("pages", 100))
        self.start = time.time() if start is None else start
        seed = int(spec.get("seed", 1))
        rnd = random.Random(seed)
        order = list(range(self.pages))
        rnd.shuffle(order)
        n_static = round(self.pages * float(spec.get("static_share", 0.6)))
        lo, hi = float(spec.get("rate_min", 0.001)), float(spec.get("rate_max", 0.1))
        self.rates = [0.0] * self.pages
        for i in order[n_static:]:
            self.rates[i] = math.exp(rnd.uniform(math.log(lo), math.log(hi)))
        self.periods = {int(k): float(v) for k, v in (spec.get("periods") or {}).items()}
        self.kind = str(spec.get("kind", "words"))
        self.validators = bool(spec.get("validators", True))
        for i in self.periods:
            self.rates[i] = 1.0 / self.periods[i]
        self._rnd = [random.Random(seed * 1_000_003 + i) for i in range(self.pages)]
        self._changes: list[list[float]] = [[] for _ in range(self.pages)]
        self._next = [self._draw(i, self.start) for i in range(self.pages)]

    def _draw(self, i: int, after: float) -> float:
        if i in self.periods:
            return after + self.periods[i]
        if self.rates[i] <= 0:
            return math.inf
        return after + self._rnd[i].expovariate(self.rates[i])

    def _advance(self, i: int, now: float) -> None:
        while self._next[i] <= now:
            at = self._next[i]
            self._changes[i].append(at)
            self._next[i] = self._draw(i, at)

    def version(self, i: int, now: float) -> tuple[int, float]:
        """(version number, its start time) of page *i* at *now*."""
        self._advance(i, now)
        changes = self._changes[i]
        return len(changes), (changes[-1] if changes else self.start)

    def page_of(self, path: str) -> int | None:
        rest = path[len(self.prefix):]
        if not path.startswith(self.prefix) or not rest.endswith(".html"):
            return None
        try:
            i = int(rest[:-5])
        except ValueError:
            return None
        return i if 0 <= i < self.pages else None

    def respond(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        now = time.time()
        if path == self.prefix:
            links = "".join(f'<li><a href="{i}.html">page {i}</a></li>'
                            for i in range(self.pages))
            body = f"<html><body><h1>changing</h1><ul>{links}</ul></body></html>"
            return 200, {"Content-Type": "text/html; charset=utf-8"}, body.encode()
        i = self.page_of(path)
        if i is None:
            return 404, {"Content-Type": "text/plain"}, b"not found\n"
        version, since = self.version(i, now)
        etag = f'"{i}-{version}"'
        last_modified = formatdate(since, usegmt=True)
        validators = {"ETag": etag, "Last-Modified": last_modified} if self.validators else {}
        validators["X-Testsite-Version"] = f"{i}-{version}"
        inm = headers.get("if-none-match") if self.validators else None
        ims = headers.get("if-modified-since") if self.validators else None
        if inm is not None:
            if etag in [t.strip() for t in inm.split(",")] or inm.strip() == "*":
                return 304, validators, b""
        elif ims is not None:
            try:
                if parsedate_to_datetime(ims).timestamp() >= math.floor(since):
                    return 304, validators, b""
            except (TypeError, ValueError):
                pass
        body = (f"<html><head><title>page {i}</title></head><body><h1>page {i}</h1>"
                f"{self._content(i, version)}<p class='noise'>served at {now:.6f} token "
                f"{secrets.token_hex(8)}</p></body></html>")
        return 200, {"Content-Type": "text/html; charset=utf-8", **validators}, body.encode()

    def _content(self, i: int, version: int) -> str:
        if self.kind == "price":  # the words never change, the price at every version
            words = random.Random(i * 7919)
            name = " ".join(words.choice(_WORDS) for _ in range(12))
            cents = 1000 + i * 100 + version * 7
            return f"<p>{name}</p><p class='price'>{cents // 100}.{cents % 100:02d}</p>"
        if self.kind == "edit":  # 25 sentences of 20 words; a version edits one of them
            words = random.Random(i * 7919)
            sentences = [" ".join(words.choice(_WORDS) for _ in range(20)) for _ in range(25)]
            if version:
                edit = random.Random(i * 7919 + version * 104729)
                sentences[version % 25] = " ".join(edit.choice(_WORDS) for _ in range(20))
            return "<p>" + ". ".join(sentences) + ".</p>"
        words = random.Random(i * 7919 + version * 104729)
        return "<p>" + " ".join(words.choice(_WORDS) for _ in range(60)) + "</p>"

    def truth(self) -> dict[str, Any]:
        now = time.time()
        pages = {}
        for i in range(self.pages):
            self._advance(i, now)
            pages[f"{self.prefix}{i}.html"] = {"rate": self.rates[i],
                                                "changes": list(self._changes[i])}
        return {"start": self.start, "now": now, "pages": pages}
