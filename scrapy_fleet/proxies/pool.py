"""The Redis client of ``lua/proxies.lua``: one pool of exits shared by the fleet.

A proxy is identified by its whole URL, credentials included: two accounts on one gateway
(same host:port) are two exits.  Output never shows the URL: :func:`describe` gives a stable
short id (the first 12 hex digits of the URL's SHA-256) and ``host:port``.

Every call is one EVALSHA (a choice carries the reports gathered since the previous call);
no call is retried (see the script's header).  Times are the Redis server's.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import msgpack

from scrapy_fleet import lua
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.proxies.settings import ProxyConfig

#: verdict -> its short code in lua/proxies.lua
VERDICT_CODES = {"ok": "ok", "ban": "ban", "rate_limited": "rl", "proxy_dead": "dead",
                 "site_error": "serr", "release": "rel"}
#: the per (exit, site) fields, in the order lua/proxies.lua stores them
SITE_FIELDS = ("ok", "ban", "rate_limited", "proxy_dead", "site_error", "responses",
               "last_ms", "cooldown_until_ms", "penalty", "probe", "first_ban_ms", "last_ticket")
EXIT_STATUS = {"a": "active", "d": "draining", "x": "dead"}


def proxy_id(url: str) -> str:
    """Stable short id of a proxy URL (SHA-256 of the whole URL, 12 hex digits)."""
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def host_port(url: str) -> str:
    """``host:port`` of a proxy URL, without credentials."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.hostname or '?'}:{port or '?'}"


def describe(url: str) -> str:
    """A proxy as logs, stats and errors show it: ``"<id> host:port"``, never credentials."""
    return f"{proxy_id(url)} {host_port(url)}"


@dataclass
class Report:
    """The verdict on one request carried by an exit (ticket from its :class:`Choice`)."""

    ticket: int
    exit_id: str
    site: str
    verdict: str  # a key of VERDICT_CODES ("release": no verdict, the slot is freed)
    had_response: bool
    jitter: float = field(default_factory=random.random)  # full jitter of the cool-down


@dataclass(frozen=True)
class Choice:
    """An exit for one request: its id, URL (with credentials: do not log), ticket, and
    ``kind`` 0 plain, 1 the fleet's one probe of a (exit, site) whose cool-down ended, 2 the
    re-check of a dead exit; ``rebound``: the exit a sticky session was bound to before."""

    exit_id: str
    url: str
    ticket: int
    kind: int
    rebound: str


@dataclass(frozen=True)
class Wait:
    """No exit may carry the request now: try again in ``seconds`` (fail closed)."""

    seconds: float
    why: str  # empty, cooling, probe, caps, dead


@dataclass(frozen=True)
class Gone:
    """The exit a fleet session is bound to can no longer carry its requests to the site:
    ``reason`` ``exit_banned``, ``exit_dead`` or ``exit_drained`` (lua/proxies.lua, choose
    with ``only``)."""

    reason: str


def _decode(reply: Any) -> dict[str, Any]:
    decoded = msgpack.unpackb(reply, raw=False)
    return decoded if isinstance(decoded, dict) else {}


class _Calls:
    """Argument building shared by the asyncio and blocking clients."""

    def __init__(self, keys: ProxyPoolKeys, config: ProxyConfig) -> None:
        self.keys = keys
        self.config = config
        self._fixed = keys.script_keys()

    def _params(self) -> dict[str, Any]:
        c = self.config
        return {"base": int(c.cooldown_base * 1000), "cap": int(c.cooldown_max * 1000),
                "dead_after": c.dead_after, "recheck": int(c.dead_recheck * 1000)}

    def _report_args(self, reports: list[Report], keys: list[str]) -> list[dict[str, Any]]:
        out = []
        for r in reports:
            key = self.keys.site(r.site)
            if key not in keys:
                keys.append(key)
            out.append({"t": r.ticket, "id": r.exit_id, "sk": keys.index(key) + 1,
                        "v": VERDICT_CODES[r.verdict], "r": 1 if r.had_response else 0,
                        "j": r.jitter})
        return out

    def choose_args(self, site: str, session: str | None, reports: list[Report],
                    exclude: list[str] | None = None,
                    only: str | None = None) -> tuple[list[str], list[bytes]]:
        keys = [*self._fixed, self.keys.site(site), self.keys.order(site)]
        arg: dict[str, Any] = {"op": "choose", "site": site, "sk": len(keys) - 1,
                               "ok": len(keys), "ss": 0,
                               "sttl": int(self.config.session_ttl * 1000),
                               "rate": int(1000 / self.config.rate) if self.config.rate else 0,
                               "conc": self.config.concurrency,
                               "ttl": int(self.config.ticket_ttl * 1000),
                               "ex": list(exclude or []), **self._params()}
        if only:
            arg["only"] = only
        if session is not None:
            keys.append(self.keys.session(session))
            arg["ss"] = len(keys)
        arg["rep"] = self._report_args(reports, keys)
        return keys, [msgpack.packb(arg, use_bin_type=False)]

    def report_args(self, reports: list[Report]) -> tuple[list[str], list[bytes]]:
        keys = list(self._fixed)
        arg = {"op": "report", **self._params(), "rep": self._report_args(reports, keys)}
        return keys, [msgpack.packb(arg, use_bin_type=False)]

    @staticmethod
    def choice(reply: Any) -> Choice | Wait | Gone:
        d = _decode(reply)
        if "gone" in d:
            return Gone(str(d["gone"]))
        if "wait" in d:
            return Wait(float(d["wait"]) / 1000, str(d.get("why", "")))
        return Choice(str(d["id"]), str(d["url"]), int(d["t"]), int(d.get("kind", 0)),
                      str(d.get("rebound") or ""))


class ProxyPool:
    """The pool as a worker uses it (redis.asyncio client).

    Raises:
        redis.RedisError, OSError: from any call when Redis fails (the caller fails closed).
    """

    def __init__(self, client: Any, keys: ProxyPoolKeys, config: ProxyConfig) -> None:
        self.client = client
        self.keys = keys
        self._calls = _Calls(keys, config)
        self._script = lua.load(client, "proxies.lua")
        #: EVALSHA calls made (the bench and the stats read it)
        self.calls = 0

    async def _run(self, keys: list[str], args: list[bytes]) -> Any:
        self.calls += 1
        return await self._script(keys=keys, args=args)

    async def seed(self, urls: tuple[str, ...] | list[str]) -> int:
        """Add *urls* that are not in the pool (nor removed by a command); returns how many."""
        if not urls:
            return 0
        arg = {"op": "seed", "add": [[proxy_id(u), u] for u in urls], "force": 0}
        reply = await self._run(self.keys.script_keys(), [msgpack.packb(arg, use_bin_type=False)])
        return int(_decode(reply).get("added", 0))

    async def choose(self, site: str, session: str | None = None,
                     reports: list[Report] | None = None,
                     exclude: list[str] | None = None,
                     only: str | None = None) -> Choice | Wait | Gone:
        """Choose an exit for a request to *site*, applying *reports* first (one call);
        exits in *exclude* (those that banned or failed the request) only if no other may;
        with *only* (a fleet session's bound exit), that exit, a :class:`Wait` for its caps,
        or :class:`Gone` when it can no longer carry requests to *site*."""
        keys, args = self._calls.choose_args(site, session, reports or [], exclude, only)
        return self._calls.choice(await self._run(keys, args))

    async def report(self, reports: list[Report]) -> None:
        """Apply *reports* (one call)."""
        if reports:
            keys, args = self._calls.report_args(reports)
            await self._run(keys, args)


class PoolAdmin:
    """The pool as the commands see it (blocking redis-py client)."""

    def __init__(self, client: Any, keys: ProxyPoolKeys, config: ProxyConfig) -> None:
        self.client = client
        self.keys = keys
        self.config = config
        self._script = lua.load(client, "proxies.lua")

    def _op(self, arg: dict[str, Any], extra_keys: list[str] | None = None) -> dict[str, Any]:
        keys = [*self.keys.script_keys(), *(extra_keys or [])]
        return _decode(self._script(keys=keys, args=[msgpack.packb(arg, use_bin_type=False)]))

    def urls(self) -> dict[str, str]:
        """id -> URL of every exit (URLs include credentials: do not print them)."""
        raw = self.client.hgetall(self.keys.proxies)
        return {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}

    def resolve(self, spec: str) -> list[str]:
        """Exit ids meant by *spec*: an id (or a unique prefix of one, >= 4 digits), a whole
        proxy URL, or ``host:port`` (every exit on that address)."""
        urls = self.urls()
        if spec in urls:
            return [spec]
        if "://" in spec:
            pid = proxy_id(spec)
            return [pid] if pid in urls else []
        by_addr = [i for i, u in urls.items() if host_port(u) == spec]
        if by_addr:
            return sorted(by_addr)
        prefixed = [i for i in urls if len(spec) >= 4 and i.startswith(spec)]
        return prefixed if len(prefixed) == 1 else []

    def add(self, urls: list[str], force: bool = True) -> int:
        order_keys = [self.keys.order(s) for s in self.sites()]
        n = len(self.keys.script_keys())
        arg = {"op": "seed", "add": [[proxy_id(u), u] for u in urls], "force": 1 if force else 0,
               "oks": [n + i + 1 for i in range(len(order_keys))]}
        return int(self._op(arg, order_keys).get("added", 0))

    def remove(self, ids: list[str]) -> int:
        return int(self._op({"op": "remove", "ids": ids}).get("changed", 0))

    def drain(self, ids: list[str]) -> int:
        return int(self._op({"op": "drain", "ids": ids}).get("changed", 0))

    def sites(self) -> list[str]:
        return sorted(k.decode("utf-8", "replace") for k in self.client.hkeys(self.keys.sites))

    def reset(self, ids: list[str], sites: list[str] | None = None) -> int:
        """Forget the state of *ids* (all exits when empty) on *sites* (all when None):
        cool-downs, penalties, counters, and the dead mark."""
        chosen = self.sites() if sites is None else sites
        extra = [self.keys.site(s) for s in chosen] + [self.keys.order(s) for s in chosen]
        n, m = len(self.keys.script_keys()), len(chosen)
        return int(self._op({"op": "reset", "ids": ids,
                             "sks": [n + i + 1 for i in range(m)],
                             "oks": [n + m + i + 1 for i in range(m)]},
                            extra).get("changed", 0))

    def snapshot(self) -> dict[str, Any]:
        """The pool's health, as ``proxies list --json`` prints it (docs/proxies.md)."""
        now_s, now_us = self.client.time()
        now = int(now_s) * 1000 + int(now_us) // 1000
        urls = self.urls()
        ids = sorted(urls)
        def fields(key: str) -> dict[str, Any]:
            return dict(zip(ids, self.client.hmget(key, ids), strict=True)) if ids else {}

        exits_raw = fields(self.keys.exits)
        live = fields(self.keys.live)
        sites = self.sites()
        per_site = {s: fields(self.keys.site(s)) for s in sites}
        stats = {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.stats).items()
                 if v.lstrip(b"-").isdigit()}
        exits: list[dict[str, Any]] = []
        site_totals: dict[str, dict[str, int]] = {}
        for pid in ids:
            raw = (exits_raw.get(pid) or b"a|0|0|0").decode().split("|")
            status = EXIT_STATUS.get(raw[0], raw[0])
            dead_until = int(raw[2] or 0) if len(raw) > 2 else 0
            totals = dict.fromkeys(("ok", "ban", "rate_limited", "proxy_dead", "site_error",
                                    "responses"), 0)
            rows = []
            for s in sites:
                value = per_site[s].get(pid)
                if not value:
                    continue
                nums = [int(float(x or 0)) for x in value.decode().split("|")]
                nums = (nums + [0] * len(SITE_FIELDS))[:len(SITE_FIELDS)]
                st = dict(zip(SITE_FIELDS, nums, strict=True))
                until = st["cooldown_until_ms"]
                state = "ok"
                if until > now:
                    state = "cooling"
                elif until > 0:
                    state = "probe_due" if not st["probe"] else "probing"
                row = {"site": s, "state": state,
                       "cooldown_left_s": round(max(0, until - now) / 1000, 3),
                       "last_used_s_ago": None if not st["last_ms"] else
                       round((now - st["last_ms"]) / 1000, 3),
                       "first_ban_ms": st["first_ban_ms"] or None,
                       "penalty": st["penalty"]}
                for k in totals:
                    row[k] = st[k]
                    totals[k] += st[k]
                    site_totals.setdefault(s, dict.fromkeys(totals, 0))[k] += st[k]
                row["block_rate"] = _rate(st["ban"], st["responses"])
                rows.append(row)
            exits.append({"id": pid, "address": host_port(urls[pid]), "status": status,
                          "dead_recheck_in_s": round(max(0, dead_until - now) / 1000, 3)
                          if status == "dead" else None,
                          "in_flight": int(live.get(pid) or 0), **totals,
                          "block_rate": _rate(totals["ban"], totals["responses"]),
                          "sites": rows})
        bans = sum(e["ban"] for e in exits)
        responses = sum(e["responses"] for e in exits)
        return {"pool": self.keys.pool, "now_ms": now, "exits": exits,
                "sites": {s: {**t, "block_rate": _rate(t["ban"], t["responses"])}
                          for s, t in sorted(site_totals.items())},
                "totals": {"bans": bans, "responses": responses,
                           "block_rate": _rate(bans, responses), "counters": stats}}


def _rate(bans: int, responses: int) -> float | None:
    return None if responses == 0 else round(bans / responses, 6)
