"""The crawl's budgets in Redis (issue 34, docs/control.md "Budgets"): what a worker writes
at start (FLEET_HOST_OVERRIDES' ``budget_pages``), how it closes once the crawl's budget is
spent, what ``status`` reads, and what ``scrapy fleet budget`` writes.

The lease step charges them (lua/step_budget.lua); the keys are ``CrawlKeys.budget`` (the
crawl's numbers) and ``CrawlKeys.budgeth`` (per host ``c|`` the command's, ``s|`` the
settings', ``n|`` pages charged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_fleet import engine_hooks

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_fleet.budget_settings import BudgetConfig
    from scrapy_fleet.frontier.book import LeaseBook
    from scrapy_fleet.keys import CrawlKeys

logger = logging.getLogger(__name__)


async def write_host_budgets(client: Any, keys: CrawlKeys, budget: BudgetConfig) -> None:
    """Store FLEET_HOST_OVERRIDES' ``budget_pages`` (``s|<host>``) and mark the crawl as one
    with host budgets (each worker writes the same)."""
    if not budget.hosts:
        return
    await client.hset(keys.budgeth, mapping={f"s|{h}": n for h, n in budget.hosts.items()})
    await client.hset(keys.budget, "hosts", 1)


def close_for_budget(crawler: Crawler, book: LeaseBook, reason: str, closing: bool) -> bool:
    """The crawl's budget is spent and nothing is in flight: no more leases asked, and the
    spider closed with *reason* (``budget_pages``, ``budget_seconds``) unless *closing*
    (done already).  Returns True (closing)."""
    book.fleet_done = True
    if not closing:
        book.inc(f"fleet/budget/closed/{reason}")
        logger.info("Fleet crawl budget spent (%s) and nothing in flight: closing", reason,
                    extra={"spider": book.spider})
        engine_hooks.close_spider(crawler, reason)
    return True


@dataclass
class BudgetView:
    """A crawl's budgets as ``status`` shows them: ``pages`` (0: none), ``charged``,
    ``seconds`` (0: none), ``left_seconds`` (None: not started or no time budget), and per
    host with a budget: host -> (budget, charged); ``hosts_out`` counts those spent."""

    pages: int = 0
    charged: int = 0
    seconds: float = 0.0
    left_seconds: float | None = None
    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def hosts_out(self) -> int:
        return sum(1 for limit, spent in self.hosts.values() if limit and spent >= limit)

    def as_dict(self) -> dict[str, Any]:
        return {"pages": self.pages, "charged": self.charged,
                "left": max(self.pages - self.charged, 0) if self.pages else None,
                "seconds": self.seconds, "left_seconds": self.left_seconds,
                "hosts_out": self.hosts_out}


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def read_budgets(client: Any, keys: CrawlKeys, config: dict[str, Any] | None = None,
                 now_ms: float | None = None, host_default: int = 0,
                 limit: int = 10_000) -> BudgetView:
    """The crawl's budgets (sync *client*): Redis's numbers, else *config*'s (``pages``,
    ``seconds``: the settings); per host, the command's, the settings' or *host_default*
    (only hosts with a charge or a budget of their own are listed; at most *limit* fields
    read, by HSCAN)."""
    config = config or {}
    row = client.hmget(keys.budget, "pages", "seconds", "charged", "started")
    view = BudgetView(pages=int(_num(row[0]) or _num(config.get("pages"))),
                      charged=int(_num(row[2])),
                      seconds=_num(row[1]) or _num(config.get("seconds")))
    if view.seconds and row[3] is not None and now_ms is not None:
        view.left_seconds = max(0.0, (_num(row[3]) + view.seconds * 1000 - now_ms) / 1000)
    fields: dict[str, dict[str, int]] = {}
    for n, (name, value) in enumerate(client.hscan_iter(keys.budgeth, count=1000)):
        if n >= limit:
            break
        kind, _, host = (name.decode() if isinstance(name, bytes) else name).partition("|")
        fields.setdefault(host, {})[kind] = int(_num(value))
    for host, f in fields.items():
        limit_of = f.get("c") or f.get("s") or host_default
        view.hosts[host] = (limit_of, f.get("n", 0))
    return view


def set_budget(client: Any, keys: CrawlKeys, pages: int | None = None,
               seconds: float | None = None, host: str | None = None) -> None:
    """``scrapy fleet budget``: the crawl's (or *host*'s) page budget, or the crawl's time
    budget, stored above the settings and read by the next lease; a host raised above what
    it was charged is a candidate again at once (K.ready)."""
    if host is not None:
        if pages is not None:
            pipe = client.pipeline(transaction=True)
            pipe.hset(keys.budgeth, f"c|{host}", pages)
            pipe.hset(keys.budget, "hosts", 1)
            pipe.zadd(keys.ready, {host: 0}, xx=True)  # (queued: served at its next turn)
            pipe.execute()
        return
    mapping: dict[str, Any] = {}
    if pages is not None:
        mapping["pages"] = pages
    if seconds is not None:
        mapping["seconds"] = seconds
    if mapping:
        client.hset(keys.budget, mapping=mapping)
