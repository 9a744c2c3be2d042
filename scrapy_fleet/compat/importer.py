"""``scrapy fleet import-scrapy-redis SPIDER``: a scrapy-redis crawl's pending requests and
seen fingerprints into the fleet's frontier and Bloom filter (docs/from-scrapy-redis.md).

scrapy-redis keeps its pending requests pickled (``<spider>:requests``: a sorted set for its
default PriorityQueue, score -priority; a list for its FIFO and LIFO queues) and the
fingerprints it has seen as hex strings (``<spider>:dupefilter``, a set).  Unpickling runs
whatever code the bytes name, so the requests are read only with ``--trust-pickles`` (the
operator says whoever could write that Redis is trusted); without it the import refuses in
one line and reads nothing.  Nothing else of the fleet ever unpickles.

The requests are rebuilt with the spider (callbacks by name, ``Request.from_dict``), encoded
with the fleet's codec and pushed (filtered ones through the Bloom filter), then the
fingerprints are added to the Bloom filter, only when the project's fingerprinter gives
scrapy-redis's bytes (:mod:`scrapy_fleet.compat.fingerprint`); else they are left out, with
one line saying so.  Their keys are left as they were.  A crawl with FLEET_PARTITIONS > 1 is
refused (its Bloom filters are per partition, by host, which a fingerprint does not name).
"""

from __future__ import annotations

import pickle
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from scrapy_fleet import codec, lua, redis_client
from scrapy_fleet.compat.fingerprint import matches
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.keys.fleet import ScrapyRedisKeys
from scrapy_fleet.politeness import hosts as politeness

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.frontier.admin import FrontierAdmin

#: entries per push and fingerprints per Bloom call
BATCH = 500
#: reply cache lifetime of a Bloom call (ms), as the dupefilter's
OP_TTL_MS = 60_000


def _pending(client: Any, key: str) -> tuple[str, int]:
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    if kind == "zset":
        return kind, int(client.zcard(key))
    if kind == "list":
        return kind, int(client.llen(key))
    return kind, 0


def _raw_requests(client: Any, key: str, kind: str) -> Iterator[bytes]:
    """The pickled requests in the order scrapy-redis pops them."""
    if kind == "zset":
        yield from client.zrange(key, 0, -1)
    elif kind == "list":
        yield from client.lrange(key, 0, -1)


def _requests(raws: Iterator[bytes], spider: Spider) -> Iterator[Request]:
    from scrapy.utils.request import request_from_dict

    for raw in raws:
        yield request_from_dict(pickle.loads(raw), spider=spider)  # --trust-pickles only


def refusal(client: Any, config: FleetConfig, spider_name: str, trusted: bool) -> str | None:
    """Why the import of *spider_name*'s crawl is refused before anything is read or
    written (the one line to print), or None."""
    requests = ScrapyRedisKeys(spider_name).requests
    if config.partitions > 1:
        return ("error: import-scrapy-redis imports into a crawl with FLEET_PARTITIONS = 1 "
                "only (its Bloom filters are per partition, by host): nothing imported")
    _, pending = _pending(client, requests)
    if pending and not trusted:
        return (f"error: {requests} holds {pending} pickled requests, and unpickling runs "
                "whatever code the data names: pass --trust-pickles only if everyone who "
                "could write to this Redis is trusted (nothing was read)")
    return None


def run(admin: FrontierAdmin, config: FleetConfig, spider: Spider,
        fingerprint: Callable[[Request], bytes], trusted: bool, out: TextIO = sys.stdout,
        err: TextIO = sys.stderr) -> int:
    """Import the crawl of *spider* (module docstring); returns the exit status: 0 done,
    2 refused (pickles without *trusted*, a partitioned crawl), 3 the frontier refused some
    requests (full: run it again once it drained; filtered requests are not pushed twice)."""
    keys = ScrapyRedisKeys(spider.name)
    client = admin.client
    refused_why = refusal(client, config, spider.name, trusted)
    if refused_why is not None:
        print(refused_why, file=err)
        return 2
    kind, pending = _pending(client, keys.requests)
    pushed, duplicates, refused = _push(admin, config, spider, fingerprint,
                                        _requests(_raw_requests(client, keys.requests, kind),
                                                  spider))
    seen = int(client.scard(keys.dupefilter))
    added = 0
    if seen and matches(fingerprint):
        added = _add_fingerprints(admin, config, client, keys.dupefilter)
    elif seen:
        print(f"warning: the {seen} fingerprints of {keys.dupefilter} were not imported: this "
              "project's REQUEST_FINGERPRINTER_CLASS does not make scrapy-redis's fingerprints "
              "(set it to scrapy_fleet.compat.fingerprint.ScrapyRedisFingerprinter, or let the "
              "fleet fetch those pages again: docs/from-scrapy-redis.md)", file=err)
    print(f"imported {pushed} of {pending} pending requests ({duplicates} already known, "
          f"{refused} refused: frontier full) and {added} of {seen} fingerprints", file=out)
    return 3 if refused else 0


def _push(admin: FrontierAdmin, config: FleetConfig, spider: Spider,
          fingerprint: Callable[[Request], bytes], requests: Iterator[Request]
          ) -> tuple[int, int, int]:
    pushed = duplicates = refused = 0
    batch: list[tuple[Any, ...]] = []

    def flush() -> None:
        nonlocal pushed, duplicates, refused
        if batch:
            result = admin.push(batch)
            refused += len(result.refused)
            pushed += result.pushed
            duplicates += result.duplicates
            batch.clear()
    for request in requests:
        key = b"" if request.dont_filter else bloom_key(fingerprint(request))
        host = politeness.host_key(request.url, config.politeness.host_key)
        batch.append((key, request.priority, codec.encode(request, spider), 0, host))
        if len(batch) >= BATCH:
            flush()
    flush()
    return pushed, duplicates, refused


def _add_fingerprints(admin: FrontierAdmin, config: FleetConfig, client: Any,
                      key: str) -> int:
    """Add the hex fingerprints of set *key* to the crawl's Bloom filter; returns how many
    were new to it."""
    script = lua.load(client, "bloom_add.lua")
    added, prev = 0, uuid.uuid4().hex
    batch: list[bytes] = []

    def flush() -> int:
        nonlocal prev
        op = uuid.uuid4().hex
        args = [config.dupefilter.capacity, config.dupefilter.error_rate, OP_TTL_MS, *batch]
        reply = redis_client.call_retrying(
            lambda: script(keys=admin.keys.bloom_add_keys(op, prev), args=args),
            config.redis_url, config.redis_retries)
        prev = op
        batch.clear()
        import msgpack

        return sum(msgpack.unpackb(reply, raw=True))
    for raw in client.sscan_iter(key, count=1000):
        try:
            batch.append(bloom_key(bytes.fromhex(raw.decode())))
        except ValueError:
            continue  # not a scrapy-redis fingerprint
        if len(batch) >= BATCH:
            added += flush()
    if batch:
        added += flush()
    return added
