"""``scrapy fleet sessions CRAWL [--pool P] [--retire ID] [--reset] [--json]`` and the
sessions' line of ``status`` (docs/sessions.md, "Watching sessions").

* without ``--retire``/``--reset``: each pool (or pool P) with its counters (sessions
  created, logins, failed checks, retirements by reason) and its sessions (state, reason,
  uses, errors, generation, created and last used); never a cookie;
* ``--retire ID``: retires session ID (reason ``manual``): it is never drawn again, its
  pinned requests draw another session of its pool, which replaces it;
* ``--reset``: retires every drawable session of the pool(s) (reason ``reset``): the next
  requests draw new sessions, which log in again.

An unknown pool or session id is one line on standard error and exit status 1.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from scrapy_fleet.commands import push
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.sessions.pool import pool_names, pool_report, pools_summary, retire_session


def _when(ms: str) -> str:
    if not ms or ms == "0":
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(int(ms) / 1000))


def _print_pool(report: dict[str, Any]) -> None:
    c = report["counters"]
    drawable = [r for r in report["sessions"].values() if r["state"] != "retired"]
    retired = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(c.items())
                        if k.startswith("retired:")) or "none"
    print(f"pool {report['pool']}: {len(drawable)} drawable "
          f"({sum(r['state'] == 'active' for r in drawable)} active), "
          f"{c.get('created', 0)} created, {c.get('logins', 0)} logins, "
          f"{c.get('check_failed', 0)} failed checks; retired: {retired}")
    for sid, r in report["sessions"].items():
        reason = f" ({r['reason']})" if r["reason"] else ""
        print(f"  {sid:<24} {r['state'] + reason:<22} uses {r['uses']:<6} "
              f"errors {r['errors']:<3} gen {r['generation']:<4} "
              f"created {_when(r['created'])}  last used {_when(r['last_used'])}")


def summary(admin: FrontierAdmin) -> dict[str, Any]:
    """``status``'s view of the sessions: per pool, drawable and active sessions, logins,
    failed checks and retirements by reason (empty without pools)."""
    return pools_summary(admin.client, admin.keys)


def status_line(pools: dict[str, Any]) -> str | None:
    """One line of ``status`` for the session pools, or None without pools."""
    if not pools:
        return None
    parts = []
    for pool, p in sorted(pools.items()):
        retired = sum(p["retired"].values())
        parts.append(f"{pool} {p['active']}/{p['drawable']} active, {p['logins']} logins, "
                     f"{retired} retired")
    return "  sessions " + "; ".join(parts)


def run(admin: FrontierAdmin, opts: Any) -> int:
    """The ``sessions`` action (see the module docstring); returns the exit status."""
    known = pool_names(admin.client, admin.keys)
    pool = getattr(opts, "pool", None)
    if pool is not None and pool not in known:
        print(f"error: crawl {admin.keys.crawl_id!r} has no session pool {pool!r} (pools: "
              f"{', '.join(known) or 'none'})", file=sys.stderr)
        return push.EXIT_REJECTED
    pools = [pool] if pool is not None else known
    retire = getattr(opts, "retire", None)
    if retire:
        try:
            outcome = retire_session(admin.client, admin.keys, retire, "manual")
        except ValueError as exc:
            outcome, detail = "unknown", str(exc)
        else:
            detail = f"no session {retire!r} in crawl {admin.keys.crawl_id!r}"
        if outcome == "unknown":
            print(f"error: {detail}", file=sys.stderr)
            return push.EXIT_REJECTED
        print(f"session {retire} {'retired' if outcome == 'retired' else 'was retired already'}")
        return push.EXIT_OK
    if getattr(opts, "reset", False):
        n = 0
        for name in pools:
            for sid, r in pool_report(admin.client, admin.keys, name)["sessions"].items():
                if r["state"] != "retired":
                    n += retire_session(admin.client, admin.keys, sid, "reset") == "retired"
        print(f"{n} sessions retired (reason reset) in {len(pools)} pools: the next requests "
              "draw new sessions")
        return push.EXIT_OK
    reports = [pool_report(admin.client, admin.keys, name) for name in pools]
    if getattr(opts, "json", False):
        print(json.dumps(reports, indent=2, sort_keys=True))
        return push.EXIT_OK
    if not reports:
        print(f"crawl {admin.keys.crawl_id!r} has no session pools (FLEET_SESSION_POOL_SIZE)")
    for report in reports:
        _print_pool(report)
    return push.EXIT_OK
