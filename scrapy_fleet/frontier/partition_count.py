"""The crawl's P (FLEET_PARTITIONS), stored with the crawl when it is created
(``fleet:{<crawl>}:partitions``, docs/partitions.md): a worker or command with another value is
refused in one line.  Re-exported by frontier/partitions.py."""

from __future__ import annotations

from typing import Any

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier import layout
from scrapy_fleet.frontier.protocol import as_int
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys


def _verdict(keys: CrawlKeys, parts: int, stored: Any, p1_exists: int) -> FleetConfigError | None:
    if stored is not None:
        have = as_int(stored, None)
        if have == parts:
            return None
        shown = stored.decode(errors="replace") if isinstance(stored, bytes) else stored
        return FleetConfigError(
            f"FLEET_PARTITIONS={parts} does not match crawl {keys.crawl_id!r}, created with "
            f"FLEET_PARTITIONS={shown}: set it to that value, or purge the crawl to start it "
            "again")
    if parts > 1 and p1_exists:
        return FleetConfigError(
            f"FLEET_PARTITIONS={parts} does not match crawl {keys.crawl_id!r}, created with "
            "FLEET_PARTITIONS=1: set it to 1, or purge the crawl to start it again")
    return None


def check_sync(client: Any, keys: CrawlKeys, parts: int, create: bool = True) -> None:
    """Refuse a worker or command whose FLEET_PARTITIONS differs from the crawl's, and store
    *parts* (P > 1) with a crawl that has none yet when *create* (SET NX: the first wins).
    P = 1 writes nothing here (a crawl without the key is a P = 1 crawl; a P = 1 worker
    claims a new crawl with :func:`claim_one_sync` first).

    Two first workers at the same moment: the P > 1 one writes the key, then looks for a
    P = 1 crawl again (a P = 1 worker writes its layout key, then reads this key): one of them
    sees the other, the one that sees takes its write back and refuses.

    Raises:
        FleetConfigError: one line naming the crawl, both values and what to do.
    """
    stored = client.get(keys.partitions)
    p1 = 0 if stored is not None or parts == 1 else client.exists(keys.marker, keys.layout)
    error = _verdict(keys, parts, stored, p1)
    if error is None and stored is None and parts > 1 and create:
        if not client.set(keys.partitions, parts, nx=True):
            error = _verdict(keys, parts, client.get(keys.partitions), 0)
        elif client.exists(keys.marker, keys.layout):  # a P = 1 worker began meanwhile
            client.delete(keys.partitions)
            error = _verdict(keys, parts, None, 1)
    if error is not None:
        raise error


async def check_async(client: Any, keys: CrawlKeys, parts: int, create: bool = True) -> None:
    """:func:`check_sync` with an asyncio client."""
    stored = await client.get(keys.partitions)
    p1 = 0 if stored is not None or parts == 1 else await client.exists(keys.marker,
                                                                          keys.layout)
    error = _verdict(keys, parts, stored, p1)
    if error is None and stored is None and parts > 1 and create:
        if not await client.set(keys.partitions, parts, nx=True):
            error = _verdict(keys, parts, await client.get(keys.partitions), 0)
        elif await client.exists(keys.marker, keys.layout):
            await client.delete(keys.partitions)
            error = _verdict(keys, parts, None, 1)
    if error is not None:
        raise error


def claim_one_sync(client: Any, keys: CrawlKeys) -> None:
    """A P = 1 worker's start on a crawl: write the crawl's layout key (SET NX, the value its
    first frontier call writes anyway: no new key), then :func:`check_sync`, so that a P > 1
    worker starting the same new crawl at the same moment sees one or the other (see there).
    A refused claim takes back the layout key it wrote.

    Raises:
        FleetConfigError: the crawl was created with P > 1 (one line, as check_sync).
    """
    wrote = client.set(keys.layout, LAYOUT_VERSION, nx=True)
    try:
        check_sync(client, keys, 1)
    except FleetConfigError:
        if wrote and not client.exists(keys.marker):
            client.delete(keys.layout)
        raise


def start_sync(client: Any, keys: CrawlKeys, parts: int, create: bool, *,
               layout_checked: bool = False) -> None:
    """The start of a worker or command on a crawl with FLEET_PARTITIONS=*parts*: one that may
    create the crawl (*create*: a worker with the fleet's scheduler, ``push``) claims it with
    :func:`claim_one_sync` when *parts* is 1, else :func:`check_sync`; so that a P = 1 push and
    a P > 1 worker creating the same crawl at the same moment cannot both pass, as two workers
    cannot.  The claim comes after the crawl's layout check (frontier/layout.py; done here
    unless *layout_checked*): a crawl of an older layout has no layout key, and the claim's
    must not make it look current.

    Raises:
        FleetConfigError: as :func:`check_sync`.
        CrawlLayoutError: a crawl of another layout (as layout.check_sync).
    """
    if create and parts == 1:
        if not layout_checked:
            layout.check_sync(client, keys)
        claim_one_sync(client, keys)
    else:
        check_sync(client, keys, parts, create=create)


def stored_partitions(client: Any, keys: CrawlKeys) -> int:
    """The crawl's P as stored (1 when it has none: a P = 1 crawl, or none at all)."""
    return int(as_int(client.get(keys.partitions), 1) or 1)
