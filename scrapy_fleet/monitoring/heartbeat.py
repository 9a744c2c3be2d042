"""A worker's part of the cockpit: its heartbeat and its deltas of the fleet-wide counters.

:class:`WorkerMonitor` builds ARGV[2] of the worker's next frontier call (lua/monitoring.lua):
the worker's state and figures, and what selected Scrapy stats of this worker grew by since
the last batch Redis confirmed.  The worker's own Scrapy stats are only read, never changed.

Exactness: a batch of deltas carries a sequence number; the frontier's op id makes a retried
call run once, and a batch resent after a call that failed for good carries the same number
(and the same deltas), which the script skips when it applied it already.  So each stat
increment of a worker is added to the fleet's counters exactly once (as long as the worker's
heartbeat key lives: FLEET_WORKER_FORGET_AFTER).

Stats read (docs/monitoring.md has the counter each one feeds)::

    downloader/response_status_count/NNN   -> resp/NNN, pages (+ bans, rate_limited)
    item_scraped_count, item_dropped_count -> items_scraped, items_dropped
    fleet/items/failed                     -> items_failed (an item pipeline raised)
    downloader/exception_type_count/CLASS  -> errors/KIND (timeout, dns, connection, tls, other;
                                              not scrapy.exceptions.IgnoreRequest: a
                                              middleware's decision, not a download error)
    offsite/filtered                       -> errors/offsite (requests OffsiteMiddleware
                                              filtered; the "errors/" prefix is the one
                                              lua/monitoring.lua accepts for a new field)
    downloader/response_bytes              -> response_bytes
    fleet/proxy/verdict/ban                -> proxy_bans
    fleet/politeness/robots_disallowed     -> robots_denied
    fleet/recrawl/{not_modified,unchanged,changed,gone} -> revisit_* (docs/recrawl.md)
"""

from __future__ import annotations

from typing import Any

import msgpack
import scrapy

import scrapy_fleet

_STATUS = "downloader/response_status_count/"
_EXC = "downloader/exception_type_count/"
#: a downloader middleware's refusal (offsite, robots.txt...), counted where it is decided
_DECISIONS = frozenset({"scrapy.exceptions.IgnoreRequest"})
#: the fleet counter of Scrapy's ``offsite/filtered`` (its stats-hash field)
OFFSITE_FIELD = "errors/offsite"
_PLAIN = {
    "item_scraped_count": "items_scraped",
    "item_dropped_count": "items_dropped",
    "fleet/items/failed": "items_failed",
    "downloader/response_bytes": "response_bytes",
    "fleet/proxy/verdict/ban": "proxy_bans",
    "fleet/politeness/robots_disallowed": "robots_denied",
    # recrawl (issue 22): outcomes of revisits (recrawl/middleware.py)
    "fleet/recrawl/not_modified": "revisit_not_modified",
    "fleet/recrawl/unchanged": "revisit_unchanged",
    "fleet/recrawl/changed": "revisit_changed",
    "fleet/recrawl/gone": "revisit_gone",
}
#: exception class name (last part of its path) -> error kind
_KINDS = {
    "TimeoutError": "timeout", "TCPTimedOutError": "timeout", "UserTimeoutError": "timeout",
    "DNSLookupError": "dns",
    "ConnectionRefusedError": "connection", "ConnectError": "connection",
    "ConnectionDone": "connection", "ConnectionLost": "connection",
    "ConnectionAborted": "connection", "ResponseFailed": "connection",
    "ResponseNeverReceived": "connection", "NoRouteError": "connection",
    "TunnelError": "connection", "PotentialDataLoss": "connection",
    "SSLError": "tls", "Error": "other",
    # Scrapy 2.19's own download exceptions (scrapy.exceptions)
    "DownloadTimeoutError": "timeout", "CannotResolveHostError": "dns",
    "DownloadConnectionRefusedError": "connection", "DownloadFailedError": "connection",
    "DownloadCancelledError": "connection",
}


def error_kind(exc_path: str) -> str:
    """``twisted.internet.error.DNSLookupError`` -> ``dns`` (timeout, dns, connection, tls,
    other)."""
    name = exc_path.rsplit(".", 1)[-1]
    if name == "Error" and "SSL" in exc_path:
        return "tls"
    return _KINDS.get(name, "other")


def fleet_counters(stats: dict[str, Any], ban_statuses: tuple[int, ...]) -> dict[str, int]:
    """The fleet counters a worker's Scrapy stats amount to (cumulative, this worker)."""
    out: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        out[name] = out.get(name, 0) + n

    for key, value in stats.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key.startswith(_STATUS):
            code = key[len(_STATUS):]
            if len(code) == 3 and code.isdigit():
                add("resp/" + code, value)
                add("pages", value)
                if int(code) in ban_statuses:
                    add("bans", value)
                if code == "429":
                    add("rate_limited", value)
        elif key.startswith(_EXC):
            if key[len(_EXC):] not in _DECISIONS:
                add("errors/" + error_kind(key[len(_EXC):]), value)
        elif key == "offsite/filtered":
            add(OFFSITE_FIELD, value)
        elif key in _PLAIN:
            add(_PLAIN[key], value)
    return out


#: the fields of a monitoring payload that carry a counter batch (its number, the counter
#: deltas, the hosts' pages and bans): what lua/monitoring.lua counts once per ``cs``
DELTA_FIELDS = ("cs", "c", "hp")


def heartbeat_only(payload: bytes) -> bytes:
    """*payload* (ARGV[2] of a frontier call) without its counter batch: the worker's
    heartbeat alone, for a partition other than the one the batch goes to."""
    arg = msgpack.unpackb(payload, raw=False)
    for name in DELTA_FIELDS:
        arg.pop(name, None)
    return msgpack.packb(arg, use_bin_type=False)  # type: ignore[no-any-return]


class WorkerMonitor:
    """Heartbeat and counter deltas of one worker (created by the FleetScheduler).

    *stats*: the crawler's stats collector; *config*: the FleetConfig.  Call
    :meth:`on_response` for each response (per-host counts), :meth:`payload` before a
    frontier call, :meth:`confirmed` after it succeeded.
    """

    def __init__(self, stats: Any, config: Any, started_at: float, host: str, pid: int) -> None:
        self.stats = stats
        self.config = config
        self.ban_statuses = tuple(config.ban_statuses)
        self.started_at = started_at
        self.host = host
        self.pid = pid
        self._sent: dict[str, int] = {}  # counters Redis has confirmed
        self._seq = 0
        self._pending: tuple[int, dict[str, int], list[list[Any]]] | None = None
        self._host_counts: dict[str, list[int]] = {}

    def on_response(self, host: str, status: int) -> None:
        """Count a response (and a ban) for *host*: its politeness host key
        (``politeness.hosts.host_key``, FLEET_HOST_KEY), as the frontier counts entries."""
        counts = self._host_counts.setdefault(host[:300], [0, 0])
        counts[0] += 1
        if status in self.ban_statuses:
            counts[1] += 1

    def _batch(self) -> tuple[int, dict[str, int], list[list[Any]]] | None:
        if self._pending is not None:
            return self._pending  # not confirmed yet: sent again, unchanged
        now = fleet_counters(self.stats.get_stats() if self.stats else {}, self.ban_statuses)
        deltas = {k: v - self._sent.get(k, 0) for k, v in now.items()
                  if v - self._sent.get(k, 0) > 0}
        hosts = [[h, p, b] for h, (p, b) in self._host_counts.items()]
        self._host_counts = {}
        if not deltas and not hosts:
            return None
        self._seq += 1
        self._pending = (self._seq, deltas, hosts)
        return self._pending

    def unsent(self) -> bool:
        """Counter deltas Redis has not confirmed: a batch sent and not confirmed, a
        response counted since the last batch, or per-host counts waiting (no I/O).  The
        closing call goes out for them even with nothing else to send (frontier/pump.py)."""
        if self._pending is not None or self._host_counts:
            return True
        now = fleet_counters(self.stats.get_stats() if self.stats else {}, self.ban_statuses)
        return any(v > self._sent.get(k, 0) for k, v in now.items())

    def payload(self, state: str, leases: int, downloads: int) -> bytes:
        """ARGV[2] of the next frontier call (lua/monitoring.lua)."""
        stats = self.stats.get_stats() if self.stats else {}
        pages = sum(v for k, v in stats.items() if k.startswith(_STATUS) and isinstance(v, int))
        arg: dict[str, Any] = {
            "hb": {"st": state, "l": leases, "dl": downloads, "pg": pages,
                   "it": int(stats.get("item_scraped_count", 0) or 0),
                   "er": int(stats.get("log_count/ERROR", 0) or 0),
                   "sv": scrapy.__version__, "fv": scrapy_fleet.__version__,
                   "h": self.host, "pid": self.pid, "sa": round(self.started_at, 3),
                   "ro": self.config.stages.role},
            "da": int(self.config.monitoring.worker_dead_after * 1000),
            "fa": int(self.config.monitoring.worker_forget_after * 1000),
        }
        batch = self._batch()
        if batch is not None:
            arg.update(zip(DELTA_FIELDS, batch, strict=True))
        return msgpack.packb(arg, use_bin_type=False)  # type: ignore[no-any-return]

    def confirmed(self) -> None:
        """The last payload's call succeeded: its deltas are counted fleet-wide."""
        if self._pending is not None:
            for k, v in self._pending[1].items():
                self._sent[k] = self._sent.get(k, 0) + v
            self._pending = None
