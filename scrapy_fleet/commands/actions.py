"""Parts of the frontier's actions: ``push``'s arguments, waiting display and report,
``recrawl``, ``status``'s host rows, ``purge``'s question (the actions over the crawl's
partitions are commands/partitioned.py's): what ``scrapy-fleet ACTION`` and ``scrapy fleet
ACTION SPIDER`` run once commands/cli.py has parsed the arguments, pinged Redis and checked
the crawl's state.  Each ``run_*`` returns an exit status
(:data:`scrapy_fleet.commands.registry.EXIT_STATUSES`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from scrapy import Request

from scrapy_fleet.commands import push
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import PRIORITY_LIMIT
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.politeness import hosts as politeness
from scrapy_fleet.politeness.settings import HOST_KEY_MODES
from scrapy_fleet.recrawl import view as recrawl_view


class WaitDisplay:
    """Shows that the push waits: a progress line on a terminal, a log line otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_line = -1.0
        self.last_oom = -1.0

    def __call__(self, size: int, waited: float) -> None:
        if size < 0:  # one line per 10 s: a push may wait for memory as long as it takes
            if waited - self.last_oom >= 10 or self.last_oom < 0:
                print(f"Redis is out of memory (OOM, maxmemory): waiting for memory "
                      f"({waited:.0f} s so far; raise maxmemory, or stop waiting with "
                      "--timeout S or --no-wait)", file=sys.stderr, flush=True)
                self.last_oom = waited
            return
        if self.tty:
            print(f"\rfrontier full ({size} entries): waiting {waited:.0f} s ...", end="",
                  file=sys.stderr, flush=True)
        elif waited - self.last_line >= 10 or self.last_line < 0:
            print(f"frontier full ({size} entries): waiting for room ({waited:.0f} s)",
                  file=sys.stderr, flush=True)
            self.last_line = waited

    def done(self) -> None:
        if self.tty and self.last_line != -1.0:
            print(file=sys.stderr)


def run_push(admin: push.PushTarget, urls: list[str], opts: Any,
          fingerprint: Callable[[Request], bytes], low_watermark: int | None,
          has_method: Callable[[str], Any] | None = None, host_key_mode: str = "host") -> int:
    if opts.max_url_length < 1:
        print("error: --max-url-length must be >= 1", file=sys.stderr)
        return push.EXIT_ERROR
    if opts.timeout is not None and not 0 <= opts.timeout < float("inf"):
        print("error: --timeout must be a number of seconds >= 0", file=sys.stderr)
        return push.EXIT_ERROR
    if abs(opts.priority) > PRIORITY_LIMIT:
        print(f"error: --priority must be within +-{PRIORITY_LIMIT}", file=sys.stderr)
        return push.EXIT_ERROR
    # a bare "-" among the arguments is standard input, as "-f -" (read once, after the URLs)
    names = list(opts.file)
    if any(url.strip() == "-" for url in urls):
        urls = [url for url in urls if url.strip() != "-"]
        if "-" not in names:
            names.append("-")
    if not urls and not names:
        print("error: push needs URLs, -f FILE or - (standard input)", file=sys.stderr)
        return push.EXIT_ERROR
    if "-" in names and sys.stdin.isatty():
        print("reading URL / JSON lines from standard input (end with Ctrl-D)",
              file=sys.stderr)
    with ExitStack() as stack:
        files = []
        for name in names:
            if name == "-":
                files.append(sys.stdin.buffer)
            else:
                try:
                    files.append(stack.enter_context(open(name, "rb")))
                except OSError as exc:
                    print(f"error: cannot read {name}: {exc}", file=sys.stderr)
                    return push.EXIT_ERROR
        display = WaitDisplay()
        report = push.push_lines(admin, push.read_lines(urls, files), fingerprint,
                                 max_url_length=opts.max_url_length,
                                 dont_filter=opts.dont_filter, priority=opts.priority,
                                 on_error=push.print_error, low_watermark=low_watermark,
                                 no_wait=opts.no_wait, timeout=opts.timeout,
                                 on_wait=display, has_method=has_method,
                                 host_key=lambda url: politeness.host_key(url, host_key_mode))
        display.done()
    return print_push_report(admin, report)


def oom_at_start(crawl_id: str) -> int:
    """A push that gave up before its first line: Redis stayed out of memory (--no-wait or
    --timeout) while the push made its first writes (the crawl's claims); exit status 3."""
    print(f"pushed 0, duplicates 0, rejected 0 (crawl {crawl_id!r})")
    print("error: not pushed from line 1 on: Redis is out of memory (maxmemory): nothing was "
          "pushed; push again once Redis has room", file=sys.stderr)
    return push.EXIT_FULL


def print_push_report(admin: push.PushTarget, report: push.PushReport) -> int:
    """The end of a push: its counts on stdout, why it stopped on stderr; its exit status."""
    print(f"pushed {report.pushed}, duplicates {report.duplicates}, "
          f"rejected {report.rejected} (crawl {admin.keys.crawl_id!r})")
    if admin.unreplicated:
        print(f"warning: {admin.unreplicated} push call(s) were not acknowledged by "
              f"{admin.wait_replicas} replica(s) in time (FLEET_REDIS_WAIT_REPLICAS): a "
              "failover of the master now would lose them; push those lines again after one",
              file=sys.stderr)
    if report.waited:
        print(f"waited {report.waited:.1f} s for room in the frontier")
    if report.stopped_full:
        why = {"frontier": f"the frontier is full (FLEET_QUEUE_MAX={admin.params.queue_max})",
               "host": "its host is at its bound (FLEET_HOST_QUEUE_MAX="
                       f"{admin.params.host_queue_max}): host {report.full_host!r}",
               "memory": "Redis is out of memory (maxmemory)"}[report.full_reason]
        print(f"error: not pushed from line {report.first_unpushed_line} on: {why} (to go "
              "on, push again from that line: lines already pushed are duplicates then, "
              "unless --dont-filter)", file=sys.stderr)
    return report.exit_status


def add_host_rows(status: dict[str, Any], rows: list[dict[str, Any]],
                  policy: dict[str, Any] | None,
                  recrawl: dict[str, dict[str, Any]] | None = None) -> None:
    """``status --hosts``: *rows* (FrontierAdmin.hosts: the politeness state) as
    ``status["hosts"]``, each with the snapshot's per-host fields (pages, bans, block_rate,
    hold_until, first_ban) and its *recrawl* figures (recrawl/view.py ``read_hosts``)
    beside, and *policy* as ``status["host_policy"]``."""
    top = {row["host"]: row for row in status["hosts"]}
    for row in rows:  # the snapshot's per-host fields beside the politeness state
        extra = top.get(row["host"], {})
        for name in ("pages", "bans", "block_rate", "hold_until", "first_ban"):
            row.setdefault(name, extra.get(name))
        row.update((recrawl or {}).get(row["host"]) or recrawl_view.host_recrawl({}))
    status["hosts"] = rows
    status["host_policy"] = policy


def print_host_rows(status: dict[str, Any]) -> None:
    """The hosts part of the ``status --hosts`` screen (:func:`add_host_rows`'s rows)."""
    policy = status.get("host_policy")
    if policy is None:
        print("  per host (fleet-wide): not known yet (no worker has started)")
    else:
        print(f"  per host (fleet-wide, FLEET_HOST_KEY={policy['host_key']!r}): "
              + politeness.describe_policy(policy["interval"], policy["cap"],
                                           policy["burst"], policy["is_rate"]))
    print(f"  hosts    {'host':<32} {'entries':>8} {'flight':>6} {'next':>8} {'hold':>7} "
          f"{'delay':>6} {'fails':>5} {'interval':>9} {'cap':>4} {'rate/ceil':>11} "
          f"{'learned':>7} {'cut':>7} {'rv pages':>8} {'chg/day':>8} {'price':>8}")
    for row in status["hosts"]:
        nxt = "slot" if row["waits_for_slot"] else (
            "-" if row["next_in"] is None else f"{row['next_in']:.1f}s")
        delay = "-" if row["crawl_delay"] is None else f"{row['crawl_delay']:.1f}s"
        interval = f"{row['interval']:.3f}s" if row["interval"] else "-"
        cap = row["cap"] or "-"
        # adaptive politeness: the learned rate under its ceiling, the learned capacity
        # (rate of the last overload) and the last decrease's reason
        ceiling = row.get("ceiling")
        rate = "-" if ceiling is None else f"{row['adaptive_rate']:g}/{ceiling:g}"
        capacity = "-" if row.get("capacity") is None else f"{row['capacity']:g}"
        rv_rate, price = recrawl_view.host_cells(row)
        print(f"           {row['host'][:32]:<32} {row['queued']:>8} {row['leased']:>6} "
              f"{nxt:>8} {row['hold_left']:>6.1f}s {delay:>6} {row['failures']:>5} "
              f"{interval:>9} {cap:>4} {rate:>11} {capacity:>7} "
              f"{row.get('last_decrease') or '-':>7} {row['recrawl_pages']:>8} {rv_rate:>8} "
              f"{price:>8}")
    print_recrawl_hosts(status.get("recrawl_hosts") or [])


def print_recrawl_hosts(rows: list[dict[str, Any]]) -> None:
    """The recrawl's hosts (recrawl/view.py ``recrawl_hosts``): tracked pages, learned change
    rate, price; nothing for a crawl without an adaptive recrawl."""
    if not rows:
        return
    print(f"  recrawl  {'host':<32} {'pages':>8} {'chg/day':>8} {'price':>8}")
    for row in rows:
        rate, price = recrawl_view.host_cells(row)
        print(f"           {row['host'][:32]:<32} {row['recrawl_pages']:>8} {rate:>8} "
              f"{price:>8}")


#: what the text of ``recrawl CRAWL URL`` adds to a last outcome (recrawl/view.py ``outcome``)
OUTCOME_NOTES = {"not_modified": " (304)", "unchanged": " (2xx, the same items or text)",
                 "changed": " (2xx, new items or text)",
                 "failed": " (a download error or another status: interval kept)",
                 "gone": " (404/410)"}


def run_recrawl(admin: FrontierAdmin, urls: list[str], opts: Any,
                fingerprint: Callable[[Request], bytes], host_key_mode: str,
                parts: int = 1) -> int:
    """``recrawl CRAWL URL [--json]``: one page's recrawl state (recrawl/view.py
    ``read_page``, docs/recrawl.md); exit status 1 with one line when the URL is not in the
    crawl's schedule, 2 for anything but one http(s) URL."""
    if len(urls) != 1 or not urls[0].startswith(("http://", "https://")):
        print("error: recrawl takes one http(s) URL", file=sys.stderr)
        return push.EXIT_ERROR
    url = urls[0]
    host = politeness.host_key(url, host_key_mode)
    keys = admin.keys.partition(partition_of(host, parts), parts) if parts > 1 else admin.keys
    page = recrawl_view.read_page(admin.client, keys, url, host, fingerprint)
    if page is None:
        print(f"{url}: not in the recrawl schedule of crawl {admin.keys.crawl_id!r} (never "
              "tracked, dropped, or queued now as a due revisit)", file=sys.stderr)
        return push.EXIT_REJECTED
    if opts.json:
        print(json.dumps(page, indent=2, sort_keys=True))
        return push.EXIT_OK
    rate = "-" if page["change_rate"] is None else f"{page['change_rate']:.3g} a day"
    print(f"{page['url']}\n  host         {page['host']}\n"
          f"  next due     in {page['next_due_in']:.1f} s (unix {page['next_due']:.0f})\n"
          f"  last fetch   unix {page['last_fetch']} (interval {page['interval']} s, "
          f"visit {page['visits']})\n"
          f"  last outcome {page['last_outcome']}{OUTCOME_NOTES.get(page['last_outcome'], '')}"
          f"\n  change rate  {rate} (estimate)\n"
          f"  history      {page['history']} (s between visits: + changed, - unchanged)")
    return push.EXIT_OK


def utc(ms: Any) -> str:
    """Server time in ms as ``2026-12-01 10:32:02 UTC`` (the raw number if it is not one)."""
    import datetime

    try:
        when = datetime.datetime.fromtimestamp(int(ms) / 1000, datetime.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ms)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def warn_live_workers(live: list[str]) -> None:
    """Warn on stderr that *live* workers (ids that called the crawl in the last 60 s) lose
    their leases and stop if the crawl is purged under them."""
    if live:
        print(f"warning: {len(live)} worker(s) called this crawl in the last 60 s "
              f"({', '.join(sorted(live)[:5])}); purging under them loses their leases and "
              f"makes them stop with an error (crawl state lost)", file=sys.stderr)


def purge_confirmed(confirm: Callable[[str], str], question: str) -> bool:
    """Ask *question*; True for y/yes, else prints "purge cancelled" (EOF: no)."""
    try:
        answer = confirm(question)
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("purge cancelled")
    return False


def push_started(admin: FrontierAdmin, parts: int, opts: Any) -> bool:
    """A push's claim of the crawl (partition_count.start_sync with *parts*), waiting while
    Redis answers OOM as the push's batches do (docs/backpressure.md); False when it gave up
    (``opts.no_wait``, ``opts.timeout``: the time waited here is taken off it)."""
    from scrapy_fleet.frontier import partition_count

    try:
        waited = push.until_memory(
            lambda: partition_count.start_sync(admin.client, admin.keys, parts, create=True),
            opts.no_wait, opts.timeout, WaitDisplay())
    except push.FrontierFull:
        return False
    if opts.timeout is not None:
        opts.timeout = max(0.0, opts.timeout - waited)
    return True


def stored_bounds(url: str, crawl_id: str, prefix: str) -> dict[str, Any]:
    """The bounds the crawl's workers stored (empty when none ran yet or Redis is down)."""
    from scrapy_fleet import redis_client
    from scrapy_fleet.keys.crawl import CrawlKeys

    try:
        client = redis_client.make_client(url, 5.0)
    except RedisUnavailableError:  # reported by the action itself, with a clear message
        return {}
    try:
        raw = client.hgetall(CrawlKeys(prefix, crawl_id).config)
    except Exception:  # reported by the action itself, with a clear message
        return {}
    finally:
        client.close()
    out: dict[str, Any] = {}
    try:
        if b"queue_max" in raw:
            out["queue_max"] = int(raw[b"queue_max"])
        if b"low_watermark" in raw:
            out["low_watermark"] = float(raw[b"low_watermark"])
        if b"host_queue_max" in raw:
            out["host_queue_max"] = int(raw[b"host_queue_max"]) or None
        mode = raw.get(b"host_key")
        if isinstance(mode, bytes) and mode.decode(errors="replace") in HOST_KEY_MODES:
            out["host_key"] = mode.decode()
    except ValueError:
        return {}
    return out
