"""Where is a URL: its state in a crawl's frontier, read with plain reads (the ``monitor``
ACL role), for ``scrapy fleet url`` (commands/lookup.py, docs/control.md "Where is a URL").

An entry's id is a counter value given at push (keys/crawl.py ``seq``), not derived from its URL,
and the frontier keeps no index from a URL to its entry; what is derived from the URL is its
host (which names its queue buckets and, at P > 1, its partition: keys/crawl.py ``partition_of``)
and its Bloom key (the request fingerprint, hashed: frontier/bloom.py).  So a lookup reads
only the structures that can hold the URL and only the parts of them of its host:

* leased (``lease`` HASH, each value naming its host and holder) and deferred (``deferred``
  ZSET, members ``id|score|host``): read whole, both are bounded by what is in flight;
* queued: the host's buckets only (``qidx`` names them), in slices of :data:`CHUNK`;
* parked (``parked`` LIST), failed (``failed`` HASH) and dead (``dead`` HASH): read whole, in
  slices (they are bounded by FLEET_QUEUE_MAX's overflow and the failed cap);
* tracked for recrawl: recrawl/view.py ``find_record`` (O(1) with its place index);
* else the Bloom filter: absent is certain ("never seen"), present is "done, probably".

An entry matches when its request's Bloom key is the URL's (the fingerprint the push and the
dupefilter use).  To keep the cost per entry low, a first pass decodes only the entries whose
payload holds the URL as pushed (``safe_url_string``); when it finds nothing and the filter has
the URL (done, or pushed in another spelling of the same canonical URL), a second pass looks at
every entry of the host, but with Scrapy's default fingerprinter fingerprints only those whose
URL holds every run of letters and digits of the URL's canonical path and query, or has an
escape canonicalization may join into a new run (:func:`url_runs`, :func:`has_runs`: ~4 us
an entry instead of ~40 us for ``canonicalize_url`` and SHA-1; a project's own fingerprinter:
every entry).  Cost: O(entries
of the host + in flight + failed + dead), in few round trips: the first page of every
structure is read in one pipeline, and the second pass matches the pages the first one read
(:class:`_Reads`); an index ``Bloom key -> entry id`` written by the push would make each
structure O(1) at ~40 B per queued URL (docs/control.md).  Each structure is read at a
different moment: an entry moving while the lookup runs (leased, then acknowledged) is found
in the state it had when its structure was read, or in none ("done, probably").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import msgpack
from scrapy import Request
from w3lib.url import canonicalize_url, safe_url_string

from scrapy_fleet import codec
from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier import bloom_read
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.fingerprint import is_default_fingerprinter, url_bloom_key
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl import view as recrawl_view

#: entries read per LRANGE / HSCAN step / HMGET (no single command runs long)
CHUNK = 1000
#: the bucket key of priority 0 (keys/crawl.py ``bucket``: -priority + 10**15)
PRIO_OFFSET = 10**15

Fingerprint = Callable[[Request], bytes]


@dataclass
class Probe:
    """What an entry is compared with: the URL's Bloom key, its pushed spelling (bytes) and the
    crawl's fingerprinter.  *full*: the second pass (fingerprint every entry)."""

    key: bytes
    needle: bytes
    fingerprint: Fingerprint
    full: bool = False
    #: Scrapy's default fingerprinter: a GET without body is keyed by its URL alone
    default: bool = False
    #: the second pass's filter (:func:`url_runs` of the URL's canonical form), set for
    #: Scrapy's default fingerprinter only: an entry whose URL :func:`has_runs` rejects is not
    #: fingerprinted; empty: every entry is
    runs: frozenset[bytes] = frozenset()

    def matches(self, payload: bytes) -> dict[str, Any] | None:
        """The request dict of *payload* when it is the URL's entry, else None."""
        if not payload or (not self.full and self.needle not in payload):
            return None
        try:
            d = codec.decode_dict(payload)
            if self.runs and not has_runs(d["url"], self.runs):
                return None
            method, body = d.get("method") or "GET", d.get("body") or b""
            if self.default and method == "GET" and not body and not (
                    d.get("meta") or {}).get("verbatim_url"):
                return d if url_bloom_key(d["url"]) == self.key else None
            request = Request(d["url"], method=method, body=body, headers=d.get("headers"),
                              meta=d.get("meta") or {})
        except (RequestDecodeError, KeyError, TypeError, ValueError):
            return None
        return d if bloom_key(self.fingerprint(request)) == self.key else None


def probe_for(url: str, fingerprint: Fingerprint) -> Probe:
    """The :class:`Probe` of *url* (an http(s) URL).

    Raises:
        ValueError: *url* cannot be a Request's URL.
    """
    request = Request(url)
    default = is_default_fingerprinter(fingerprint)
    return Probe(bloom_key(fingerprint(request)), safe_url_string(url, "utf-8").encode(),
                 fingerprint, default=default,
                 runs=url_runs(canonicalize_url(request.url)) if default else frozenset())


#: a run: a maximal sequence of ASCII letters (lowercased) and digits
_RUN = re.compile(rb"[a-z0-9]+")


def url_runs(canonical: str) -> frozenset[bytes]:
    """The runs of ASCII letters and digits of *canonical*'s path and query (a
    ``w3lib.url.canonicalize_url`` result), percent-decoded and lowercased: what
    :func:`has_runs` looks for.

    Why it is sound: Scrapy's default fingerprint is the SHA-1 of the canonical URL (with the
    method and body), so an entry whose fingerprint is the URL's has the same canonical URL;
    canonicalization (w3lib: percent-encoding normalized, query sorted, fragment and dot
    segments removed, host lowercased) moves and removes whole runs of the decoded path and
    query, never makes new ones, so every run of the canonical URL is a run of the entry's
    decoded URL, unless an escape it decodes joins what follows into a new one (``/100%3%30``
    canonicalizes to ``/100%30``, whose decoded run ``1000`` the URL, decoded, lacks): for a URL
    with such a ``%`` (:data:`_UNSURE`) :func:`has_runs` says True.
    tests/unit/test_where_runs.py checks it over varied spellings."""
    parts = urlsplit(canonical)
    return frozenset(_RUN.findall(unquote_to_bytes(f"{parts.path}?{parts.query}").lower()))


#: a ``%`` that canonicalization may join with what follows into a new run: one not followed
#: by two hex digits, or the escape of a letter, a digit or ``%`` itself
_UNSURE = re.compile(r"%(?![0-9A-Fa-f]{2})|%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|25)")


def has_runs(url: str, runs: frozenset[bytes]) -> bool:
    """False when *url* (an entry's request URL) cannot have the canonical URL *runs* came
    from (:func:`url_runs`): one of *runs* is not one of the runs of *url* percent-decoded and
    lowercased, and *url* has no ``%`` of :data:`_UNSURE`; True otherwise (fingerprint it to
    know)."""
    if "%" in url and _UNSURE.search(url):
        return True
    return runs <= frozenset(_RUN.findall(unquote_to_bytes(url).lower()))


def locate(client: Any, keys: CrawlKeys, url: str, host: str,
           fingerprint: Fingerprint) -> dict[str, Any]:
    """*url*'s state in the crawl (*keys*: its partition's; *host*: its host key): a dict with
    ``url``, ``host``, ``state`` (``leased``, ``deferred``, ``queued``, ``parked``,
    ``failed``, ``dead``, ``recrawl``, ``done`` or ``never_seen``), ``certain`` (False only
    for ``done``) and the state's fields (docs/control.md lists them; times are server ms).

    Raises:
        ValueError: *url* cannot be a Request's URL.
        redis.RedisError: when Redis cannot be read.
    """
    probe = probe_for(url, fingerprint)
    seen = bloom_read.contains(client, keys, probe.key)
    reads = _Reads(client)
    reads.prefetch(keys, host)
    found = _search(reads, keys, host, probe)
    if found is None and seen:
        probe.full = True  # (the second pass reads nothing again: the pages are in `reads`)
        found = _search(reads, keys, host, probe)
    if found is None:
        page = recrawl_view.read_page(client, keys, url, host, fingerprint)
        if page is not None:
            found = {"state": "recrawl", "next_due": int(page["next_due"] * 1000),
                     "last_fetch": page["last_fetch"], "visits": page["visits"]}
    if found is None:
        found = {"state": "done" if seen else "never_seen"}
    found.setdefault("entry_id", None)
    return {"url": url, "host": host, "certain": found["state"] != "done",
            "in_filter": seen, **found}


class _Reads:
    """The reads of one lookup, each sent to Redis once: a memo of the client's read
    commands by name and arguments, so that the second pass (:class:`Probe` ``full``) matches
    the pages the first pass read, and :meth:`prefetch` sends the first page of every
    structure in one pipeline (one round trip instead of one per structure)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.memo: dict[tuple[str, str], Any] = {}

    @staticmethod
    def _slot(name: str, args: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, str]:
        return name, repr((args, sorted(kw.items())))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        command = getattr(self.client, name)

        def call(*args: Any, **kw: Any) -> Any:
            slot = self._slot(name, args, kw)
            if slot not in self.memo:
                self.memo[slot] = command(*args, **kw)
            return self.memo[slot]
        return call

    def prefetch(self, keys: CrawlKeys, host: str) -> None:
        """Read, in one pipeline, what every :func:`_search` step reads first (the same
        commands with the same arguments)."""
        first: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("hscan", (keys.lease, 0), {"count": CHUNK}),
            ("zrange", (keys.deferred, 0, CHUNK - 1), {"withscores": True}),
            ("hget", (keys.queue_index, host), {}),
            ("lrange", (keys.parked, 0, CHUNK - 1), {}),
            ("hscan", (keys.failed, 0), {"count": CHUNK}),
            ("hscan", (keys.dead, 0), {"count": CHUNK})]
        with self.client.pipeline(transaction=False) as pipe:
            for name, args, kw in first:
                getattr(pipe, name)(*args, **kw)
            replies = pipe.execute()
        for (name, args, kw), reply in zip(first, replies, strict=True):
            self.memo[self._slot(name, args, kw)] = reply


def _search(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    for step in (_leased, _deferred, _queued, _parked, _failed, _dead):
        found = step(client, keys, host, probe)
        if found is not None:
            return found
    return None


def _hash_chunks(client: Any, key: str) -> Iterator[list[tuple[bytes, bytes]]]:
    """A HASH's fields and values, :data:`CHUNK` at a time (HSCAN)."""
    cursor = 0
    while True:
        cursor, page = client.hscan(key, cursor, count=CHUNK)
        if page:
            yield list(page.items())
        if cursor == 0:
            return


def _leased(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    suffix = b"|" + host.encode()
    for page in _hash_chunks(client, keys.lease):
        mine = []  # (id, worker) of the host's leases
        for entry_id, value in page:
            head, _, worker = value.partition(b"\t")
            if head.endswith(suffix):
                mine.append((entry_id, worker))
        if not mine:
            continue
        payloads = client.hmget(keys.data, [i for i, _ in mine])
        for (entry_id, worker), payload in zip(mine, payloads, strict=True):
            d = probe.matches(payload or b"")
            if d is None:
                continue
            expiry, expired = client.zscore(keys.leases, entry_id), client.hget(
                keys.expiries, entry_id)
            over = worker.startswith(b"!")
            return {"state": "leased", "entry_id": entry_id.decode(),
                    "worker": worker.lstrip(b"!").decode(errors="replace"),
                    "downloaded": over, "lease_expiry": None if expiry is None else int(expiry),
                    "attempts": int(expired or 0) + 1, **_retries(d)}
    return None


def _retries(d: dict[str, Any]) -> dict[str, Any]:
    """Scrapy's retries of the request so far (its meta's ``retry_times``) and priority."""
    meta = d.get("meta") or {}
    return {"retry_times": int(meta.get("retry_times", 0) or 0),
            "priority": int(d.get("priority") or 0)}


def _deferred(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    suffix = b"|" + host.encode()
    start = 0
    while True:
        page = client.zrange(keys.deferred, start, start + CHUNK - 1, withscores=True)
        mine = [(m, int(s)) for m, s in page if m.endswith(suffix)]
        if mine:
            ids = [m.split(b"|", 1)[0] for m, _ in mine]
            for entry_id, (_, until), payload in zip(ids, mine, client.hmget(keys.data, ids),
                                                      strict=True):
                d = probe.matches(payload or b"")
                if d is not None:
                    return {"state": "deferred", "entry_id": entry_id.decode(),
                            "until": until, **_retries(d)}
        if len(page) < CHUNK:
            return None
        start += CHUNK


def _queued(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    index = client.hget(keys.queue_index, host)
    ahead = 0  # entries of the host before it (leased first)
    for pkey in (index or b"").split():
        bucket = f"{keys.bucket_prefix}{host}\t{pkey.decode()}"
        start = 0
        while True:
            page = client.lrange(bucket, start, start + CHUNK - 1)
            for i, raw in enumerate(page):
                entry_id, _, payload = raw.partition(b"\t")
                d = probe.matches(payload)
                if d is not None:
                    return {"state": "queued", "entry_id": entry_id.decode(errors="replace"),
                            "priority": PRIO_OFFSET - int(pkey), "ahead": ahead + start + i,
                            "retry_times": _retries(d)["retry_times"]}
            if len(page) < CHUNK:
                ahead += start + len(page)
                break
            start += CHUNK
    return None


def _parked(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    start = 0
    while True:
        page = client.lrange(keys.parked, start, start + CHUNK - 1)
        for raw in page:
            try:
                rec = msgpack.unpackb(raw, raw=True)
                entry_id, score, rec_host, payload = rec[0], rec[1], rec[2], rec[3]
            except Exception:  # not a record of the fleet's: not this URL's
                continue
            if rec_host == host.encode() and probe.matches(payload) is not None:
                return {"state": "parked", "entry_id": entry_id.decode(errors="replace"),
                        "priority": -int(score)}
        if len(page) < CHUNK:
            return None
        start += CHUNK


def _failed(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    for page in _hash_chunks(client, keys.failed):
        for record_id, raw in page:
            try:
                rec = FailureRecord.decode(raw)
            except ValueError:
                continue
            if rec.host and rec.host != host:
                continue
            payload = rec.data or codec.encode_dict({"url": rec.url, "method": rec.method})
            if probe.matches(payload) is not None:
                return {"state": "failed", "entry_id": record_id.decode(errors="replace"),
                        "reason": rec.reason, "attempts": rec.attempts, "at": rec.at,
                        "status": rec.status, "worker": rec.worker, "message": rec.message}
    return None


def _dead(client: Any, keys: CrawlKeys, host: str, probe: Probe) -> dict[str, Any] | None:
    for page in _hash_chunks(client, keys.dead):
        for entry_id, raw in page:
            try:
                d = msgpack.unpackb(raw, raw=True)
                payload, why = d.get(b"data", b""), d.get(b"reason", b"")
            except Exception:  # not written by the fleet
                continue
            if isinstance(payload, bytes) and probe.matches(payload) is not None:
                return {"state": "dead", "entry_id": entry_id.decode(errors="replace"),
                        "reason": why.decode(errors="replace") if isinstance(why, bytes)
                        else str(why), "at": d.get(b"at")}
    return None
