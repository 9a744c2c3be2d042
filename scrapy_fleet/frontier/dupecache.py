"""The worker's cache of Bloom keys known to be in the fleet's filter (FLEET_DUPEFILTER_CACHE).

:class:`DupeCache` leaves known duplicates out of a call; :func:`expand_result` gives the reply of
such a call the indexes of the whole batch again; :class:`StaleDupeCache` is the refusal of a
call that left keys out of a filter that has since been replaced.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from scrapy_fleet.errors import FleetError
from scrapy_fleet.frontier.protocol import CallBatch, CallResult

#: Bloom keys a worker remembers as being in the filter (FLEET_DUPEFILTER_CACHE's default)
DUPE_CACHE_SIZE = 100_000
STALE_GENERATION = "stale filter generation"


class StaleDupeCache(FleetError):
    """The frontier refused a call that left known duplicates out: the Bloom filter is not
    the one the DupeCache knew (purge, failover).  The cache is cleared; nothing changed."""


class DupeCache:
    """Bloom keys this worker knows to be in the fleet's Bloom filter, at most *size* of them
    (the oldest are forgotten first).

    A Bloom filter never forgets a fingerprint, so a key seen in the filter stays a duplicate
    until the filter itself is replaced (``purge``): the cache holds the filter's generation
    id (lua/bloom.lua, field ``g``) with its keys, and a call that leaves keys out names that
    generation (``bg``); under another generation the script refuses the call before any
    write and the client clears the cache and sends the full call again.  A failover to a
    replica that lacked the latest writes rolls the filter back without a new generation:
    the script then finds the reply cache of the client's previous cached call gone
    (replication is in order; a call without events caches no reply and leaves that one in
    place, lua/step_reply.lua), refuses a call that leaves keys out, and says so in every
    reply (``pl``), and the cache is cleared.  A link left out costs Redis nothing (no
    payload, no bit read).
    """

    def __init__(self, size: int = DUPE_CACHE_SIZE) -> None:
        self.size = size
        self.gen: str | None = None
        self._keys: dict[bytes, None] = {}
        self.hits = 0  #: pushes left out so far (known duplicates)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def clear(self) -> None:
        self._keys.clear()
        self.gen = None

    def knows(self, key: bytes, parent: str | None = None) -> bool:
        """A link of Bloom key *key* (found by the lease of entry id *parent*, None: a
        request of its own) is a duplicate the next call may leave out (unencoded: the
        worker's LeaseBook)."""
        return self.gen is not None and key in self._keys

    def split(self, batch: CallBatch) -> tuple[CallBatch, list[int], int]:
        """(the batch to send, index in *batch* of each push sent, pushes left out).  A push
        with a sitemap lastmod (``Push.lastmod``, docs/recrawl.md) is always sent: the
        frontier compares it with the URL's last fetch."""
        if not self._keys or self.gen is None or not batch.pushes:
            return batch, list(range(len(batch.pushes))), 0
        kept: list[int] = []
        for i, p in enumerate(batch.pushes):
            if not (p.key and p.key in self._keys) or p.lastmod:
                kept.append(i)
        left_out = len(batch.pushes) - len(kept)
        self.hits += left_out
        if not left_out:
            return batch, kept, 0
        sent = replace(batch, pushes=[batch.pushes[i] for i in kept])
        return sent, kept, left_out

    def learn(self, sent: CallBatch, result: CallResult) -> None:
        """Remember the keys of *sent* that *result* found in the filter or added to it."""
        self.learn_keys([p.key for p in sent.pushes], result.push_flags, result.seen,
                        result.bloom_gen, result.prev_lost)

    def learn_keys(self, sent: list[bytes], flags: list[int], seen: list[int],
                   gen: str | None, prev_lost: bool) -> None:
        """Remember the Bloom keys of a call's pushes (*sent*, in its order) that it added to
        the filter (*flags*) or found in it (*seen*, indexes), under filter generation *gen*;
        *prev_lost*: the call found the evidence of the client's previous call gone (the
        state may have rolled back): nothing learnt before holds."""
        if prev_lost:
            self.clear()
        if gen is None:
            return
        if gen != self.gen:
            self._keys.clear()
            self.gen = gen
        if self.size <= 0:
            return
        keys = self._keys
        for i, flag in enumerate(flags):
            if flag and i < len(sent) and sent[i]:
                keys[sent[i]] = None
        for i in seen:
            if i < len(sent) and sent[i]:
                keys[sent[i]] = None
        over = len(keys) - self.size
        if over > 0:
            for key in list(itertools.islice(keys, over + self.size // 10)):
                del keys[key]


def expand_result(result: CallResult, kept: list[int], total: int, left_out: int) -> CallResult:
    """*result* of a call sent without the pushes the cache left out, with indexes of the
    whole batch again: a left-out push is a duplicate (flag 0, in ``seen``)."""
    if not left_out:
        return result
    flags = [0] * total
    for j, flag in enumerate(result.push_flags):
        if j < len(kept):
            flags[kept[j]] = flag
    sent_seen = {kept[j] for j in result.seen if j < len(kept)}
    kept_set = set(kept)
    result.seen = sorted(sent_seen | {i for i in range(total) if i not in kept_set})
    result.push_flags = flags
    result.refused = [kept[j] for j in result.refused if j < len(kept)]
    result.duplicates += left_out
    result.cached = left_out
    return result
