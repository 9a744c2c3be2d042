"""The crawl's page budget at P > 1 partitions (issue 34 item 3, docs/control.md "Budgets"):
the budget lives at its home, the crawl's own ``budget`` hash, and each partition reserves
chunks of it (lua/budget_home.lua); a partition's lease step leases only against its own
chunk (lua/step_budget.lua with ``bgc``), so it stays a one-slot call, and the sum of the
partitions' leases never exceeds the budget.

A worker's :class:`~scrapy_fleet.frontier.partitions.PartitionedFrontier` holds one
:class:`ChunkBudget`:

* before a call that asks partition p for leases while p's chunk is known spent (or not
  known yet), it reserves a chunk for p at the home (``min(CHUNK_MAX, ceil(left / P))``
  pages) and hands it to p (lua/budget_part.lua): two small calls per chunk;
* once the home has nothing left, at most every :data:`SWEEP_EVERY` seconds, it asks every
  partition to give back the unused pages of its chunk when nothing is queued or deferred
  there (reported to the home, where another partition may reserve them), and finds the
  crawl's budget spent when the home has nothing left and no partition has unused pages or
  leases in flight: the pump then closes with ``budget_pages``, as at P = 1.

The home's and partitions' counts are cumulative (they only grow), so a lost reply or a call
sent again never grants twice what a partition can use; a worker that dies between the two
calls leaves pages granted at the home that the next reservation for that partition hands
over.  Errors of these calls are not raised: a partition without a chunk leases nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy_fleet import lua
from scrapy_fleet.keys.calls import BUDGET_HOME_CALL, BUDGET_PART_CALL

if TYPE_CHECKING:
    from scrapy_fleet.keys.crawl import CrawlKeys

logger = logging.getLogger(__name__)

#: the largest chunk a partition reserves at once (pages)
CHUNK_MAX = 64
#: seconds between two sweeps (give-backs and the spent check) once the home has nothing left
SWEEP_EVERY = 1.0


class ChunkBudget:
    """One worker's view of the crawl's page budget over *parts* partitions (module
    docstring).  *own*: the crawl's own keys (the home); *part_keys*: each partition's;
    *pages*: FLEET_BUDGET_PAGES (the home's ``pages``, set by ``scrapy fleet budget``, is
    above it)."""

    def __init__(self, client: Any, own: CrawlKeys, part_keys: list[CrawlKeys],
                 pages: int) -> None:
        self.own = own
        self.part_keys = part_keys
        self.pages = pages
        self._home = lua.load(client, "budget_home.lua")
        self._part = lua.load(client, "budget_part.lua")
        #: per partition: the pages left in its chunk as last told (a reply's ``bq``)
        self.left: dict[int, int] = {}
        #: pages left at the home as last told (None: not asked yet)
        self.home_left: int | None = None
        self._swept = 0.0  # (monotonic time of the last sweep)
        self.reservations = 0  #: chunks reserved by this worker
        self.errors = 0  #: reservations or sweeps that failed (not raised)

    def counts(self) -> dict[str, int]:
        """This worker's counts (stats ``fleet/partitions/budget_*``, docs/stats.md)."""
        return {"budget_chunks": self.reservations, "budget_errors": self.errors}

    def note(self, p: int, left: int | None) -> None:
        """Partition *p*'s call replied *left* pages in its chunk (None: not told)."""
        if left is not None:
            self.left[p] = left

    async def reserve(self, takes: dict[int, int]) -> None:
        """Reserve a chunk for each partition of *takes* (partition -> leases asked) whose
        chunk is spent or not known, unless the home had nothing left at the last sweep
        (less than :data:`SWEEP_EVERY` ago)."""
        need = [p for p, n in takes.items() if n > 0 and self.left.get(p, 0) <= 0]
        if not need or (self.home_left == 0
                        and time.monotonic() - self._swept < SWEEP_EVERY):
            return
        await asyncio.gather(*(self._reserve_one(p) for p in need))

    async def _reserve_one(self, p: int) -> None:
        try:
            granted, left, _, n = await self._home(
                keys=self.own.call_keys(BUDGET_HOME_CALL),
                args=[p, len(self.part_keys), self.pages, CHUNK_MAX, 1, 0])
            self.home_left = int(left)
            row = await self._part(keys=self.part_keys[p].call_keys(BUDGET_PART_CALL),
                                   args=[int(granted), 0])
        except Exception as exc:  # (the partition leases nothing without a chunk)
            self.errors += 1
            logger.debug("Fleet budget: no chunk reserved for partition %d: %s", p, exc)
            return
        self.left[p] = int(row[3])
        self.reservations += int(n) > 0

    async def spent(self) -> bool:
        """Whether the crawl's page budget is spent: the home has nothing left, and no
        partition has unused pages or leases in flight.  Asked only once the home had
        nothing left, at most every :data:`SWEEP_EVERY` seconds (False in between).  Each
        partition first gets what the home granted it (a worker may have died between the
        two calls of a reservation), gives its unused pages back when nothing is queued or
        deferred there, and its pages given back are counted at the home."""
        now = time.monotonic()
        if self.home_left != 0 or now - self._swept < SWEEP_EVERY:
            return False
        self._swept = now
        try:
            rows = await asyncio.gather(*(self._sweep_one(p)
                                          for p in range(len(self.part_keys))))
        except Exception as exc:
            self.errors += 1
            logger.debug("Fleet budget: sweep failed: %s", exc)
            return False
        self.home_left = max(left for left, _ in rows)  # (the last to answer knows most)
        return self.home_left == 0 and all(int(r[3]) == 0 and int(r[5]) == 0
                                           for _, r in rows)

    async def _sweep_one(self, p: int) -> tuple[int, list[Any]]:
        """Partition *p*'s part of a sweep: (pages left at the home, its budget_part.lua
        row)."""
        home_keys = self.own.call_keys(BUDGET_HOME_CALL)
        args = [p, len(self.part_keys), self.pages, CHUNK_MAX, 0]
        granted, _, _, _ = await self._home(keys=home_keys, args=[*args, 0])
        row = await self._part(keys=self.part_keys[p].call_keys(BUDGET_PART_CALL),
                               args=[int(granted), 1])
        self.left[p] = int(row[3])
        _, left, _, _ = await self._home(keys=home_keys, args=[*args, int(row[1])])
        return int(left), row
