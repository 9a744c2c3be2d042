"""The worker's two records of a frontier call: a :class:`Push` and an :class:`Ack`.

Each is one typed shape inside the worker (a ``NamedTuple``: as cheap to build as the plain
tuple it replaces), packed to the wire here only: :func:`push_row` (a row of lua/frontier.lua's
``p``), :func:`lean_row` (a row of lua/push_lean.lua's ``p``) and :func:`ack_row` (a row of
lua/frontier.lua's ``a``).  The rows are those the Lua scripts read (lua/frontier.lua
documents each field); they are the same bytes the worker sent before the records existed
(tests/unit/test_records.py pins them).

Callers outside the worker (the push helper, commands/, tests) may still hand a client plain
tuples of the documented layouts; protocol.typed turns a batch's into records at the client's
entry, :func:`as_push`, :func:`as_lean` and :func:`as_ack` one row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

_new = tuple.__new__


class Push(NamedTuple):
    """One request to push.  ``key``: its 12-byte Bloom key (``b""``: ``dont_filter``, never
    checked); ``priority``: its clamped priority (int); ``payload``: the encoded request
    (bytes), or the Request itself while a worker's cache of known duplicates leaves it
    unencoded (frontier/partdupes.py); ``group``: 0 for a push without a parent, k (1-based)
    for a link of the call's k-th acknowledgement; ``host``: the host name its per-host bound
    counts it under (``""``: none); ``delay``: ms it stays deferred before it is queued;
    ``lastmod``: a sitemap's ``<lastmod>``, epoch seconds (0: none; docs/recrawl.md);
    ``source``: for a stored response pushed to another partition, ``(partition, entry
    number)`` of its page (routing.stored_source; ``()``: none, only a lean push has one)."""

    key: bytes
    priority: int
    payload: Any
    group: int = 0
    host: str = ""
    delay: int = 0
    lastmod: int = 0
    source: tuple[int, int] | tuple[()] = ()

    def in_group(self, group: int) -> Push:
        """This push as a link of the call's *group*-th acknowledgement (0: no parent)."""
        return Push(self.key, self.priority, self.payload, group, self.host, self.delay,
                    self.lastmod, self.source)

    def encoded(self, payload: bytes, host: str) -> Push:
        """This push with its Request encoded: *payload*, and the *host* it counts under."""
        return Push(self.key, self.priority, payload, self.group, host, self.delay,
                    self.lastmod, self.source)

    def lean(self, source: tuple[int, int] | tuple[()] = ()) -> Push:
        """This push as a lean push into another partition (no group there; *source*: its
        stored response's page, or ``()``)."""
        return Push(self.key, self.priority, self.payload, 0, self.host, self.delay,
                    self.lastmod, source)


class Ack(NamedTuple):
    """One acknowledgement.  ``entry``: the leased entry id; ``token``: its fencing token;
    ``failure``: the record of a request that failed for good (msgpack bytes,
    failures.record.FailureRecord.encode; None: none), stored with its acknowledgement in the
    same atomic call (lua/failed.lua); ``unstorable``: the records of the links it found that
    the worker could not encode (reason ``codec/...``); ``defer``: 1 defers the request
    instead (a link of it was refused in another partition, docs/partitions.md);
    ``revisit``: its revisit record ``[interval ms, host, score, payload[, bloom key, last
    fetch s]]`` (scheduled again at its interval, docs/recrawl.md, lua/step_revisit.lua), or
    ``b""`` (or its 12-byte Bloom key: its sitemap-lastmod place entry goes too): not
    revisited; None: the crawl does not recrawl."""

    entry: str
    token: int
    failure: bytes | None = None
    unstorable: Sequence[bytes] = ()
    defer: int = 0
    revisit: Any = None

    def at(self, entry: str) -> Ack:
        """This acknowledgement naming the entry *entry* (a partition's own id of it)."""
        return Ack(entry, self.token, self.failure, self.unstorable, self.defer, self.revisit)

    def deferred(self) -> Ack:
        """This request deferred instead of acknowledged: its failure record goes with it
        (``b""``: none), its unstorable and revisit records do not."""
        return Ack(self.entry, self.token, self.failure or b"", (), 1)


def push_row(p: Push) -> list[Any]:
    """*p* as a row of lua/frontier.lua's ``p``: ``[key, priority, payload, group, host,
    delay ms, lastmod s]`` (``source`` is a lean push's only)."""
    return push_rows([p])[0]


def push_rows(pushes: list[Push]) -> list[list[Any]]:
    """:func:`push_row` of each of *pushes*: its first seven fields (a record's numbers are
    ints: the worker's are, :func:`as_push` makes a caller's so; one comprehension, as a call
    packs hundreds)."""
    return [[*p[:7]] for p in pushes]


def links(outs: Iterable[tuple[Any, ...]], group: int) -> list[Push]:
    """The pushes of the lease book's buffered requests *outs* (rows of frontier/leases.py's
    ``Out``: url, key, priority, payload, host, delay ms, lastmod s) as links of the call's
    *group*-th acknowledgement (0: without a parent).  Built as ``Push(...)`` builds them,
    through ``tuple.__new__`` (the pump's hot path: a third of the cost of calling the
    NamedTuple's ``__new__``, bench/bench_records.py)."""
    return [_new(Push, (key, priority, payload, group, host, delay, lastmod, ()))
            for _, key, priority, payload, host, delay, lastmod in outs]


def lean_row(p: Push) -> list[Any]:
    """*p* as a row of lua/push_lean.lua's ``p``: ``[key, priority, payload, host, delay ms,
    lastmod s[, partition, entry number]]`` (no group: a lean push has no parent there)."""
    return [p.key, int(p.priority), p.payload, p.host, int(p.delay), int(p.lastmod),
            *p.source]


def ack_row(a: Ack) -> list[Any]:
    """*a* as a row of lua/frontier.lua's ``a``, as short as what it carries: ``[id, token]``,
    then the failure record (``b""``: none once later fields follow), the unstorable
    records, the deferral flag, the revisit record."""
    if a.revisit is not None:
        return [a.entry, a.token, a.failure or b"", a.unstorable, a.defer, a.revisit]
    if a.defer:
        return [a.entry, a.token, a.failure or b"", a.unstorable, a.defer]
    if a.unstorable:
        return [a.entry, a.token, a.failure or b"", a.unstorable]
    if a.failure is not None:
        return [a.entry, a.token, a.failure]
    return [a.entry, a.token]


def as_push(row: Sequence[Any]) -> Push:
    """*row*, a push record or a tuple of the pump's layout ``(key, priority, payload[,
    group, host, delay, lastmod])``, as a record."""
    if isinstance(row, Push):
        return row
    p = Push(*row)
    return Push(p.key, int(p.priority), p.payload, int(p.group), p.host, int(p.delay),
                int(p.lastmod))


def as_lean(row: Sequence[Any]) -> Push:
    """*row*, a push record or a tuple of the lean layout ``(key, priority, payload, host[,
    delay, lastmod[, partition, entry number]])`` (commands/partitioned.py), as a record."""
    if isinstance(row, Push):
        return row
    push = Push(row[0], row[1], row[2], 0, *row[3:6])
    return push.lean(tuple(row[6:8])) if row[6:8] else push


def as_ack(row: Sequence[Any]) -> Ack:
    """*row*, an acknowledgement record or a tuple ``(entry id, token[, failure[,
    unstorable[, defer[, revisit]]]])``, as a record."""
    return row if isinstance(row, Ack) else Ack(*row)

