"""``scrapy fleet proxies list|add|remove|drain|reset SPIDER ...`` and the same under
``scrapy-fleet --redis URL proxies ... CRAWL_ID``: the pool changed at run time.

    list   SPIDER [--json]               each exit's health, per site (JSON: docs/proxies.md)
    add    SPIDER URL [URL ...]          add exits (undoes a remove, re-activates a drained one)
    remove SPIDER EXIT [EXIT ...]        remove exits; FLEET_PROXIES does not bring them back
    drain  SPIDER EXIT [EXIT ...]        no new requests through them (in-flight ones finish)
    reset  SPIDER [EXIT ...] [--site S]  forget cool-downs, penalties, counters, the dead mark

EXIT is an exit id (or a unique prefix of at least 4 digits), a whole proxy URL, or
``host:port`` (every exit on that address).  The pool is ``FLEET_PROXY_POOL`` (``--pool``),
else the crawl's own.  Output never shows credentials: an exit is ``<id> host:port``.
Exit statuses: 0 done, 1 an EXIT matched nothing (the others were done), 2 usage error,
Redis unreachable, or its user lacks a command of the ``admin`` ACL role on the pool's keys
(every action runs as ``admin``: docs/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis
import redis.cluster

from scrapy_fleet import acl
from scrapy_fleet.errors import FleetConfigError, RedisPermissionError
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.proxies.pool import PoolAdmin, describe, host_port
from scrapy_fleet.proxies.settings import ProxyConfig, proxy_config, proxy_urls

ACTIONS = ("list", "add", "remove", "drain", "reset")
EXIT_OK, EXIT_UNMATCHED, EXIT_ERROR = 0, 1, 2


def add_proxies_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the proxies actions (``--json`` is shared with the other actions)."""
    parser.add_argument("--pool", default=None,
                        help="proxies: the pool (FLEET_PROXY_POOL; default: the crawl's own)")
    parser.add_argument("--site", action="append", default=None, metavar="SITE",
                        help="proxies reset: only the state for this site (repeatable)")


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_list(snapshot: dict[str, Any]) -> None:
    exits = snapshot["exits"]
    totals = snapshot["totals"]
    print(f"proxy pool {snapshot['pool']!r}: {len(exits)} exit(s), block rate "
          f"{_fmt_rate(totals['block_rate'])} ({totals['bans']} bans / "
          f"{totals['responses']} responses)")
    for e in exits:
        extra = f", re-check in {_fmt_s(e['dead_recheck_in_s'])}" if e["status"] == "dead" else ""
        print(f"  {e['id']} {e['address']:<21} {e['status']}{extra}  in flight "
              f"{e['in_flight']}  ok {e['ok']} ban {e['ban']} 429 {e['rate_limited']} "
              f"dead {e['proxy_dead']} 5xx {e['site_error']}  block rate "
              f"{_fmt_rate(e['block_rate'])}")
        for row in e["sites"]:
            state = row["state"]
            if state == "cooling":
                state = f"cooling {row['cooldown_left_s']:.1f}s"
            print(f"      {row['site'][:40]:<40} {state:<16} ok {row['ok']} ban {row['ban']} "
                  f"429 {row['rate_limited']} dead {row['proxy_dead']} 5xx {row['site_error']}"
                  f"  block rate {_fmt_rate(row['block_rate'])}")


def _resolve_all(admin: PoolAdmin, specs: list[str]) -> tuple[list[str], list[str]]:
    ids: list[str] = []
    unmatched = []
    for spec in specs:
        found = admin.resolve(spec)
        if not found:
            unmatched.append(spec if "://" not in spec else describe(spec))
        ids += [i for i in found if i not in ids]
    return ids, unmatched


def run(admin: PoolAdmin, action: str, args: list[str], as_json: bool = False,
        sites: list[str] | None = None) -> int:
    """Run one proxies action against *admin*; returns the exit status.  Every action runs
    as the ``admin`` ACL role (scrapy_fleet/acl.py; ``list`` reads the exits' URLs with
    their credentials): its permissions on the pool's keys are probed first, and a missing
    one is one error line (exit status 2) before anything is read or written."""
    try:
        if action in ACTIONS:
            acl.check_sync(admin.client, None, "admin", pool=admin.keys,
                           cluster=isinstance(admin.client, redis.cluster.RedisCluster))
        return _run(admin, action, args, as_json, sites)
    except RedisPermissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (redis.RedisError, OSError) as exc:
        print(f"error: Redis: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _run(admin: PoolAdmin, action: str, args: list[str], as_json: bool,
         sites: list[str] | None) -> int:
    if action not in ACTIONS:
        print(f"error: unknown proxies action {action!r} ({', '.join(ACTIONS)})",
              file=sys.stderr)
        return EXIT_ERROR
    if action == "list":
        if args:
            print("error: proxies list takes no arguments", file=sys.stderr)
            return EXIT_ERROR
        snapshot = admin.snapshot()
        if as_json:
            print(json.dumps(snapshot, indent=2, sort_keys=True))
        else:
            print_list(snapshot)
        return EXIT_OK
    if action == "add":
        if not args:
            print("error: proxies add needs proxy URLs", file=sys.stderr)
            return EXIT_ERROR
        try:
            urls = list(proxy_urls(list(args)))
        except FleetConfigError as exc:
            print(f"error: {str(exc).replace('FLEET_PROXIES: ', '')}", file=sys.stderr)
            return EXIT_ERROR
        added = admin.add(urls)
        print(f"added {added} exit(s) to pool {admin.keys.pool!r}: "
              + ", ".join(describe(u) for u in urls))
        return EXIT_OK
    if action in ("remove", "drain") and not args:
        print(f"error: proxies {action} needs exits (id, URL or host:port)", file=sys.stderr)
        return EXIT_ERROR
    known = admin.urls()
    ids, unmatched = _resolve_all(admin, args)
    for spec in unmatched:
        print(f"error: no exit {spec!r} in pool {admin.keys.pool!r}", file=sys.stderr)
    labels = ", ".join(f"{i} {host_port(known[i])}" for i in ids) or "none"
    if action == "remove":
        n = admin.remove(ids) if ids else 0
        print(f"removed {n} exit(s): {labels}")
    elif action == "drain":
        n = admin.drain(ids) if ids else 0
        print(f"draining {n} exit(s): {labels} (add them again to undo)")
    else:
        if args and not ids:
            return EXIT_UNMATCHED
        n = admin.reset(ids, sites)
        print(f"reset {n} exit(s)" + (f" on {', '.join(sites)}" if sites else " on every site"))
    return EXIT_UNMATCHED if unmatched else EXIT_OK


def unused_pool_hint(action: str, status: int, config: ProxyConfig, crawl_id: str,
                     pool: str) -> str | None:
    """The warning ``proxies add`` prints inside a project whose settings do not send the
    crawl's requests through pool *pool*: none name a pool (its workers go direct), or they
    name another one.  None when the crawl uses *pool* (or the action is not a done add)."""
    if action != "add" or status != EXIT_OK:
        return None
    if not config.enabled:
        return (f"warning: the settings of crawl {crawl_id!r} name no proxy pool "
                "(FLEET_PROXIES and FLEET_PROXY_POOL are unset): its workers send every "
                f"request directly and never use pool {pool!r}; set FLEET_PROXY_POOL = "
                f"{pool!r} (or FLEET_PROXIES) in the settings to crawl through it "
                "(docs/proxies.md)")
    used = config.pool_name(crawl_id)
    if used != pool:
        return (f"warning: crawl {crawl_id!r} uses proxy pool {used!r} "
                f"(FLEET_PROXY_POOL), not {pool!r}: its workers never use these exits")
    return None


def admin_for(redis_url: str, prefix: str, pool: str, config: ProxyConfig | None = None,
              timeout: float = 10.0) -> PoolAdmin:
    """A :class:`PoolAdmin` on its own blocking client (close ``.client`` after use)."""
    from scrapy_fleet import redis_client

    client = redis_client.make_client(redis_url, timeout)
    return PoolAdmin(client, ProxyPoolKeys(prefix, pool), config or proxy_config({}))
