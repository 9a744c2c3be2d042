"""A read-only membership test of the fleet's Bloom filter, from Python, without a script.

``scrapy fleet url`` (commands/lookup.py) runs as the ``monitor`` ACL role, which may not run
scripts; so the bits are read with plain reads: one ``GETRANGE`` of the fingerprint's 512-byte
block per slice (blocked layout) or ``k`` ``GETBIT`` (classic layout), pipelined.  The bit
positions are those of lua/bloom.lua (``bloom_block`` and ``bloom_offsets``: triple hashing in
4093-bit blocks, Dillinger & Manolios, FMCAD 2004; double hashing over the slice, Kirsch &
Mitzenmacher 2006), computed with the slice parameters of frontier/bloom.py ``slice_params``;
tests/lua/test_bloom_read.py checks both against the script on the same filter.

A Bloom filter has no false negatives: a key this says is absent was never added.
"""

from __future__ import annotations

from typing import Any

from scrapy_fleet.frontier.bloom import (
    BLOCK_BITS,
    BLOCK_PRIME,
    BLOCKED,
    CLASSIC,
    slice_params,
)
from scrapy_fleet.keys.crawl import CrawlKeys


def _halves(key: bytes) -> tuple[int, int]:
    """The two 48-bit big-endian halves of a 12-byte Bloom key (lua/bloom.lua bloom_halves)."""
    return int.from_bytes(key[:6], "big"), int.from_bytes(key[6:12], "big")


def block_positions(key: bytes, blocks: int, k: int) -> tuple[int, list[int]]:
    """Blocked layout: ``(block index, the k bit positions inside the block)`` of *key*."""
    h1, h2 = _halves(key)
    x = h2 % BLOCK_PRIME
    b1 = h1 % blocks
    block = (b1 + h2 % blocks) % blocks
    step = 1 + ((h2 - x) // BLOCK_PRIME) % (BLOCK_PRIME - 1)
    inc = ((h1 - b1) // blocks) % BLOCK_PRIME
    out = []
    for _ in range(k):
        out.append(x)
        x += step
        if x >= BLOCK_PRIME:
            x -= BLOCK_PRIME
        step += inc
        if step >= BLOCK_PRIME:
            step -= BLOCK_PRIME
    return block, out


def classic_positions(key: bytes, m: int, k: int) -> list[int]:
    """Classic layout: the k bit offsets of *key* in a slice of *m* bits."""
    h1, h2 = _halves(key)
    x, step = h1 % m, h2 % m
    out = []
    for _ in range(k):
        out.append(x)
        x = (x + step) % m
    return out


def contains(client: Any, keys: CrawlKeys, key: bytes) -> bool:
    """Whether the crawl's filter (*keys*: the URL's partition's) holds the 12-byte Bloom key
    *key* (frontier/bloom.py ``bloom_key``).  False is certain; True is wrong with the
    filter's false-positive rate.  One HMGET, then one pipeline of reads.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    n0, p, slices, v = client.hmget(keys.bloom_meta, "n0", "p", "slices", "v")
    if n0 is None or not slices:
        return False
    layout = BLOCKED if v is not None and int(v) == BLOCKED else CLASSIC
    tests: list[tuple[int, list[int]]] = []  # (slice, bits) per slice
    with client.pipeline(transaction=False) as pipe:
        for s in range(int(slices)):
            params = slice_params(int(n0), float(p), s, layout)
            if layout == BLOCKED:
                block, bits = block_positions(key, params.bits // BLOCK_BITS, params.hashes)
                start = block * (BLOCK_BITS // 8)
                pipe.getrange(keys.bloom_slice(s), start, start + BLOCK_BITS // 8 - 1)
                tests.append((s, bits))
            else:
                for offset in classic_positions(key, params.bits, params.hashes):
                    pipe.getbit(keys.bloom_slice(s), offset)
                tests.append((s, []))
        replies = pipe.execute()
    if layout == CLASSIC:
        per = [slice_params(int(n0), float(p), s, CLASSIC).hashes for s in range(int(slices))]
        at = 0
        for k in per:
            if all(replies[at:at + k]):
                return True
            at += k
        return False
    for (_, bits), raw in zip(tests, replies, strict=True):
        if all(_bit(raw, x) for x in bits):
            return True
    return False


def _bit(block: bytes, x: int) -> bool:
    """Bit *x* of *block* (bit 0: the most significant of the first byte, as SETBIT counts;
    bytes past the end of a growing slice are zeros)."""
    i = x // 8
    return i < len(block) and bool(block[i] & (0x80 >> (x % 8)))
