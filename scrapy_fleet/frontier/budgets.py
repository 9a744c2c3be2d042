"""The crawl's budgets in Redis (issue 34, docs/control.md "Budgets"): what a worker writes
at start (FLEET_HOST_OVERRIDES' ``budget_pages``), how it closes once the crawl's budget is
spent, what ``status`` reads, and what ``scrapy fleet budget`` writes.

The lease step charges them (lua/step_budget.lua); the keys are ``CrawlKeys.budget`` (the
crawl's numbers) and ``CrawlKeys.budgeth`` (per host ``c|`` the command's, ``s|`` the
settings', ``n|`` pages charged).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_fleet import redis_client

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_fleet.budget_settings import BudgetConfig
    from scrapy_fleet.frontier.book import LeaseBook
    from scrapy_fleet.keys.crawl import CrawlKeys

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
    from scrapy_fleet import engine_hooks  # (Scrapy's internals: a worker's only)

    book.fleet_done = True
    if not closing:
        book.inc(f"fleet/budget/closed/{reason}")
        logger.info("Fleet crawl budget spent (%s) and nothing in flight: closing", reason,
                    extra={"spider": book.spider})
        engine_hooks.close_spider(crawler, reason)
    return True


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def host_budgets(client: Any, keys: CrawlKeys, default: int = 0,
                 limit: int = 100_000) -> dict[str, tuple[int, int]]:
    """host -> (page budget, 0: none; pages charged) of the hosts with a charge or a budget
    of their own (sync *client*; HSCAN, at most *limit* fields)."""
    fields: dict[str, dict[str, int]] = {}
    for n, (name, value) in enumerate(client.hscan_iter(keys.budgeth, count=1000)):
        if n >= limit:
            break
        kind, _, host = (name.decode() if isinstance(name, bytes) else name).partition("|")
        fields.setdefault(host, {})[kind] = int(_num(value))
    return {host: (f.get("c") or f.get("s") or default, f.get("n", 0))
            for host, f in fields.items()}


def budget_status(client: Any, own: CrawlKeys, parts: int = 1,
                  hosts: bool = True) -> dict[str, Any]:
    """``status``'s ``budget`` object of crawl *own* over its *parts* partitions (sync
    *client*): ``pages`` (null: none), ``charged``, ``left`` (null: no page budget),
    ``seconds`` (null: none), ``left_seconds`` (null: not started or none), ``hosts_out``
    (hosts out of their page budget, queue kept), and with *hosts* per host with a budget or
    a charge (``hosts``: host -> [budget or null, charged], for ``status --hosts``).  The
    settings' numbers come from the ``config`` hash the workers write, the command's from
    ``budget`` (at P > 1 the page budget's from the crawl's own, its home); ``charged`` is
    the sum of the partitions'."""
    conf = client.hmget(own.config, "budget_pages", "budget_seconds", "host_budget_pages")
    # (at P > 1 the page budget's home is the crawl's own hash: frontier/budgetchunks.py)
    pages = _num(client.hget(own.budget, "pages")) if parts > 1 else 0.0
    seconds = charged = 0.0
    started = None
    per_host: dict[str, tuple[int, int]] = {}
    for keys in own.all_partitions(parts):
        row = client.hmget(keys.budget, "pages", "seconds", "charged", "started")
        pages = pages or _num(row[0])
        seconds = seconds or _num(row[1])
        charged += _num(row[2])
        started = started if row[3] is None else _num(row[3])
        per_host.update(host_budgets(client, keys, int(_num(conf[2]))))
    pages, seconds = pages or _num(conf[0]), seconds or _num(conf[1])
    left_seconds = None
    if seconds and started is not None:
        sec, usec = client.time(**redis_client.node_of(client, own.budget))
        left_seconds = round(max(0.0, started / 1000 + seconds - sec - usec / 1e6), 3)
    view: dict[str, Any] = {
        "pages": int(pages) or None, "charged": int(charged),
        "left": max(int(pages - charged), 0) if pages else None,
        "seconds": seconds or None, "left_seconds": left_seconds,
        "hosts_out": sum(1 for b, n in per_host.values() if b and n >= b)}
    if hosts:
        view["hosts"] = {h: [b or None, n] for h, (b, n) in per_host.items()}
    return view


def status_line(view: dict[str, Any]) -> str | None:
    """``pages B, charged C, left L; seconds S (L s left); hosts out of budget H`` of a
    :func:`budget_status` view, None when the crawl has no budget."""
    parts = []
    if view.get("pages"):
        parts.append(f"pages {view['pages']}, charged {view['charged']}, left {view['left']}")
    if view.get("seconds"):
        left = view.get("left_seconds")
        parts.append(f"seconds {view['seconds']:g} ("
                     + ("not started" if left is None else f"{left:.0f} s left") + ")")
    if view.get("hosts_out"):
        parts.append(f"hosts out of budget {view['hosts_out']} (queues kept)")
    return "; ".join(parts) or None


def set_budget(client: Any, keys: CrawlKeys, pages: int | None = None,
               seconds: float | None = None, host: str | None = None) -> None:
    """``scrapy fleet budget``: the crawl's (or *host*'s) page budget, or the crawl's time
    budget, stored above the settings and read by the next lease; a host raised above what
    it was charged is a candidate again at once (K.ready)."""
    if host is not None:
        if pages is not None:
            pipe = client.pipeline(transaction=False)  # (each write idempotent)
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
