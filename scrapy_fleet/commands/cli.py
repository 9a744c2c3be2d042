"""``scrapy-fleet``: the fleet's commands outside a Scrapy project: the command line parsed,
Redis pinged, the crawl's P and state checked, then the action's row run.

The actions are rows of :data:`ACTIONS` (commands/registry.py: name, one-line summary,
arguments, handler): the parser's choices, both commands' help texts and Scrapy's command
list are built from it, so a new action is one handler plus one row.  Inside a project,
``scrapy fleet ACTION SPIDER ...`` runs the same actions with the project's settings
(commands/fleet.py).  Exit statuses: :data:`EXIT_STATUSES`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import redis
from scrapy import Request

from scrapy_fleet import acl, redis_url
from scrapy_fleet.catalog import DEFAULTS
from scrapy_fleet.checks import validate_crawl_id, validate_key_prefix
from scrapy_fleet.commands import actions, control, host, lookup, partitioned, push
from scrapy_fleet.commands import budget as budget_commands
from scrapy_fleet.commands.registry import (
    ACL_ROLE_USES,
    ACL_ROLES,
    ACTIONS,
    EXIT_STATUSES,
    AclTarget,
    ActionContext,
)
from scrapy_fleet.config import validate_partitions
from scrapy_fleet.errors import (
    FleetConfigError,
    RedisPermissionError,
    RedisUnavailableError,
)
from scrapy_fleet.frontier import partition_count
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.layout import CrawlLayoutError
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.monitoring import actions as monitoring_actions
from scrapy_fleet.redis_url import validate_redis_url

_WIDTH = 79  # columns of the help texts


def _hanging(head: str, text: str, indent: int) -> str:
    """*text* wrapped after *head*, never inside a ``[...]`` group."""
    groups = [g.replace(" ", "\0") for g in re.findall(r"\[[^\]]*\]|\S+", text)]
    return textwrap.fill(" ".join(groups), _WIDTH, initial_indent=head,
                         subsequent_indent=" " * indent, break_on_hyphens=False,
                         break_long_words=False).replace("\0", " ")


#: ``proxies`` has sub-actions of its own and its own parser (proxies/actions.py), so it is not
#: a row of ACTIONS; the help texts list it after them
PROXIES_USAGE = ("list|add|remove|drain|reset {crawl} [URL or ID ...] [--pool P] [--site S] "
                 "[--json]")
PROXIES_SUMMARY = "show and change the crawl's proxy pool (docs/proxies.md)"


def usage_lines(prog: str, crawl: str) -> str:
    """One usage entry per action, ``PROG ACTION CRAWL ARGS``, wrapped under its action."""
    out = []
    for a in ACTIONS.values():
        head = f"  {prog} {a.name}{f' {crawl}' if a.needs_redis or a.names_crawl else ''} "
        out.append(_hanging(head, a.args, len(head)) if a.args else head.rstrip())
    head = f"  {prog} proxies "
    out.append(_hanging(head, PROXIES_USAGE.format(crawl=crawl), len(head)))
    return "\n".join(out)


def help_epilog() -> str:
    """The actions and exit statuses, for the end of both commands' ``--help``."""
    width = max(len(name) for name in ACTIONS)
    lines = ["actions:"]
    lines += [_hanging(f"  {a.name:<{width}}  ", a.summary, width + 4)
              for a in ACTIONS.values()]
    lines.append(_hanging(f"  {'proxies':<{width}}  ", PROXIES_SUMMARY, width + 4))
    lines += ["", "exit statuses:"]
    lines += [_hanging(f"  {status:>3}  ", meaning, 7) for status, meaning in EXIT_STATUSES]
    return "\n".join(lines)


def help_description(prog: str, crawl: str, intro: str) -> str:
    """*intro* wrapped, then the usage entries of every action."""
    return textwrap.fill(intro, _WIDTH) + "\n\n" + usage_lines(prog, crawl)


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``scrapy-fleet`` and ``scrapy fleet``."""
    parser.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                        help="push: read URL / JSON lines from FILE ('-' for standard input; "
                             "a bare '-' argument too)")
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
    parser.add_argument("--json", action="store_true",
                        help="status, recrawl, dead, failed, settings: print JSON")
    parser.add_argument("--limit", type=int, default=20,
                        help="dead, status --hosts, top: how many to show")
    parser.add_argument("--hosts", action="store_true",
                        help="status: also show each host's politeness state")
    parser.add_argument("--yes", action="store_true", help="purge: do not ask for confirmation")
    parser.add_argument("--reason", default=None, metavar="REASON",
                        help="failed, retry: only the records with this reason (e.g. http/500)")
    parser.add_argument("--all", action="store_true", help="retry: every record")
    parser.add_argument("--dead", action="store_true",
                        help="retry: the dead letters instead of the failed requests")
    parser.add_argument("--role", choices=list(ACL_ROLE_USES), default=None,
                        help="acl: only this role's rule (default: every role)")
    parser.add_argument("--proxies", action="store_true",
                        help="acl: the crawl uses the proxy pool (inside a project, when "
                             "FLEET_PROXIES or FLEET_PROXY_POOL is set)")
    parser.add_argument("--retire", default=None, metavar="ID",
                        help="sessions: retire this session (never drawn again)")
    parser.add_argument("--reset", action="store_true",
                        help="sessions: retire every session of the pool(s)")
    monitoring_actions.add_arguments(parser)
    lookup.add_arguments(parser)
    host.add_arguments(parser)
    budget_commands.add_arguments(parser)
    control.add_arguments(parser)


def run_action(action: str, admin: FrontierAdmin | None, urls: list[str], opts: Any,
               fingerprint: Callable[[Request], bytes], label: str,
               confirm: Callable[[str], str] = input, low_watermark: int | None = None,
               has_method: Callable[[str], Any] | None = None,
               host_key_mode: str = "host", alerts_config: Any = None,
               forget_after: float | None = None, acl_target: AclTarget | None = None,
               partitions: int | None = None) -> int:
    """Run the action named *action* (a key of :data:`ACTIONS`) against *admin*; returns the
    exit status (:data:`EXIT_STATUSES`).  See :class:`ActionContext` for the arguments."""
    spec = ACTIONS.get(action)
    if spec is None:
        print(f"error: unknown action {action!r} ({', '.join(ACTIONS)})", file=sys.stderr)
        return push.EXIT_ERROR
    if urls and not spec.takes_urls:
        options = [u for u in urls if u.startswith("-")]
        print(f"error: unrecognized arguments: {' '.join(options)}" if options else
              f"error: {action} takes no arguments after the crawl (got {urls[0]!r}"
              + ("; a host goes in --host)" if "--host" in spec.args else ")"),
              file=sys.stderr)
        return push.EXIT_ERROR
    ctx = ActionContext(admin, urls, opts, fingerprint, label, confirm, low_watermark,
                        has_method, host_key_mode, alerts_config, forget_after, acl_target,
                        partitions)
    try:
        if spec.needs_redis:
            if redis_url.parse(ctx.crawl.url).unverified:
                print("warning: ssl_cert_reqs=none in the Redis URL: TLS certificate "
                      "verification is off", file=sys.stderr)
            ctx.crawl.ping(ACL_ROLES.get(action))
            # issue 21: a partitioned crawl (commands/partitioned.py)
            if action == "purge":  # the crawl's own P, whatever the caller's
                ctx.parts = _purged_partitions(ctx)
            else:
                ctx.parts = ctx.partitions or partition_count.stored_partitions(
                    ctx.crawl.client, ctx.crawl.keys)
                if action == "push":  # its first writes wait while Redis is out of memory
                    if not actions.push_started(ctx.crawl, ctx.parts, ctx.opts):
                        return actions.oom_at_start(ctx.crawl.keys.crawl_id)
                else:
                    partition_count.start_sync(ctx.crawl.client, ctx.crawl.keys, ctx.parts,
                                               create=False)
            if spec.needs_state and not partitioned.has_state(ctx.crawl, ctx.parts):
                print(f"error: {ctx.crawl.no_record()}", file=sys.stderr)
                return push.EXIT_NO_CRAWL
        return spec.run(ctx)
    except (RedisUnavailableError, RedisPermissionError, CrawlLayoutError,
            FleetConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    except redis.exceptions.NoPermissionError as exc:  # a command the probe does not know
        role = ACL_ROLES.get(action)
        needs = (f" ({action} runs as the {role} role, which needs "
                 f"{', '.join(acl.commands(role))}; `scrapy fleet acl` prints its rule)"
                 if role else "")
        print(f"error: the Redis user lacks a permission: {exc}{needs}", file=sys.stderr)
        return push.EXIT_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted: lines already pushed stay pushed", file=sys.stderr)
        return 130


def _purged_partitions(ctx: ActionContext) -> int:
    """The P ``purge`` works with: the crawl's stored one, whatever FLEET_PARTITIONS the
    caller has (purge is what the P-mismatch line tells to run); says so when they differ."""
    parts = partition_count.stored_partitions(ctx.crawl.client, ctx.crawl.keys)
    if ctx.partitions and ctx.partitions != parts and (
            parts > 1 or ctx.crawl.has_state()):
        print(f"crawl {ctx.crawl.keys.crawl_id!r} was created with FLEET_PARTITIONS={parts} "
              f"(FLEET_PARTITIONS={ctx.partitions} here): purging its {parts} "
              f"partition{'s' if parts > 1 else ''}")
    return parts


def package_version() -> str:
    """The installed distribution's version (``scrapy_fleet.__version__`` when run from a
    tree that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("scrapy-fleet")
    except metadata.PackageNotFoundError:
        from scrapy_fleet import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scrapy-fleet",
        usage="scrapy-fleet [--redis URL] [--prefix PREFIX] ACTION [CRAWL_ID] [ARGS]",
        description=help_description(
            "scrapy-fleet", "CRAWL_ID", "Push URLs into a scrapy_fleet crawl and inspect it, "
            "outside a Scrapy project (inside one, `scrapy fleet` does the same with the "
            "project's settings). Its pushes use Scrapy's default request fingerprinter: for "
            "a crawl whose workers set REQUEST_FINGERPRINTER_CLASS, push with `scrapy fleet "
            "push` from the project."),
        epilog=help_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {package_version()}")
    parser.add_argument("--redis", metavar="URL", default=os.environ.get("FLEET_REDIS_URL",
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
    parser.add_argument("--pool", default=None,
                        help="acl --proxies, proxies: the proxy pool, FLEET_PROXY_POOL "
                             "(default: the crawl's own); sessions: one session pool")
    parser.add_argument("--partitions", default=None, metavar="P",
                        help="FLEET_PARTITIONS of the crawl (default: the one stored with it; "
                             "acl: 1): acl adds the partitions' keys when > 1, the other "
                             "actions refuse a crawl created with another P")
    parser.add_argument("action", choices=list(ACTIONS), metavar="ACTION",
                        help=f"one of {', '.join(ACTIONS)}, proxies")
    parser.add_argument("crawl_id", nargs="?", metavar="CRAWL_ID",
                        help="FLEET_CRAWL_ID of the crawl (default: spider name)")
    parser.add_argument("urls", nargs="*", metavar="URL",
                        help="push: URLs or JSON request lines ('-': standard input)")
    add_action_arguments(parser)
    return parser


# -- proxies: scrapy-fleet [--redis URL] [--prefix P] proxies ACTION CRAWL_ID [ARGS] --------
# (the logic is in scrapy_fleet/proxies/actions.py; this block only parses the command line)


def build_proxies_parser() -> argparse.ArgumentParser:
    """``scrapy-fleet ... proxies list|add|remove|drain|reset CRAWL_ID [ARGS]``."""
    from scrapy_fleet.proxies import actions as proxies_actions

    parser = argparse.ArgumentParser(
        prog="scrapy-fleet proxies", description="Show and change a fleet proxy pool.",
        epilog=proxies_actions.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default=os.environ.get("FLEET_REDIS_URL",
                                                          DEFAULTS["FLEET_REDIS_URL"]),
                        help="Redis URL (default: $FLEET_REDIS_URL or %(default)s)")
    parser.add_argument("--prefix", default=DEFAULTS["FLEET_KEY_PREFIX"],
                        help="key prefix, FLEET_KEY_PREFIX (default %(default)s)")
    parser.add_argument("command", choices=["proxies"])
    parser.add_argument("proxies_action", choices=list(proxies_actions.ACTIONS))
    parser.add_argument("crawl_id", help="FLEET_CRAWL_ID of the crawl (default: spider name)")
    parser.add_argument("args", nargs="*", help="add: proxy URLs; remove, drain, reset: exits")
    parser.add_argument("--json", action="store_true", help="list: print JSON")
    proxies_actions.add_proxies_arguments(parser)
    return parser


def _is_proxies(argv: list[str]) -> bool:
    """True when the first positional argument is ``proxies``."""
    pre = argparse.ArgumentParser(add_help=False)
    for option in ("--redis", "--prefix", "--queue-max", "--low-watermark"):
        pre.add_argument(option)
    pre.add_argument("rest", nargs=argparse.REMAINDER)
    known, _ = pre.parse_known_args(argv)
    return bool(known.rest) and known.rest[0] == "proxies"


def _crawl_options(parser: argparse.ArgumentParser, opts: Any) -> tuple[str, str, str | None]:
    """``(redis URL, crawl id, pool or None)`` of *opts*, validated; a bad one is a usage
    error (``parser.error``: exit status 2)."""
    try:
        url = validate_redis_url(opts.redis, "--redis")
        crawl_id = validate_crawl_id(opts.crawl_id, "CRAWL_ID")
        validate_key_prefix(opts.prefix, "--prefix")
        pool = validate_crawl_id(opts.pool, "--pool") if opts.pool else None
    except FleetConfigError as exc:
        parser.error(str(exc))
    return url, crawl_id, pool


def _partitions_option(parser: argparse.ArgumentParser, opts: Any) -> int | None:
    """``--partitions``, validated as FLEET_PARTITIONS is (None when not given); a bad one is
    a usage error."""
    if opts.partitions is None:
        return None
    try:
        return validate_partitions(opts.partitions, "--partitions")
    except FleetConfigError as exc:
        parser.error(str(exc))


def proxies_main(argv: list[str]) -> int:
    from scrapy_fleet.proxies import actions as proxies_actions

    parser = build_proxies_parser()
    opts = parser.parse_intermixed_args(argv)
    url, crawl_id, pool = _crawl_options(parser, opts)
    admin = proxies_actions.admin_for(url, opts.prefix, pool or crawl_id)
    try:
        return proxies_actions.run(admin, opts.proxies_action, opts.args, as_json=opts.json,
                                 sites=opts.site)
    finally:
        admin.client.close()


# -- end of proxies ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if _is_proxies(args):
        return proxies_main(args)
    parser = build_parser()
    if not args:  # argparse would also ask for a URL
        parser.error(f"an ACTION is required: one of {', '.join(ACTIONS)}, proxies")
    opts = parser.parse_intermixed_args(args)
    opts.action, opts.crawl_id, *opts.urls = host.reorder([opts.action, opts.crawl_id,
                                                           *opts.urls])
    if opts.action == "host" and (error := host.usage_error(opts.urls)):
        print(error, file=sys.stderr)
        return push.EXIT_ERROR
    spec = ACTIONS[opts.action]
    if spec.names_crawl:  # acl: the rules for this crawl, without Redis
        if opts.crawl_id is None or opts.urls:
            parser.error(f"{spec.name} takes one CRAWL_ID")
        url, crawl_id, pool = _crawl_options(parser, opts)
        target = AclTarget(crawl_id, opts.prefix, proxies=opts.proxies or pool is not None,
                           pool=pool, cluster=redis_url.parse(url).kind == "cluster",
                           partitions=_partitions_option(parser, opts) or 1)
        return run_action(spec.name, None, [], opts, push.default_fingerprinter(),
                          label="no project", acl_target=target)
    if not spec.needs_redis:
        extra = [a for a in (opts.crawl_id, *opts.urls) if a is not None]
        if extra:
            parser.error(f"{spec.name} takes no arguments (got {' '.join(extra)})")
        return run_action(spec.name, None, [], opts, push.default_fingerprinter(),
                          label="no project")
    if opts.crawl_id is None:
        parser.error(f"{spec.name} needs a CRAWL_ID")
    try:
        url = validate_redis_url(opts.redis, "--redis")
        crawl_id = validate_crawl_id(opts.crawl_id, "CRAWL_ID")
        validate_key_prefix(opts.prefix, "--prefix")
    except FleetConfigError as exc:
        parser.error(str(exc))
    parts = _partitions_option(parser, opts)
    stored = actions.stored_bounds(url, crawl_id, opts.prefix)
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
                          host_key_mode=stored.get("host_key", "host"), partitions=parts)
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
