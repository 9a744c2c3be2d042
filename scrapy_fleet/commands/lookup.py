"""``url``, ``hosts``, ``urls`` and ``crawls``: where a URL is, and the crawl's hosts, URLs and
crawl ids (issue 34, items 4 and 5; docs/control.md).  Reads only: they run as the ``monitor``
ACL role.  The reads themselves are frontier/where.py (one URL) and frontier/listing.py.

registry.py registers the rows of :data:`ROWS` as actions, adds :func:`add_arguments` to its
parser, and gives :data:`ROLES` to its ACL check.  Exit statuses: 0; 2 for bad input (a URL
that is not http(s), an unknown ``--state`` or ``--sort``, a bad ``--cursor``); 4 for a crawl
Redis holds nothing of; 1 for ``urls --host H`` of a host the crawl does not have.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from scrapy_fleet.commands import push
from scrapy_fleet.frontier import listing
from scrapy_fleet.frontier.where import locate
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.politeness import hosts as politeness

#: the ACL role of each action (registry.py ACL_ROLES)
ROLES = {"url": "monitor", "hosts": "monitor", "urls": "monitor", "crawls": "monitor"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of these actions (``--host`` is the ``monitor`` action's too)."""
    parser.add_argument("--sort", default="queued", metavar="KEY",
                        help="hosts: order by queued (default), leased or failed")
    parser.add_argument("--state", default="queued", metavar="STATE",
                        help="urls: queued (default), leased, failed or dead")
    parser.add_argument("--cursor", default="0", metavar="C",
                        help="urls: go on from the cursor the previous page printed")


def _parts_keys(ctx: Any, host: str) -> CrawlKeys:
    keys: CrawlKeys = ctx.crawl.keys
    return keys.partition(partition_of(host, ctx.parts), ctx.parts) if ctx.parts > 1 else keys


def run_url(ctx: Any) -> int:
    """``url CRAWL URL ... [--json]``: each URL's state (frontier/where.py ``locate``)."""
    bad = [u for u in ctx.urls if not u.startswith(("http://", "https://"))]
    options = [u for u in bad if u.startswith("-")]
    if not ctx.urls or bad:
        print("error: url needs at least one http(s) URL" if not ctx.urls else
              f"error: unrecognized arguments: {' '.join(options)}" if options else
              f"error: url takes http(s) URLs (got {bad[0]})", file=sys.stderr)
        return push.EXIT_ERROR
    rows = []
    for url in ctx.urls:
        try:
            host = politeness.host_key(url, ctx.host_key_mode)
            if not host:
                raise ValueError("it has no host")
            rows.append(locate(ctx.crawl.client, _parts_keys(ctx, host), url, host,
                               ctx.fingerprint))
        except ValueError as exc:
            print(f"error: {url}: not a URL a request can have ({exc})", file=sys.stderr)
            return push.EXIT_ERROR
    if ctx.opts.json:
        print(json.dumps(rows if len(rows) > 1 else rows[0], indent=2, sort_keys=True))
        return push.EXIT_OK
    for row in rows:
        print(f"{row['url']}\n  {describe(row)}")
    return push.EXIT_OK


def describe(row: dict[str, Any]) -> str:
    """One line saying a :func:`locate` row's state."""
    from scrapy_fleet.commands.actions import utc

    state, eid = row["state"], row.get("entry_id")
    if state == "leased":
        done = ", download over" if row["downloaded"] else ""
        return (f"leased by worker {row['worker']!r}{done} (entry {eid}, lease expires "
                f"{utc(row['lease_expiry'])}, attempt {row['attempts']})")
    if state == "deferred":
        return f"deferred until {utc(row['until'])} (entry {eid})"
    if state == "queued":
        return (f"queued at host {row['host']!r}, priority {row['priority']}, "
                f"{row['ahead']} entries of the host ahead of it (entry {eid})")
    if state == "parked":
        return f"parked (waiting for room in the frontier; entry {eid})"
    if state == "failed":
        return (f"failed: {row['reason']} after {row['attempts']} attempt(s), "
                f"{utc(row['at'])} (record {eid})")
    if state == "dead":
        return f"dead letter: {row['reason']} (entry {eid})"
    if state == "recrawl":
        return (f"tracked for recrawl: next due {utc(row['next_due'])}, last fetch "
                f"{utc((row['last_fetch'] or 0) * 1000)}")
    if state == "done":
        return "done, probably (the dupefilter has it; nothing of the frontier holds it)"
    return "never seen (the dupefilter does not have it: certain)"


def run_hosts(ctx: Any) -> int:
    """``hosts CRAWL [--sort queued|leased|failed] [--json] [--limit N]``."""
    if ctx.opts.sort not in listing.HOST_SORTS:
        print(f"error: --sort takes one of {', '.join(listing.HOST_SORTS)} "
              f"(got {ctx.opts.sort!r})", file=sys.stderr)
        return push.EXIT_ERROR
    if ctx.opts.limit < 1:
        print(f"error: --limit takes a positive number (got {ctx.opts.limit})",
              file=sys.stderr)
        return push.EXIT_ERROR
    rows = listing.host_rows(ctx.crawl.client, ctx.crawl.keys, ctx.parts)
    rows.sort(key=lambda r: (-r[ctx.opts.sort], r["host"]))
    shown = rows[:ctx.opts.limit]
    if ctx.opts.json:
        print(json.dumps({"hosts": shown, "total": listing.totals(rows)}, indent=2))
        return push.EXIT_OK
    print(f"{'host':<40} {'queued':>9} {'leased':>7} {'deferred':>8} {'failed':>7}")
    for r in shown:
        print(f"{r['host']:<40} {r['queued']:>9} {r['leased']:>7} {r['deferred']:>8} "
              f"{r['failed']:>7}")
    t = listing.totals(rows)
    print(f"{len(shown)} of {len(rows)} host(s) shown; all hosts: {t['queued']} queued, "
          f"{t['leased']} leased, {t['deferred']} deferred, {t['failed']} failed")
    return push.EXIT_OK


def run_urls(ctx: Any) -> int:
    """``urls CRAWL --host H [--state S] [--limit N] [--cursor C] [--json]``: one page."""
    opts, hosts = ctx.opts, getattr(ctx.opts, "host", None) or []
    if len(hosts) != 1 or not hosts[0]:
        print("error: urls needs one --host H", file=sys.stderr)
        return push.EXIT_ERROR
    host = hosts[0]
    if opts.state not in listing.URL_STATES:
        print(f"error: --state takes one of {', '.join(listing.URL_STATES)} "
              f"(got {opts.state!r})", file=sys.stderr)
        return push.EXIT_ERROR
    if opts.limit < 1:
        print(f"error: --limit takes a positive number (got {opts.limit})", file=sys.stderr)
        return push.EXIT_ERROR
    keys = _parts_keys(ctx, host)
    try:
        rows, cursor = listing.url_page(ctx.crawl.client, keys, host, opts.state,
                                        opts.cursor, opts.limit)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    # (a host with only failed or dead entries left, e.g. after ``host drop``, is known)
    if not rows and not listing.host_known(ctx.crawl.client, keys, host):
        print(f"error: crawl {ctx.crawl.keys.crawl_id!r} has no host {host!r} (see "
              "`hosts CRAWL`)", file=sys.stderr)
        return push.EXIT_REJECTED
    if opts.json:
        print(json.dumps({"urls": rows, "next": cursor}, indent=2))
        return push.EXIT_OK
    for r in rows:
        print(f"{r['entry_id']}  {r['url'] or '<undecodable>'}")
    more = f"; next page: --cursor {cursor}" if cursor != "0" else "; no more"
    print(f"{len(rows)} {opts.state} URL(s) of {host}{more}")
    return push.EXIT_OK


def run_crawls(ctx: Any) -> int:
    """``crawls [--json]``: the crawl ids Redis holds under the key prefix, with counts."""
    from scrapy_fleet import redis_client

    opts = ctx.opts
    client = redis_client.make_client(opts.redis)
    try:
        redis_client.ping_sync(client, opts.redis)
        rows = listing.crawl_rows(client, opts.prefix)
    finally:
        client.close()
    if opts.json:
        print(json.dumps(rows, indent=2))
        return push.EXIT_OK
    print(f"{'crawl':<32} {'partitions':>10} {'pushed':>10} {'queued':>10}")
    for r in rows:
        print(f"{r['crawl']:<32} {r['partitions']:>10} {r['pushed']:>10} {r['queued']:>10}")
    print(f"{len(rows)} crawl(s) under key prefix {opts.prefix!r}")
    return push.EXIT_OK


#: the actions' rows (registry.py ``Action`` keyword arguments)
ROWS: tuple[dict[str, Any], ...] = (
    {"name": "url", "summary": "say where each URL is: never seen, queued, deferred, leased "
     "(by which worker), failed, dead, tracked for recrawl, or done", "args": "URL ... [--json]",
     "run": run_url, "takes_urls": True, "needs_state": True},
    {"name": "hosts", "summary": "list the crawl's hosts with their queued, leased, deferred "
     "and failed entries", "args": "[--sort queued|leased|failed] [--limit N] [--json]",
     "run": run_hosts, "needs_state": True},
    {"name": "urls", "summary": "list one host's URLs in one state, a page at a time",
     "args": "--host H [--state queued|leased|failed|dead] [--limit N] [--cursor C] [--json]",
     "run": run_urls, "needs_state": True},
    {"name": "crawls", "summary": "list the crawl ids Redis holds, with their pushed and "
     "queued counts", "args": "[--json]", "run": run_crawls, "needs_redis": False},
)
