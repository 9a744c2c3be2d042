"""The crawl's hosts, one host's URLs and the crawl ids Redis holds, read with plain reads in
bounded steps (``hosts``, ``urls``, ``crawls``: commands/lookup.py, docs/control.md "Listing
hosts, URLs and crawls").  No command reads more than :data:`CHUNK` elements: HASHes by
HSCAN, LISTs and ZSETs by index ranges, the keyspace by SCAN.

Per host (keys/crawl.py): ``queued`` is the sum of the lengths of its buckets (``qidx`` names
them), ``leased`` its members of the ``lease`` HASH (leases not yet acknowledged),
``deferred`` its members of ``deferred``, ``failed`` its failed-request records (their
``host`` field).  Over every host they sum to the crawl's ``queued``, ``leased``,
``deferred`` and ``failed`` counts of ``status`` (stage pseudo-host included).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgpack

from scrapy_fleet import codec
from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.keys.crawl import CrawlKeys

#: elements read per command
CHUNK = 1000
HOST_SORTS = ("queued", "leased", "failed")
URL_STATES = ("queued", "leased", "failed", "dead")


def hscan_chunks(client: Any, key: str, cursor: int = 0
                 ) -> Iterator[tuple[int, list[tuple[bytes, bytes]]]]:
    """``(next cursor, fields and values)`` of a HASH, one HSCAN step at a time."""
    while True:
        cursor, page = client.hscan(key, cursor, count=CHUNK)
        yield int(cursor), list(page.items())
        if int(cursor) == 0:
            return


def _host_of_member(member: bytes) -> bytes:
    """The host of a ``lease`` value head or ``deferred`` member (``...|score|host``)."""
    return member.rsplit(b"|", 1)[-1]


def host_rows(client: Any, keys: CrawlKeys, parts: int = 1) -> list[dict[str, Any]]:
    """Every host of the crawl (at P > 1, of every partition) as ``{host, queued, leased,
    deferred, failed}``, unsorted.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    rows: list[dict[str, Any]] = []
    for pk in keys.all_partitions(parts) if parts > 1 else [keys]:
        rows += _partition_hosts(client, pk)
    return rows


def _partition_hosts(client: Any, keys: CrawlKeys) -> list[dict[str, Any]]:
    queued: Counter[bytes] = Counter()
    for _, page in hscan_chunks(client, keys.queue_index):
        buckets = [(h, f"{keys.bucket_prefix}{h.decode()}\t{k.decode()}")
                   for h, v in page for k in v.split()]
        for start in range(0, len(buckets), CHUNK):
            with client.pipeline(transaction=False) as pipe:
                for _, name in buckets[start:start + CHUNK]:
                    pipe.llen(name)
                for (h, _), n in zip(buckets[start:start + CHUNK], pipe.execute(), strict=True):
                    queued[h] += int(n)
    leased: Counter[bytes] = Counter()
    for _, page in hscan_chunks(client, keys.lease):
        for _, value in page:
            leased[_host_of_member(value.partition(b"\t")[0])] += 1
    deferred: Counter[bytes] = Counter()
    start = 0
    while True:
        members = client.zrange(keys.deferred, start, start + CHUNK - 1)
        deferred.update(_host_of_member(m) for m in members)
        if len(members) < CHUNK:
            break
        start += CHUNK
    failed: Counter[bytes] = Counter()
    for _, page in hscan_chunks(client, keys.failed):
        for _, raw in page:
            try:
                failed[FailureRecord.decode(raw).host.encode()] += 1
            except ValueError:
                continue
    names = set(queued) | set(leased) | set(deferred) | set(failed)
    return [{"host": h.decode(errors="replace"), "queued": queued[h], "leased": leased[h],
             "deferred": deferred[h], "failed": failed[h]} for h in names]


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The sums of *rows*' counts over every host."""
    return {name: sum(r[name] for r in rows) for name in ("queued", "leased", "deferred",
                                                          "failed")}


def host_known(client: Any, keys: CrawlKeys, host: str) -> bool:
    """Whether the crawl (*keys*: the host's partition's) has ever had entries of *host*: it
    has queued ones, its politeness state, or entries counted in the frontier."""
    with client.pipeline(transaction=False) as pipe:
        for key in (keys.queue_index, keys.hostq, keys.tat, keys.hostlive):
            pipe.hexists(key, host)
        return any(pipe.execute())


def _url(payload: bytes) -> str | None:
    try:
        return str(codec.decode_dict(payload)["url"])
    except (RequestDecodeError, KeyError, TypeError, ValueError):
        return None


def url_page(client: Any, keys: CrawlKeys, host: str, state: str, cursor: str,
             limit: int) -> tuple[list[dict[str, Any]], str]:
    """One page of *host*'s entries in *state* (one of :data:`URL_STATES`), from *cursor*
    (``"0"``: the start): ``([{entry_id, url, ...}], next cursor)``, ``"0"`` when done.
    Queued: the cursor is ``<bucket>.<offset>`` (positions: entries leased meanwhile shift
    the later ones forward); the others: HSCAN cursors (every entry present from the first
    page to the last is listed; Redis may list one twice while the HASH is resized).  A
    page has at least *limit* rows unless it is the last (an HSCAN step is never cut).

    Raises:
        ValueError: a cursor this did not print.
        redis.RedisError: when Redis cannot be read.
    """
    if state == "queued":
        return _queued_page(client, keys, host, cursor, limit)
    try:
        at = int(cursor)
    except ValueError:
        raise ValueError(f"--cursor {cursor!r} is not a cursor of --state {state}") from None
    rows: list[dict[str, Any]] = []
    key = {"leased": keys.lease, "failed": keys.failed, "dead": keys.dead}[state]
    following = 0
    for step in hscan_chunks(client, key, at):
        following = step[0]
        rows += _rows_of(client, keys, host, state, step[1])
        if len(rows) >= limit:
            break
    return rows, str(following)


def _rows_of(client: Any, keys: CrawlKeys, host: str, state: str,
             page: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    mine = host.encode()
    if state == "leased":
        ids = [(i, v.partition(b"\t")[2]) for i, v in page
               if _host_of_member(v.partition(b"\t")[0]) == mine]
        payloads = client.hmget(keys.data, [i for i, _ in ids]) if ids else []
        return [{"entry_id": i.decode(), "url": _url(p or b""),
                 "worker": w.lstrip(b"!").decode(errors="replace")}
                for (i, w), p in zip(ids, payloads, strict=True)]
    rows = []
    for entry_id, raw in page:
        if state == "failed":
            try:
                rec = FailureRecord.decode(raw)
            except ValueError:
                continue
            if rec.host == host:
                rows.append({"entry_id": entry_id.decode(), "url": rec.url,
                             "reason": rec.reason, "attempts": rec.attempts})
            continue
        try:  # dead
            d = msgpack.unpackb(raw, raw=True)
            url = _url(d.get(b"data", b""))
            why = d.get(b"reason", b"")
        except Exception:  # not written by the fleet
            continue
        if url is not None and _host_key_match(url, host):
            rows.append({"entry_id": entry_id.decode(), "url": url,
                         "reason": why.decode(errors="replace") if isinstance(why, bytes)
                         else str(why)})
    return rows


def _host_key_match(url: str, host: str) -> bool:
    """Whether a dead letter's *url* is of *host* (its host name, or a domain it is under:
    dead letters keep no host key)."""
    from urllib.parse import urlsplit

    name = (urlsplit(url).hostname or "").lower()
    return name == host or name.endswith("." + host)


def _queued_page(client: Any, keys: CrawlKeys, host: str, cursor: str,
                 limit: int) -> tuple[list[dict[str, Any]], str]:
    try:
        b, _, off = cursor.partition(".")
        bucket_at, offset = int(b), int(off or 0)
    except ValueError:
        raise ValueError(f"--cursor {cursor!r} is not a cursor of --state queued") from None
    index = (client.hget(keys.queue_index, host) or b"").split()
    rows: list[dict[str, Any]] = []
    while bucket_at < len(index) and len(rows) < limit:
        pkey = index[bucket_at]
        want = min(CHUNK, limit - len(rows))
        bucket = f"{keys.bucket_prefix}{host}\t{pkey.decode()}"
        page = client.lrange(bucket, offset, offset + want - 1)
        for raw in page:
            entry_id, _, payload = raw.partition(b"\t")
            rows.append({"entry_id": entry_id.decode(errors="replace"), "url": _url(payload),
                         "priority": 10**15 - int(pkey)})
        offset += len(page)
        if len(page) < want or client.llen(bucket) <= offset:  # (the bucket's end)
            bucket_at, offset = bucket_at + 1, 0
    done = bucket_at >= len(index)
    return rows, "0" if done else f"{bucket_at}.{offset}"


def crawl_rows(client: Any, prefix: str) -> list[dict[str, Any]]:
    """The crawls Redis holds under *prefix* (each crawl's ``layout`` key, written by its
    first frontier call, and ``partitions``; on a Redis Cluster every master is scanned), as
    ``{crawl, partitions, pushed, queued}`` sorted by crawl id; the counts are summed over a
    crawl's partitions.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    escaped = "".join("\\" + c if c in "[]*?\\" else c for c in prefix)
    tags: dict[str, set[str]] = {}
    for key in client.scan_iter(match=f"{escaped}:{{*}}:layout", count=CHUNK):
        tag = key.decode(errors="replace")[len(prefix) + 2:-len("}:layout")]
        tags.setdefault(tag.split("/", 1)[0], set()).add(tag)
    rows = []
    for crawl in sorted(tags):
        try:
            base = CrawlKeys(prefix, crawl)
        except Exception:  # a key of another program under the prefix: not a crawl id
            continue
        parts = int(client.get(base.partitions) or 1)
        pushed = queued = 0
        for pk in base.all_partitions(parts) if parts > 1 else [base]:
            pushed += int(client.hget(pk.stats, "pushed") or 0)
            queued += int(client.get(pk.queue_count) or 0)
        rows.append({"crawl": crawl, "partitions": parts, "pushed": pushed, "queued": queued})
    return rows
