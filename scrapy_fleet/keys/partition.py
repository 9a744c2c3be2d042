"""Partitions (``FLEET_PARTITIONS`` = P > 1, docs/partitions.md): which partition holds a
host, and the hash tag of each partition (the layout: :mod:`scrapy_fleet.keys.crawl`)."""

from __future__ import annotations

import zlib
from functools import lru_cache

#: slots of a Redis Cluster
CLUSTER_SLOTS = 16384


def partition_of(host: str, parts: int) -> int:
    """The partition (0 .. *parts* - 1) of a host key: CRC32 of its UTF-8 bytes mod *parts*,
    the same on every machine and Python (never ``hash()``)."""
    if parts <= 1:
        return 0
    return zlib.crc32(host.encode("utf-8", "surrogatepass")) % parts


@lru_cache(maxsize=65536)
def partition_tag(crawl_id: str, p: int, parts: int) -> str:
    """The hash tag of partition *p* of *parts*: ``<crawl id>/<p>.<salt>``, the salt being the
    smallest integer that puts the tag's cluster slot in the middle half of the p-th of
    *parts* equal slot ranges (the whole range when it is narrower than 4 slots); at most
    ~2 x *parts* CRC16 computations.

    Raises:
        ValueError: *p* is not in 0 .. *parts* - 1.
    """
    from redis.crc import key_slot

    if not 0 <= p < parts:
        raise ValueError(f"partition {p} is not in 0..{parts - 1}")
    lo, hi = p * CLUSTER_SLOTS // parts, (p + 1) * CLUSTER_SLOTS // parts
    if hi - lo >= 4:
        lo, hi = lo + (hi - lo) // 4, hi - (hi - lo) // 4
    for salt in range(CLUSTER_SLOTS * 64):
        tag = f"{crawl_id}/{p}.{salt}"
        if lo <= key_slot(tag.encode()) < hi:
            return tag
    raise AssertionError("no salt found")  # CRC16 reaches every slot well before this
