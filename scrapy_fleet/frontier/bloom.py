"""Parameters of the fleet's scalable Bloom filter (the filter itself runs in lua/bloom.lua).

Slice ``i`` holds ``n0 * 2**i`` fingerprints at false-positive rate ``p * 2**-i``, with
``k = ceil(-log2 p)`` hash functions (Almeida et al., "Scalable Bloom Filters", 2007).  The
classic layout (layout 1, filters written before the blocked one) has
``m = ceil(-n ln p / ln(2)**2)`` bits; the blocked layout (layout 2, every filter created now:
all k bits of a fingerprint in one 4096-bit block, read with one GETRANGE) has
``ceil(m * 1.02 / 4093)`` blocks of 4096 bits, the 2 % spare bringing the blocks' uneven load
back to p (lua/bloom.lua gives the sources).  For n0 = 1,000,000 and p = 0.001 slice 0 takes
1,834,496 bytes, in the same 1.75 MiB allocation as the classic layout's 14,377,588 bits
(1.80 MB); a Redis SET of the same fingerprints takes
about 64 MB (bench/bench_bloom.py).  Slices are created at full size (see lua/bloom.lua).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from scrapy_fleet.keys.calls import BLOOM_MAX_SLICES

FINGERPRINT_BYTES = 12
#: layouts of a slice (lua/bloom.lua, metadata field ``v``): 1 classic, 2 blocked
CLASSIC, BLOCKED = 1, 2
#: the layout of a filter created now
LAYOUT = BLOCKED
BLOCK_BITS = 4096
#: bits used in a block (a prime: double hashing modulo a prime)
BLOCK_PRIME = 4093
#: extra bits of the blocked layout over the classic m, for the same false-positive rate
BLOCK_SPARE = 1.02
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


def slice_params(capacity: int, error_rate: float, index: int,
                 layout: int = LAYOUT) -> SliceParams:
    """Parameters of slice *index* of a filter of *layout* (CLASSIC or BLOCKED), computed
    exactly as lua/bloom.lua does."""
    n = capacity * 2**index
    p = error_rate * 0.5**index
    m = math.ceil(-n * math.log(p) / (math.log(2) ** 2))
    k = math.ceil(-math.log(p) / math.log(2))
    if layout == BLOCKED:
        m = math.ceil(m * BLOCK_SPARE / BLOCK_PRIME) * BLOCK_BITS
    return SliceParams(n, p, m, k)


def total_capacity(capacity: int) -> int:
    """Fingerprints the filter holds before its last slice is full."""
    return sum(capacity * 2**i for i in range(BLOOM_MAX_SLICES))
