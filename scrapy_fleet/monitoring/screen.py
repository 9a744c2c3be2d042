"""The one-screen text of ``scrapy fleet status SPIDER`` (from :func:`snapshot.read_snapshot`).

Plain text (no colour, no terminal control): it reads the same in a terminal, a log and a CI
artefact.  docs/monitoring.md shows an example.
"""

from __future__ import annotations

import time
from typing import Any

from scrapy_fleet.frontier import budgets


def _clock(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _ago(now: float, t: float | None) -> str:
    if t is None:
        return "-"
    return f"{max(0.0, now - t):.1f} s ago"


def duration(seconds: float | None) -> str:
    """``95`` -> ``"1 min 35 s"``; None -> ``"-"``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def _rate(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def rate_window(rates: dict[str, Any]) -> str:
    """`` (last 60 s)``, or the crawl's age while it is younger: what the per-minute rates
    are taken over (the snapshot's ``rates.window_s``); "" without a rate."""
    window = rates.get("window_s")
    if window is None:
        return ""
    return f" (last {60 if window >= 59.5 else round(window)} s)"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(snap: dict[str, Any], label: str = "", queue_max: int | None = None,
           low_watermark: int | None = None) -> str:
    """The status screen of snapshot *snap*; *label* names where the settings came from
    (``spider 'docs'``); *queue_max*, *low_watermark*: the bounds, shown with the size."""
    now = snap["at"]
    fr, c, r = snap["frontier"], snap["counters"], snap["rates"]
    lines = [f"crawl {snap['crawl']!r}" + (f" ({label})" if label else "")
             + f"  at {_clock(now)}"]
    size = fr["size"]
    idle_seconds = snap["idle_seconds"]
    bound = (f"{size} / {queue_max}" if queue_max else f"{size} / unbounded") + (
        f" (producers resume below {low_watermark})" if queue_max and low_watermark else "")
    lines.append(f"  frontier   due {fr['due']}  deferred {fr['deferred']}  leased "
                 f"{fr['leased']} (held by workers: prefetched, downloading or parsing)  "
                 f"parked {fr['parked']}  dead {fr['dead']}  seen {fr['seen']}"
                 + (f"  stored {fr['stored']}" if fr.get("stored") else ""))
    lines.append(f"  size       {bound}"
                 + ("" if idle_seconds is None else f"  idle {idle_seconds:.1f} s"))
    lines.append(f"  rates      {_rate(r['pages_per_min'], 'pages/min')}  "
                 f"{_rate(r['items_per_min'], 'items/min')}{rate_window(r)}  block rate "
                 f"{_pct(r['block_rate'])} (last 5 min)  ETA {duration(snap['eta_seconds'])}  "
                 f"runnable now {snap['runnable_now']}")
    resp = c["responses"]
    lines.append("  responses  " + "  ".join(f"{k} {v}" for k, v in resp.items())
                 + f"  (pages {c['pages']}, {_bytes(c['response_bytes'])})")
    if snap.get("control"):  # crawl control (issue 34): docs/control.md
        from scrapy_fleet.frontier.control import status_line

        lines.append(status_line(snap["control"]))
    rv = snap.get("recrawl") or {}
    if rv.get("tracked") or rv.get("scheduled"):  # recrawl (issue 22): docs/recrawl.md
        nxt = rv.get("next_due_in")
        lines.append(
            f"  recrawl    tracked {rv['tracked']}  scheduled {rv['scheduled']}  due now "
            f"{rv['due']}  overdue {rv['overdue']}  next due "
            + ("-" if nxt is None else f"in {duration(nxt)}")
            + f"  changed {_pct(rv.get('changed_share'))}  unchanged 200 "
            f"{_pct(rv['unchanged_share'])}  304 {_pct(rv['not_modified_share'])}"
            f"  freshness est. {_pct(rv['freshness_estimate'])}"
            + (f"  sitemap lastmod due {rv['lastmod']['due']}"
               if (rv.get("lastmod") or {}).get("due") else ""))
    budget = budgets.status_line(snap.get("budget") or {})  # issue 34: docs/control.md
    if budget:
        lines.append(f"  budget     {budget}")
    by_status = c.get("responses_by_status") or {}
    if by_status:
        lines.append("  statuses   " + "  ".join(f"{k}: {v}" for k, v in by_status.items()))
    errors = "  ".join(f"{k} {v}" for k, v in c["download_errors"].items())
    lines.append(f"  items      scraped {c['items_scraped']}  dropped {c['items_dropped']}"
                 f"  failed {c.get('items_failed', 0)}"
                 " (as the workers reported them)"
                 f"    download errors: {errors}")
    q = c["requests"]
    lines.append(f"  requests   pushed {q['pushed']}  duplicate {q['duplicate']}  leased "
                 f"{q['leased']}  acked {q['acked']}  reclaimed {q['reclaimed']}  "
                 f"dead-lettered {q['dead_lettered']}")
    lines.append(f"  blocks     bans {c['bans']}  429s {c['rate_limited']}  robots denied "
                 f"{c['robots_denied']}  offsite filtered {c.get('offsite_filtered', 0)}  "
                 f"proxy bans {c.get('proxy_bans', 0)}")
    workers = snap["workers"]
    lines.append(f"  workers    {snap['workers_alive']} alive"
                 + (f", {len(workers) - snap['workers_alive']} dead" if
                    len(workers) > snap["workers_alive"] else ""))
    for w in workers:
        role = "" if w.get("role", "all") == "all" else f"[{w['role']}] "
        lines.append(f"    {w['id']}  {role}{w['state']:<8} {w['health']:<7} leases {w['leases']}  "
                     f"downloads {w['downloads']}  pages {w['pages']}  items {w['items']}  "
                     f"errors {w['errors']}  last seen {_ago(now, w['last_seen'])}")
    if snap["hosts"]:
        more = " (a sample: many hosts)" if snap.get("hosts_sampled") else ""
        lines.append(f"  top hosts  by queued, of {snap.get('hosts_total', 0)}{more}")
        lines.append(f"    {'host':<32} {'queued':>8} {'downloading':>11} {'pages':>8} "
                     f"{'bans':>6} {'block':>7}  hold")
        for h in snap["hosts"]:
            hold = "-" if h["hold_until"] is None else f"{max(0.0, h['hold_until'] - now):.0f}s"
            lines.append(f"    {h['host'][:32]:<32} {h['queued']:>8} {h['leased']:>11} "
                         f"{h['pages']:>8} {h['bans']:>6} {_pct(h['block_rate']):>7}  {hold}")
    alerts = snap["alerts"]
    lines.append(f"  alerts     {len(alerts) or 'none'}")
    for a in alerts:
        since = "" if a["since"] is None else f", since {_clock(a['since'])}"
        lines.append(f"    {a['severity'].upper()} {a['id']}: {a['what']} ({a['where']}{since})")
        lines.append(f"      next: {a['next']}")
    return "\n".join(lines)
