"""Failed requests from the commands' side: counts, listing, retry (``scrapy fleet failed|retry``).

The records are written by lua/failed.lua with each failed request's acknowledgement; here
they are read (blocking redis-py client of ``FrontierAdmin``) and put back into the frontier
by lua/failed_retry.lua, which removes each record atomically with its push: a record is
retried once, however many ``retry`` runs race.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from scrapy_fleet import codec, lua, redis_client
from scrapy_fleet.errors import RequestDecodeError, RequestEncodeError
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier import layout
from scrapy_fleet.keys.crawl import CrawlKeys

#: records put back per script call
RETRY_CHUNK = 200


def failed_counts(client: Any, keys: CrawlKeys) -> dict[str, int]:
    """Failed requests kept, per reason (one ``HGETALL``), for ``status``."""
    return failed_counts_of(client.hgetall(keys.failed_by))


def failed_counts_of(raw: dict[bytes, Any]) -> dict[str, int]:
    """:func:`failed_counts` from the ``failed_by`` hash as read (reason -> count)."""
    out: dict[str, int] = {}
    for reason, count in raw.items():
        try:
            n = int(count)
        except (TypeError, ValueError):
            continue
        if n > 0:
            out[reason.decode(errors="replace")] = n
    return dict(sorted(out.items()))


def failed_status_line(counts: dict[str, int], counters: dict[str, int]) -> str:
    """The ``failed`` line of ``status``: kept, per reason (*counts*: the snapshot's
    ``failed_by``), and the fleet-wide totals (*counters*: its ``counters.requests``)."""
    kept = sum(counts.values())
    by = ", ".join(f"{r} {n}" for r, n in counts.items())
    extra = [f"{name} {counters[name]}" for name in ("failed", "failed_trimmed", "retried",
                                                    "unstorable")
             if counters.get(name)]
    return (f"  failed   {kept}" + (f" ({by})" if by else "")
            + (f"; totals {', '.join(extra)}" if extra else ""))


def failed_records(client: Any, keys: CrawlKeys,
                   reason: str | None = None) -> Iterator[tuple[str, FailureRecord]]:
    """``(record id, record)`` of the failed requests, oldest first; only *reason*'s when
    given.  Unreadable records are skipped."""
    ids = client.zrange(keys.failed_at, 0, -1)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        for rid, raw in zip(chunk, client.hmget(keys.failed, chunk), strict=True):
            if raw is None:
                continue
            try:
                record = FailureRecord.decode(raw)
            except ValueError:
                continue
            if reason is None or record.reason == reason:
                yield rid.decode(errors="replace"), record


def dead_records(client: Any, keys: CrawlKeys,
                 reason: str | None = None) -> Iterator[tuple[str, str, bytes]]:
    """``(entry id, reason, encoded request)`` of the dead letters (*reason*'s when given)."""
    for entry_id, raw in client.hscan_iter(keys.dead, count=200):
        try:
            d = msgpack.unpackb(raw, raw=True)
            why = d.get(b"reason", b"")
            why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
            data = d.get(b"data", b"")
        except Exception:  # not written by the fleet: never retried
            continue
        if reason is None or why == reason:
            yield entry_id.decode(errors="replace"), why, data if isinstance(data, bytes) else b""


@dataclass
class RetryReport:
    retried: int = 0  #: records put back into the frontier
    gone: int = 0  #: records retried meanwhile by another run (nothing pushed for them)
    full: int = 0  #: records left because the frontier was at FLEET_QUEUE_MAX
    unreadable: int = 0  #: records whose request cannot be decoded (left where they are)
    #: records of requests without a parent the codec could not store: no request to put
    #: back (left where they are; docs/failures.md)
    unstorable: int = 0
    #: records whose request (a page) was put back for another record of this run: removed,
    #: the page fetched once (the links of one page the codec could not store)
    merged: int = 0


def _fresh_payload(data: bytes) -> tuple[bytes, int]:
    """The request to push again, with its retry count reset (Scrapy's RetryMiddleware gives
    it its RETRY_TIMES again), and its priority.

    Raises:
        RequestDecodeError, RequestEncodeError: *data* is not a usable request.
    """
    d = codec.decode_dict(data)
    meta = d.get("meta")
    if isinstance(meta, dict) and "retry_times" in meta:
        d["meta"] = {k: v for k, v in meta.items() if k != "retry_times"}
    priority = d.get("priority", 0)
    return codec.encode_dict(d), int(priority) if isinstance(priority, int) else 0


def retry(client: Any, keys: CrawlKeys, url: str, *, dead: bool = False,
          reason: str | None = None, queue_max: int | None = None,
          host_key: Any = None, retries: int = 3) -> RetryReport:
    """Put the failed requests (*dead*: the dead letters) back into the frontier, those with
    *reason* or all (None); each record is removed atomically with its push (once each).
    *host_key* maps a URL to its host key (``politeness.host_key`` with the crawl's
    ``FLEET_HOST_KEY``); failed records carry theirs.

    Raises:
        RedisUnavailableError: Redis unreachable (records already retried stay retried).
        CrawlLayoutError: the crawl was written by another layout (frontier/layout.py).
    """
    from scrapy_fleet.politeness import hosts as politeness

    layout.check_sync(client, keys)
    script = lua.load(client, "failed_retry.lua")
    report = RetryReport()
    entries: list[list[Any]] = []

    def host_of(url_: str) -> str:
        return host_key(url_) if host_key else politeness.host_key(url_, "host")

    def flush() -> None:
        if not entries:
            return
        arg = msgpack.packb({"src": "dead" if dead else "failed", "qm": queue_max or 0,
                             "e": entries}, use_bin_type=False)
        reply = redis_client.call_retrying(
            lambda: script(keys=keys.retry_keys(), args=[arg]), url, retries)
        d = {k.decode(): int(v) for k, v in msgpack.unpackb(reply, raw=True).items()}
        report.retried += d.get("retried", 0)
        report.gone += d.get("gone", 0)
        report.full += d.get("full", 0)
        report.merged += d.get("merged", 0)
        entries.clear()

    pages: set[str] = set()  # entry ids of the requests sent in this run (failed records)
    source: Iterator[tuple[str, str, bytes]]
    if dead:
        source = dead_records(client, keys, reason)
    else:
        # a record of a link that could not be stored holds the request of the page that
        # found it (another host, maybe): its host is that request's ("")
        source = ((rid, "" if rec.parent else rec.host or host_of(rec.url), rec.data)
                  for rid, rec in failed_records(client, keys, reason))
    for rid, host_or_reason, data in source:
        if not dead and not data:  # a request that could not be stored, found by no request
            report.unstorable += 1
            continue
        # "<entry id>" and "<entry id>/<n>" (the links its page yielded that could not be
        # stored) hold the same request: the page is put back once
        page = "" if dead else rid.split("/", 1)[0]
        if page and page in pages:
            entries.append([rid, "", 0, ""])
            if len(entries) >= RETRY_CHUNK:
                flush()
            continue
        try:
            payload, priority = _fresh_payload(data)
            url_ = codec.decode_dict(payload)["url"]
        except (RequestDecodeError, RequestEncodeError, KeyError):
            report.unreadable += 1
            continue
        pages.add(page)
        host = host_of(url_) if dead or not host_or_reason else host_or_reason
        entries.append([rid, host, max(-2**31, min(2**31, priority)), payload])
        if len(entries) >= RETRY_CHUNK:
            flush()
    flush()
    return report
