"""``scrapy-fleet``: the fleet's commands outside a Scrapy project.

    scrapy-fleet --redis URL push CRAWL_ID [URL ...] [-f FILE | -] [--dont-filter] [--priority N]
                 [--no-wait] [--timeout S] [--queue-max N] [--low-watermark F]
    scrapy-fleet --redis URL status CRAWL_ID [--json]
    scrapy-fleet --redis URL dead CRAWL_ID [--limit N] [--json]
    scrapy-fleet --redis URL purge CRAWL_ID [--yes]

Inside a project, ``scrapy fleet push|status|dead|purge SPIDER ...`` does the same with the
project's settings (commands/fleet.py).  Exit statuses: 0 success, 1 some push lines
rejected (or purge declined), 2 usage error or Redis unreachable, 3 the frontier stayed full
(``--no-wait``, or ``--timeout`` expired): the lines from the one reported on were not pushed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import redis
from scrapy import Request

from scrapy_fleet import codec, redis_url
from scrapy_fleet.commands import push
from scrapy_fleet.config import (
    DEFAULTS,
    HOST_KEY_MODES,
    validate_crawl_id,
    validate_key_prefix,
    validate_redis_url,
)
from scrapy_fleet.errors import (
    FleetConfigError,
    RedisPermissionError,
    RedisUnavailableError,
    RequestDecodeError,
)
from scrapy_fleet.frontier.client import PRIORITY_LIMIT, FrontierAdmin, FrontierParams
from scrapy_fleet.politeness import hosts as politeness


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``scrapy-fleet`` and ``scrapy fleet``."""
    parser.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                        help="push: read URL / JSON lines from FILE ('-' for standard input)")
    parser.add_argument("--dont-filter", action="store_true",
                        help="push: bypass the dupefilter (entries are always new)")
    parser.add_argument("--priority", type=int, default=0,
                        help="push: priority of plain URL lines (default 0)")
    parser.add_argument("--max-url-length", type=int, default=push.DEFAULT_MAX_URL_LENGTH,
                        help="push: longest URL accepted (default %(default)s)")
    parser.add_argument("--no-wait", action="store_true",
                        help="push: exit with status 3 instead of waiting when the frontier is "
                             "full")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="push: wait at most this long for room in a full frontier, then "
                             "exit with status 3 (default: wait forever)")
    parser.add_argument("--json", action="store_true", help="status/dead: print JSON")
    parser.add_argument("--limit", type=int, default=20,
                        help="dead, status --hosts: how many to show")
    parser.add_argument("--hosts", action="store_true",
                        help="status: also show each host's politeness state")
    parser.add_argument("--yes", action="store_true", help="purge: do not ask for confirmation")


def run_action(action: str, admin: FrontierAdmin, urls: list[str], opts: Any,
               fingerprint: Callable[[Request], bytes], label: str,
               confirm: Callable[[str], str] = input, low_watermark: int | None = None,
               has_method: Callable[[str], bool] | None = None,
               host_key_mode: str = "host") -> int:
    """Run one fleet action against *admin*; returns the exit status.  *low_watermark*
    (entries): where a push waiting for room resumes; *has_method*: checks pushed callback
    names against the spider (inside a project); *host_key_mode*: the crawl's
    ``FLEET_HOST_KEY`` (host, domain or ip), which pushed entries are counted under."""
    role = {"push": "worker", "status": "monitor", "dead": "monitor", "purge": "admin"}
    try:
        if redis_url.parse(admin.url).unverified:
            print("warning: ssl_cert_reqs=none in the Redis URL: TLS certificate "
                  "verification is off", file=sys.stderr)
        admin.ping(role.get(action))
        if action == "push":
            return _push(admin, urls, opts, fingerprint, low_watermark, has_method,
                         host_key_mode)
        if urls:
            print(f"error: {action} takes no URL arguments", file=sys.stderr)
            return push.EXIT_ERROR
        if action == "status":
            return _status(admin, opts, label, low_watermark)
        if action == "dead":
            return _dead(admin, opts)
        if action == "purge":
            return _purge(admin, opts, label, confirm)
    except (RedisUnavailableError, RedisPermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    except redis.exceptions.NoPermissionError as exc:  # a command the probe does not know
        print(f"error: the Redis user lacks a permission: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted: lines already pushed stay pushed", file=sys.stderr)
        return 130
    print(f"error: unknown action {action!r} (push, status, dead, purge)", file=sys.stderr)
    return push.EXIT_ERROR


class _WaitDisplay:
    """Shows that the push waits: a progress line on a terminal, a log line otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_line = -1.0

    def __call__(self, size: int, waited: float) -> None:
        if size < 0:
            print("Redis is out of memory (OOM): waiting before pushing again", file=sys.stderr,
                  flush=True)
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


def _push(admin: FrontierAdmin, urls: list[str], opts: Any,
          fingerprint: Callable[[Request], bytes], low_watermark: int | None,
          has_method: Callable[[str], bool] | None = None, host_key_mode: str = "host") -> int:
    if opts.max_url_length < 1:
        print("error: --max-url-length must be >= 1", file=sys.stderr)
        return push.EXIT_ERROR
    if opts.timeout is not None and not 0 <= opts.timeout < float("inf"):
        print("error: --timeout must be a number of seconds >= 0", file=sys.stderr)
        return push.EXIT_ERROR
    if abs(opts.priority) > PRIORITY_LIMIT:
        print(f"error: --priority must be within +-{PRIORITY_LIMIT}", file=sys.stderr)
        return push.EXIT_ERROR
    if not urls and not opts.file:
        print("error: push needs URLs or -f FILE (or -f - for standard input)", file=sys.stderr)
        return push.EXIT_ERROR
    with ExitStack() as stack:
        files = []
        for name in opts.file:
            if name == "-":
                files.append(sys.stdin.buffer)
            else:
                try:
                    files.append(stack.enter_context(open(name, "rb")))
                except OSError as exc:
                    print(f"error: cannot read {name}: {exc}", file=sys.stderr)
                    return push.EXIT_ERROR
        display = _WaitDisplay()
        report = push.push_lines(admin, push.read_lines(urls, files), fingerprint,
                                 max_url_length=opts.max_url_length,
                                 dont_filter=opts.dont_filter, priority=opts.priority,
                                 on_error=push.print_error, low_watermark=low_watermark,
                                 no_wait=opts.no_wait, timeout=opts.timeout,
                                 on_wait=display, has_method=has_method,
                                 host_key=lambda url: politeness.host_key(url, host_key_mode))
        display.done()
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
                       f"{admin.params.host_queue_max})",
               "memory": "Redis is out of memory (maxmemory)"}[report.full_reason]
        print(f"error: not pushed from line {report.first_unpushed_line} on: {why} (to go "
              "on, push again from that line: lines already pushed are duplicates then, "
              "unless --dont-filter)", file=sys.stderr)
    return report.exit_status


def _status(admin: FrontierAdmin, opts: Any, label: str, low_watermark: int | None) -> int:
    status = admin.status()
    status["queue_max"] = admin.params.queue_max
    status["low_watermark"] = low_watermark
    if getattr(opts, "hosts", False):
        status["hosts"] = admin.hosts(limit=opts.limit)
    if opts.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return push.EXIT_OK
    print(f"crawl {status['crawl_id']!r} ({label})")
    for name in ("queued", "leased", "delayed", "parked", "dead", "seen"):
        print(f"  {name:<8} {status[name]}")
    cap = status["queue_max"]
    print(f"  size     {status['size']} / {cap if cap else 'unbounded'}"
          + (f" (producers resume below {low_watermark})" if cap and low_watermark else ""))
    idle = status["idle_seconds"]
    print(f"  idle     {'-' if idle is None else f'{idle} s'}")
    counters = status["counters"]
    if counters:
        print("  totals   " + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())))
    workers = status["workers"]
    print(f"  workers  {len(workers)}")
    for worker, age in sorted(workers.items()):
        print(f"    {worker}  last seen {age} s ago")
    if "hosts" in status:
        print(f"  hosts    {'host':<32} {'entries':>8} {'flight':>6} {'next':>8} {'hold':>7} "
              f"{'delay':>6} {'fails':>5}")
        for row in status["hosts"]:
            nxt = "slot" if row["waits_for_slot"] else (
                "-" if row["next_in"] is None else f"{row['next_in']:.1f}s")
            delay = "-" if row["crawl_delay"] is None else f"{row['crawl_delay']:.1f}s"
            print(f"           {row['host'][:32]:<32} {row['entries']:>8} {row['in_flight']:>6} "
                  f"{nxt:>8} {row['hold_left']:>6.1f}s {delay:>6} {row['failures']:>5}")
    return push.EXIT_OK


def _dead(admin: FrontierAdmin, opts: Any) -> int:
    rows = []
    for letter in admin.dead_letters(limit=opts.limit):
        try:
            url = codec.decode_dict(letter["data"])["url"]
        except RequestDecodeError:
            url = None
        rows.append({"entry_id": letter["entry_id"], "reason": letter["reason"], "url": url,
                     "at_ms": letter["at"]})
    if opts.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['entry_id']}  {row['url'] or '<undecodable>'}  {row['reason']}")
        print(f"{len(rows)} dead letter(s) shown")
    return push.EXIT_OK


def _purge(admin: FrontierAdmin, opts: Any, label: str, confirm: Callable[[str], str]) -> int:
    keys = admin.crawl_keys()
    if not keys:
        print(f"nothing to purge for crawl {admin.keys.crawl_id!r}")
        return push.EXIT_OK
    live = [w for w, age in admin.status()["workers"].items() if age < 60]
    if live:
        print(f"warning: {len(live)} worker(s) called this crawl in the last 60 s "
              f"({', '.join(sorted(live)[:5])}); purging under them loses their leases and "
              f"makes them finish early", file=sys.stderr)
    if not opts.yes:
        try:
            answer = confirm(f"Delete {len(keys)} keys of crawl {admin.keys.crawl_id!r} "
                             f"({label}): queue, leases, dupefilter, stats? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("purge cancelled")
            return push.EXIT_REJECTED
    deleted = admin.purge()
    print(f"purged {deleted} keys of crawl {admin.keys.crawl_id!r}")
    return push.EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scrapy-fleet", description="Push URLs into a scrapy_fleet crawl and inspect it.")
    parser.add_argument("--redis", default=os.environ.get("FLEET_REDIS_URL",
                                                          DEFAULTS["FLEET_REDIS_URL"]),
                        help="Redis URL (default: $FLEET_REDIS_URL or %(default)s)")
    parser.add_argument("--prefix", default=DEFAULTS["FLEET_KEY_PREFIX"],
                        help="key prefix, FLEET_KEY_PREFIX (default %(default)s)")
    parser.add_argument("--queue-max", type=int, default=None,
                        help="FLEET_QUEUE_MAX of the crawl (0: unbounded; default: the value "
                             f"its workers stored in Redis, else {DEFAULTS['FLEET_QUEUE_MAX']})")
    parser.add_argument("--low-watermark", type=float, default=None,
                        help="FLEET_QUEUE_LOW_WATERMARK (default: the workers' value, else "
                             f"{DEFAULTS['FLEET_QUEUE_LOW_WATERMARK']})")
    parser.add_argument("--wait-replicas", type=int, default=0, metavar="N",
                        help="push: after each push call, wait (WAIT, up to 1 s) until N "
                             "replicas have it, and warn when they do not "
                             "(FLEET_REDIS_WAIT_REPLICAS; default 0)")
    parser.add_argument("action", choices=["push", "status", "dead", "purge"])
    parser.add_argument("crawl_id", help="FLEET_CRAWL_ID of the crawl (default: spider name)")
    parser.add_argument("urls", nargs="*", help="push: URLs or JSON request lines")
    add_action_arguments(parser)
    return parser


def _stored_bounds(url: str, crawl_id: str, prefix: str) -> dict[str, Any]:
    """The bounds the crawl's workers stored (empty when none ran yet or Redis is down)."""
    from scrapy_fleet import redis_client
    from scrapy_fleet.keys import CrawlKeys

    try:
        client = redis_client.sync_client(url, 5.0)
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_intermixed_args(argv)
    try:
        url = validate_redis_url(opts.redis, "--redis")
        crawl_id = validate_crawl_id(opts.crawl_id, "CRAWL_ID")
        validate_key_prefix(opts.prefix, "--prefix")
    except FleetConfigError as exc:
        parser.error(str(exc))
    stored = _stored_bounds(url, crawl_id, opts.prefix)
    queue_max = opts.queue_max if opts.queue_max is not None else stored.get(
        "queue_max", DEFAULTS["FLEET_QUEUE_MAX"])
    low_mark = opts.low_watermark if opts.low_watermark is not None else stored.get(
        "low_watermark", DEFAULTS["FLEET_QUEUE_LOW_WATERMARK"])
    if queue_max < 0 or not 0 < low_mark < 1:
        parser.error("--queue-max must be >= 0 and --low-watermark between 0 and 1")
    queue_max = queue_max or None
    if opts.wait_replicas < 0:
        parser.error("--wait-replicas must be >= 0")
    admin = FrontierAdmin(url, crawl_id, prefix=opts.prefix,
                          params=FrontierParams(queue_max=queue_max,
                                                host_queue_max=stored.get("host_queue_max")),
                          wait_replicas=opts.wait_replicas)
    low = max(int(queue_max * low_mark), 1) if queue_max else None
    try:
        return run_action(opts.action, admin, opts.urls, opts, push.default_fingerprinter(),
                          label="no project", low_watermark=low,
                          host_key_mode=stored.get("host_key", "host"))
    finally:
        admin.close()


def console_main() -> int:
    """Entry point of ``scrapy-fleet``: :func:`main`, quiet when its output is closed early
    (``scrapy-fleet status ... | head``)."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
