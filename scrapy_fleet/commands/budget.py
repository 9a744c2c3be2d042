"""``scrapy fleet budget CRAWL [--host H] [--pages N] [--seconds S] [--json]`` and the budget
lines of ``status`` (issue 34, docs/control.md "Budgets").

The numbers are stored in Redis above the settings and read by the next lease
(frontier/budgets.py, lua/step_budget.lua).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scrapy_fleet.commands import push
from scrapy_fleet.frontier import budgets
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--pages`` and ``--seconds`` (``--host`` is shared with ``monitor``)."""
    parser.add_argument("--pages", default=None, metavar="N",
                        help="budget: the crawl's (or --host's) page budget, an integer > 0")
    parser.add_argument("--seconds", default=None, metavar="S",
                        help="budget: the crawl's time budget from its first lease, seconds > 0")


def _positive(value: str | None, kind: type, what: str) -> Any:
    """*value* as a positive *kind*; raises ValueError naming *what*."""
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = 0
    if not number > 0 or number != number or number == float("inf"):
        raise ValueError(f"{what}={value!r} is not {'an integer' if kind is int else 'a number'}"
                         f" > 0")
    return number


def run(admin: FrontierAdmin, opts: Any, parts: int = 1) -> int:
    """Set a budget (``--pages``/``--seconds``, with ``--host`` one host's), then print the
    crawl's budgets.  Exit 2 for a number that is not positive, or ``--seconds`` with
    ``--host``."""
    try:
        pages = _positive(getattr(opts, "pages", None), int, "--pages")
        seconds = _positive(getattr(opts, "seconds", None), float, "--seconds")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    hosts = getattr(opts, "host", None) or [None]
    if len(hosts) > 1:
        print("error: budget takes one --host H", file=sys.stderr)
        return push.EXIT_ERROR
    host = hosts[0]
    if host is not None:
        from scrapy_fleet.commands.control import host_name

        try:
            host = host_name(host)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return push.EXIT_ERROR
    if host is not None and (seconds is not None or pages is None):
        print("error: --host takes --pages (a host has a page budget only)", file=sys.stderr)
        return push.EXIT_ERROR
    if parts > 1 and host is None and seconds:
        print("error: a crawl-wide time budget needs FLEET_PARTITIONS = 1 (page budgets work "
              "at every P: --pages N)", file=sys.stderr)
        return push.EXIT_ERROR
    if parts > 1 and host is None and pages and not float(
            admin.client.hget(admin.keys.config, "budget_pages") or 0):
        print("error: at FLEET_PARTITIONS > 1 the workers must run with FLEET_BUDGET_PAGES "
              "for --pages to change it (the partitions lease against chunks of it)",
              file=sys.stderr)
        return push.EXIT_ERROR
    if host is not None:
        host = host.strip().lower()
        keys = admin.keys.partition(partition_of(host, parts), parts) if parts > 1 \
            else admin.keys
        budgets.set_budget(admin.client, keys, pages=pages, host=host)
    elif pages is not None or seconds is not None:
        budgets.set_budget(admin.client, admin.keys, pages=pages, seconds=seconds)
    view = budgets.budget_status(admin.client, admin.keys, parts)
    if getattr(opts, "json", False):
        print(json.dumps(view, indent=2, sort_keys=True))
        return push.EXIT_OK
    print_status_line(view, always=True)
    print_host_lines([{"host": h, "budget_pages": b, "budget_charged": n}
                      for h, (b, n) in sorted(view["hosts"].items())])
    return push.EXIT_OK


def add_status(status: dict[str, Any], client: Any, keys: CrawlKeys,
               parts: int = 1) -> dict[str, list[Any]]:
    """``status["budget"]`` (frontier/budgets.py budget_status, without its per-host map,
    which is returned for :func:`add_host_rows`)."""
    view = budgets.budget_status(client, keys, parts)
    hosts = view.pop("hosts")
    status["budget"] = view
    return hosts  # type: ignore[no-any-return]


def add_host_rows(rows: list[dict[str, Any]], hosts: dict[str, list[Any]]) -> None:
    """``status --hosts``: each row's ``budget_pages`` (null: none) and ``budget_charged``."""
    for row in rows:
        limit, charged = hosts.get(row["host"], [None, 0])
        row["budget_pages"], row["budget_charged"] = limit, charged


def print_status_line(view: dict[str, Any], always: bool = False) -> None:
    """The budget line of *view* (frontier/budgets.py status_line), when the crawl has a
    budget (or *always*)."""
    line = budgets.status_line(view)
    if line or always:
        print(f"  budget     {line or 'none'}")


def print_host_lines(rows: list[dict[str, Any]]) -> None:
    """One line per host with a page budget: ``host  charged/budget`` (``out`` when spent)."""
    with_budget = [r for r in rows if r.get("budget_pages")]
    for row in with_budget:
        out = " (out of budget: queue kept)" if row["budget_charged"] >= row["budget_pages"] \
            else ""
        print(f"  budget   {row['host']:<32} {row['budget_charged']}/{row['budget_pages']}"
              f" pages{out}")
