"""Parameters of the fleet's scalable Bloom filter (the filter itself runs in lua/bloom.lua).

Slice ``i`` holds ``n0 * 2**i`` fingerprints at false-positive rate ``p * 2**-i``, with
``m = ceil(-n ln p / ln(2)**2)`` bits and ``k = ceil(-log2 p)`` hash functions (Almeida et al.,
"Scalable Bloom Filters", 2007).  For n0 = 1,000,000 and p = 0.001 slice 0 takes
14,377,588 bits = 1.80 MB; a Redis SET of the same fingerprints takes about 64 MB
(bench/bench_bloom.py).  Slices are created at full
size; lua/bloom.lua describes the two bit layouts.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from scrapy_fleet.keys import BLOOM_MAX_SLICES

FINGERPRINT_BYTES = 12
#: Redis's largest bit offset + 1: no slice may be larger (lua/bloom.lua, MAX_BITS)
MAX_SLICE_BITS = 2**32


def bloom_key(fingerprint: bytes) -> bytes:
    """12 uniform bytes for the Bloom filter from a Scrapy request fingerprint (any length).

    BLAKE2b spreads any fingerprinter's output (even a non-uniform custom one) evenly; its two
    48-bit halves seed the double hashing in lua/bloom.lua.
    """
    return hashlib.blake2b(fingerprint, digest_size=FINGERPRINT_BYTES).digest()


@dataclass(frozen=True)
class SliceParams:
    capacity: int  #: fingerprints the slice takes before the next slice opens
    error_rate: float  #: false-positive rate of the slice when full
    bits: int  #: m, size of the slice in bits
    hashes: int  #: k

    @property
    def bytes(self) -> int:
        return (self.bits + 7) // 8


#: bits of one block of the blocked layout (lua/bloom.lua, v = 2): a fingerprint's k bits
#: all lie in one block, read with one GETRANGE
BLOCK_BITS = 4096


def slice_params(capacity: int, error_rate: float, index: int) -> SliceParams:
    """Parameters of slice *index*, computed exactly as lua/bloom.lua does."""
    n = capacity * 2**index
    p = error_rate * 0.5**index
    m = math.ceil(-n * math.log(p) / (math.log(2) ** 2))
    k = math.ceil(-math.log(p) / math.log(2))
    return SliceParams(n, p, m, k)


def bit_offsets(key: bytes, capacity: int, error_rate: float, index: int = 0,
                blocked: bool = True) -> list[int]:
    """Offsets of the k bits of Bloom *key* (12 bytes) in slice *index*, as lua/bloom.lua
    places them: blocked (``v`` 2: filters created now whose first slice has 4096 bits at
    least), the block ``h1 mod floor(m / 4096)`` (h1 = bytes 1-6) and in it
    ``(a + i*b) mod 4096`` (a = bytes 7-9, b = bytes 10-12, made odd); else (``v`` 1)
    ``(h1 + i*h2) mod m`` (h2 = bytes 7-12)."""
    sp = slice_params(capacity, error_rate, index)
    h1 = int.from_bytes(key[:6], "big")
    if not blocked:
        h2 = int.from_bytes(key[6:], "big")
        return [(h1 + i * h2) % sp.bits for i in range(sp.hashes)]
    base = (h1 % (sp.bits // BLOCK_BITS)) * BLOCK_BITS
    a = int.from_bytes(key[6:9], "big") % BLOCK_BITS
    b = int.from_bytes(key[9:12], "big") % BLOCK_BITS | 1
    return [base + (a + i * b) % BLOCK_BITS for i in range(sp.hashes)]


def total_capacity(capacity: int) -> int:
    """Fingerprints the filter holds before its last slice is full."""
    return sum(capacity * 2**i for i in range(BLOOM_MAX_SLICES))
