"""The known duplicates of a partitioned crawl's worker (``FLEET_PARTITIONS`` > 1,
docs/partitions.md); no IO.

Each partition's frontier client keeps its own cache of the Bloom keys known to be in that
partition's filter (FLEET_DUPEFILTER_CACHE / P keys) and leaves those links out of its calls,
as on P = 1.  :class:`PartitionDupes` is the worker's LeaseBook's view of them: a link found
by a page of partition p whose key p's cache knows is a link for p itself (one URL, one host,
one partition), which the call to p leaves out, so the book buffers it unencoded, as on
P = 1 (encoding each of them cost a P = 8 worker 9 request encodings and host keys per page
more than P = 1: bench/README.md).  Links for other partitions are always encoded (the lean
pushes carry them all).

Such a link may wait in the partitioned client (a part held for the partition's next call, a
page waiting for its foreign links, a partition that could not be reached) while its
partition's cache forgets its key (the oldest keys go; all of them after a purge or a lost
reply cache): :func:`materialize` encodes it before it is sent again, as the pump's
``LeaseBook.materialize`` does for the links it holds.  A part whose call is refused for a
stale filter generation is sent with ``resend`` False (partitions.py): it fails as an
unreachable partition's does and is held, then encoded by :func:`materialize`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scrapy_fleet.frontier.dupecache import DupeCache
from scrapy_fleet.frontier.protocol import CallBatch, unencoded
from scrapy_fleet.frontier.records import Push
from scrapy_fleet.frontier.routing import split_ref

#: encodes a link buffered unencoded: (payload, host key), or None when it cannot be encoded
#: (``LeaseBook.encode_link``: logged, counted and recorded as failed)
Encoder = Callable[[Any], "tuple[bytes, str] | None"]


class PartitionDupes(DupeCache):
    """The book's view of the partitions' caches *caches* (indexed by partition)."""

    def __init__(self, caches: list[DupeCache]) -> None:
        super().__init__(0)
        self.caches = caches
        #: the last parent asked about and its partition's cache (a page's links come
        #: together, and the pump asks again for each before its call)
        self._last: tuple[str, DupeCache] = ("", DupeCache(0))

    def knows(self, key: bytes, parent: str | None = None) -> bool:
        """*key* is known in the cache of the partition of the lease *parent* (``"<p>:<id>"``;
        None, a request of its own: never)."""
        if parent is None:
            return False
        if parent is not self._last[0]:
            self._last = (parent, self.caches[split_ref(parent)[0]])
        return self._last[1].knows(key)


def materialize(batch: CallBatch, caches: list[DupeCache], encode: Encoder) -> None:
    """Encode, in place, the links of *batch* (pump format, a held one) buffered unencoded
    whose partition's cache (the partition of their page) no longer knows them; those that
    cannot be encoded are dropped (recorded as failed by *encode*)."""
    if unencoded(batch):
        _encode(batch, encode, lambda push: caches[
            split_ref(batch.acks[push.group - 1].entry)[0]].knows(push.key))


def encode_part(batch: CallBatch, encode: Encoder) -> None:
    """Encode, in place, every link of *batch* (a partition's part, kept as sent) buffered
    unencoded: its call was refused for a stale filter generation (nothing ran; the cache
    that knew them is cleared), so it goes again with them all; those that cannot be encoded
    are dropped (recorded as failed by *encode*)."""
    _encode(batch, encode, lambda push: False)


def _encode(batch: CallBatch, encode: Encoder, known: Callable[[Push], bool]) -> None:
    """Encode, in place, the links of *batch* buffered unencoded but those *known* still
    leaves out; those that cannot be encoded are dropped."""
    pushes = []
    for push in batch.pushes:
        if type(push.payload) is bytes or known(push):
            pushes.append(push)
        elif (got := encode(push.payload)) is not None:
            pushes.append(push.encoded(*got))
    batch.pushes = pushes
