"""The recrawl as a person looks at it (docs/recrawl.md "Looking at a host, a page"): each
host's learned change rate and price (``status --hosts``), and one page's recrawl state
(``scrapy fleet recrawl CRAWL URL``).

A host's figures come from its budget HASH (keys/crawl.py ``rvb:<host>``, written by
budget.py ``HostBudgets.sync``): its tracked pages with a history, the mean of their estimated
change rates (the host's prior, the rate its new pages start from) and its price of a fetch.
A page's state is the one its record in the schedule carries (schedule.py ``State``), found
by the request fingerprint: through the place index when the crawl keeps one (a sitemap
``<lastmod>`` was pushed: O(1)), else by reading the schedule's slots (O(tracked URLs): only
the records of the URL's host are decoded).  Nothing read is unpickled (codec.py: msgpack).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from scrapy import Request

from scrapy_fleet import codec, redis_client
from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.recrawl.schedule import (
    OUTCOME_NAMES,
    STATE_META_KEY,
    UNKNOWN,
    State,
    estimate_rate,
)

#: bytes of a place index value (lua/step_revisit.lua PLACE_FORMAT '>BI5I4I4': e, n,
#: position in the slot, last fetch)
PLACE_BYTES = 14
#: records read per LRANGE while the schedule is searched
CHUNK = 500
#: hosts read from a partition's set of recrawl hosts (status --hosts)
HOSTS_READ = 10000
#: seconds in a day (change rates are shown per day)
DAY = 86400.0


def host_recrawl(fields: dict[bytes, bytes]) -> dict[str, Any]:
    """A host's recrawl figures from its budget HASH *fields* (budget.py's layout):
    ``recrawl_pages`` (tracked pages with a history, as last synced), ``recrawl_rate`` (the
    mean of their estimated change rates, changes a day; None before any),
    ``recrawl_price`` (seconds: a page changing once per that long is revisited about once
    per it, allocation.py; None before a worker solved it, or when infinite) and
    ``recrawl_priced_out`` (True: the price is infinite, every page of the host waits the
    max interval)."""
    pages, total = 0, 0.0
    for k, v in fields.items():
        name = k.decode()
        if name == "mu":
            continue
        if name.startswith("r"):
            total += float(v)
        elif int(v) > 0:
            pages += int(v)
    raw = fields.get(b"mu")
    price = None if raw is None else (math.inf if raw == b"inf" else float(raw))
    return {"recrawl_pages": pages,
            "recrawl_rate": round(total / pages * DAY, 3) if pages and total > 0 else None,
            "recrawl_price": None if price is None or math.isinf(price) else round(price, 3),
            "recrawl_priced_out": price is not None and math.isinf(price)}


def host_cells(row: dict[str, Any]) -> tuple[str, str]:
    """The change rate (changes a day, 3 significant digits; ``-``: none yet) and price
    (s; ``max``: priced out; ``-``: not solved) cells of a host's row (:func:`host_recrawl`'s
    fields), as ``status --hosts`` and ``top`` print them."""
    rate = "-" if row.get("recrawl_rate") is None else f"{row['recrawl_rate']:.3g}"
    price = "max" if row.get("recrawl_priced_out") else (
        "-" if row.get("recrawl_price") is None else f"{row['recrawl_price']:.4g}s")
    return rate, price


def read_hosts(client: Any, keys: CrawlKeys, hosts: list[str],
               parts: int = 1) -> dict[str, dict[str, Any]]:
    """host -> :func:`host_recrawl` for each of *hosts* (one pipeline of HGETALL; a
    partitioned crawl's host at its partition's keys).

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            hk = keys.partition(partition_of(host, parts), parts) if parts > 1 else keys
            pipe.hgetall(hk.revisit_budget(host))
        replies = pipe.execute() if hosts else []
    return {host: host_recrawl(fields) for host, fields in zip(hosts, replies, strict=True)}


def recrawl_hosts(client: Any, keys: CrawlKeys, parts: int = 1,
                  limit: int = 20) -> list[dict[str, Any]]:
    """The recrawl's hosts (keys/crawl.py ``rvh``, every partition's), each ``{"host": ...}`` with
    its :func:`host_recrawl` figures, the most tracked pages first, at most *limit*; at most
    :data:`HOSTS_READ` hosts a partition are read.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    rows: list[dict[str, Any]] = []
    for hk in keys.all_partitions(parts) if parts > 1 else [keys]:
        hosts = []
        for raw in client.sscan_iter(hk.revisit_hosts, count=500):
            hosts.append(raw.decode(errors="replace"))
            if len(hosts) >= HOSTS_READ:
                break
        figures = read_hosts(client, hk, hosts)
        rows += [{"host": host, **figures[host]} for host in hosts]
    rows.sort(key=lambda r: (-r["recrawl_pages"], r["host"]))
    return rows[:limit]


def outcome(state: State) -> str:
    """The last visit's outcome as the state keeps it (schedule.py ``OUTCOME_NAMES``):
    ``first`` (one visit so far), ``changed`` (a 2xx with new items, or text), ``unchanged``
    (a 2xx with the same), ``not_modified`` (a 304), ``failed`` (a download error or another
    final status: kept at its interval), ``gone`` (a 404/410).  A state written before the
    outcome was kept tells less: ``gone``, ``first``, else ``changed`` or ``unchanged`` (a
    304 or the same items or text) by its last observation."""
    if state.last != UNKNOWN:
        return OUTCOME_NAMES[state.last]
    if state.gone:
        return "gone"
    if not state.history:
        return "first"
    return "changed" if state.history[-1] > 0 else "unchanged"


def page_view(url: str, host: str, due_ms: float, state: State,
              now_ms: int) -> dict[str, Any]:
    """The page's figures (docs/recrawl.md lists them) from its record's *state*, its slot's
    due time *due_ms* and the server's clock *now_ms* (ms)."""
    rate = estimate_rate(state.history, float(state.interval)) if state.interval > 0 \
        and state.history else None
    return {"url": url, "host": host,
            "next_due": round(due_ms / 1000, 3),
            "next_due_in": round(max(due_ms - now_ms, 0) / 1000, 1),
            "last_fetch": state.fetched, "interval": state.interval,
            "visits": len(state.history) + 1, "history": list(state.history),
            "change_rate": None if rate is None else round(rate * DAY, 3),
            "last_outcome": outcome(state), "gone": state.gone,
            "etag": state.etag, "last_modified": state.last_modified}


def _decode(rec: bytes) -> tuple[str, dict[str, Any]] | None:
    """(host, request dict) of a schedule record, None for a tombstone or a foreign value."""
    parts = rec.split(b"\t", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0].decode(), codec.decode_dict(parts[2])
    except (RequestDecodeError, UnicodeDecodeError, ValueError):
        return None


def _key_of(d: dict[str, Any], fingerprint: Callable[[Request], bytes]) -> bytes:
    request = Request(d["url"], method=d.get("method") or "GET", body=d.get("body") or b"",
                      headers=d.get("headers"))
    return bloom_key(fingerprint(request))


def _by_place(client: Any, keys: CrawlKeys, key: bytes) -> tuple[str, bytes] | None:
    """The slot and record the place index points at for Bloom key *key* (None: no entry)."""
    name, field = keys.revisit_place(key)
    raw = client.hget(name, field)
    if raw is None or len(raw) != PLACE_BYTES:
        return None
    slot = f"{raw[0]}:{int.from_bytes(raw[1:6], 'big')}"
    position = int.from_bytes(raw[6:10], "big")
    popped = int(client.hget(keys.revisit_popped, slot) or 0)
    rec = client.lindex(keys.revisit_slot(slot), position - popped)
    return (slot, rec) if rec else None


def find_record(client: Any, keys: CrawlKeys, url: str, host: str,
                fingerprint: Callable[[Request], bytes]
                ) -> tuple[str, dict[str, Any]] | None:
    """The slot and request dict of *url*'s record in the schedule (matched by its
    fingerprint's Bloom key: frontier/bloom.py), None when it is not there (never tracked,
    dropped, or in the frontier now as a due revisit).  *host*: its host key (only that
    host's records are decoded when the slots are read)."""
    key = bloom_key(fingerprint(Request(url)))
    placed = _by_place(client, keys, key)
    if placed is not None:
        got = _decode(placed[1])
        if got is not None and _key_of(got[1], fingerprint) == key:
            return placed[0], got[1]
    prefix = host.encode() + b"\t"
    for raw_slot in client.zrange(keys.revisit_index, 0, -1):
        slot = raw_slot.decode()
        start = 0
        while True:
            recs = client.lrange(keys.revisit_slot(slot), start, start + CHUNK - 1)
            for rec in recs:
                got = _decode(rec) if rec.startswith(prefix) else None
                if got is not None and _key_of(got[1], fingerprint) == key:
                    return slot, got[1]
            if len(recs) < CHUNK:
                break
            start += CHUNK
    return None


def read_page(client: Any, keys: CrawlKeys, url: str, host: str,
              fingerprint: Callable[[Request], bytes]) -> dict[str, Any] | None:
    """*url*'s recrawl state (:func:`page_view`), None when its record is not in the schedule
    (:func:`find_record`).  *keys*: the keys of the URL's partition.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    found = find_record(client, keys, url, host, fingerprint)
    if found is None:
        return None
    slot, d = found
    state = State.from_meta((d.get("meta") or {}).get(STATE_META_KEY))
    due = client.zscore(keys.revisit_index, slot)
    if state is None or due is None:
        return None
    seconds, micros = client.time(**redis_client.node_of(client, keys.stats))
    return page_view(d["url"], host, float(due), state, int(seconds) * 1000 + int(micros) // 1000)
