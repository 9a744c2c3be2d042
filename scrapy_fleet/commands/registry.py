"""The actions of ``scrapy-fleet`` and ``scrapy fleet``, registered: one row of
:data:`ACTIONS` per action (name, one-line summary, arguments, handler), what a handler gets
(:class:`ActionContext`), the Redis role each runs as (:data:`ACL_ROLES`) and both commands'
exit statuses (:data:`EXIT_STATUSES`).  The parser's choices, both commands' help texts and
Scrapy's command list are built from these rows (commands/cli.py parses the command line and
runs a row), so a new action is one handler plus one row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scrapy import Request

from scrapy_fleet import acl
from scrapy_fleet.catalog import SETTINGS, format_default, settings_listing
from scrapy_fleet.commands import actions, control, host, lookup, partitioned, push, sessions
from scrapy_fleet.commands import budget as budget_commands
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.monitoring import actions as monitoring_actions

#: ``(status, meaning)`` of both commands' exit statuses (shown by ``--help``)
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (push.EXIT_OK, "success"),
    (push.EXIT_REJECTED, "push: some lines were rejected (the valid ones were pushed); "
                         "purge: declined; proxies: an exit named matched nothing; "
                         "recrawl: the URL is not in the recrawl schedule; urls, host drop: "
                         "the crawl has no such host, or (host drop) declined; pause, host "
                         "block: a live worker did not confirm in time (named)"),
    (push.EXIT_ERROR, "usage error, or Redis unreachable, refusing the credentials, or not "
                      "a Redis server; scrapy fleet: the project does not enable the add-on, "
                      "or push/retry into a crawl of another spider"),
    (push.EXIT_FULL, "push: the frontier stayed full (--no-wait, or --timeout expired); the "
                     "lines from the one reported on were not pushed"),
    (push.EXIT_NO_CRAWL, "status, dead, failed, retry, top, recrawl: Redis has no record of that "
                         "crawl (check the crawl id and the key prefix); url, hosts, urls, "
                         "pause, resume, host "
                         "too"),
    (130, "interrupted (Ctrl-C); lines already pushed stay pushed"),
)


@dataclass
class ActionContext:
    """What an action's handler gets.  *admin* is None for an action without Redis;
    *low_watermark* (entries): where a push waiting for room resumes; *has_method*: checks
    pushed callback names against the spider (inside a project); *host_key_mode*: the
    crawl's ``FLEET_HOST_KEY``, which pushed entries are counted under; *alerts_config*:
    thresholds of the status alerts (``monitoring.alerts.AlertConfig``, None: defaults)."""

    admin: FrontierAdmin | None
    urls: list[str]
    opts: Any
    fingerprint: Callable[[Request], bytes]
    label: str
    confirm: Callable[[str], str] = input
    low_watermark: int | None = None
    has_method: Callable[[str], Any] | None = None
    host_key_mode: str = "host"
    alerts_config: Any = None
    #: FLEET_WORKER_FORGET_AFTER, for the sampling of ``top`` and ``monitor``
    forget_after: float | None = None
    #: what ``acl`` prints the rules for (:class:`AclTarget`; the actions without Redis)
    acl_target: AclTarget | None = None
    #: FLEET_PARTITIONS of the project (None: the crawl's own, as stored; issue 21)
    partitions: int | None = None
    #: the crawl's partitions (set once Redis answered)
    parts: int = 1

    @property
    def crawl(self) -> FrontierAdmin:
        assert self.admin is not None, "an action with needs_redis=True"
        return self.admin


@dataclass(frozen=True)
class AclTarget:
    """The deployment ``acl`` prints the ACL rules for: the crawl (its id and key prefix),
    whether it uses the proxy pool (and which), and whether Redis is a cluster."""

    crawl_id: str
    prefix: str
    proxies: bool = False
    pool: str | None = None
    cluster: bool = False
    #: FLEET_PARTITIONS (issue 21): > 1 adds the pattern of the partitions' keys
    partitions: int = 1
    #: the scrapy-redis start keys the spider reads (issue 36: compat/feeder.py)
    start_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """One action of ``scrapy-fleet`` and ``scrapy fleet``."""

    name: str
    summary: str  #: one line, for the help texts
    args: str  #: its arguments after the crawl (usage line)
    run: Callable[[ActionContext], int]
    takes_urls: bool = False  #: positional arguments after the crawl are allowed
    #: False: runs without a crawl and without Redis (``settings``)
    needs_redis: bool = True
    #: True: a crawl of which Redis holds nothing is an error (exit status 4), not zeros
    needs_state: bool = False
    #: with needs_redis=False: the action still names a crawl (``acl``)
    names_crawl: bool = False


def _settings_action(ctx: ActionContext) -> int:
    if getattr(ctx.opts, "json", False):
        print(json.dumps([{"name": s.name, "type": s.type, "default": s.default,
                           "meaning": s.meaning, "section": s.section, "doc": s.doc}
                          for s in SETTINGS], indent=2, default=format_default))
    else:
        print(settings_listing(), end="")
    return push.EXIT_OK


#: the ``acl`` roles and what runs as each (scrapy_fleet/acl.py, docs/deployment.md)
ACL_ROLE_USES = {"worker": "scrapy crawl, push",
                 "monitor": "status, recrawl, dead, failed, top, monitor, url, hosts, urls, crawls",
                 "admin": "purge, retry, host, proxies, budget, pause, resume"}


def _acl_action(ctx: ActionContext) -> int:
    target = ctx.acl_target
    assert target is not None, "acl runs with an AclTarget"
    role = getattr(ctx.opts, "role", None)
    for name in [role] if role else list(ACL_ROLE_USES):
        rule = acl.acl_rule(name, key_prefix=target.prefix, crawl_id=target.crawl_id,
                            cluster=target.cluster, proxies=target.proxies, pool=target.pool,
                            partitions=target.partitions > 1, start_keys=target.start_keys)
        print(f"# {name}: {ACL_ROLE_USES[name]}")
        print(f"ACL SETUSER fleet-{name} on >PASSWORD {rule}")
    return push.EXIT_OK


#: The actions, in the order the help texts list them.
ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("push", "push URLs or JSON request lines into the crawl's frontier",
           "[URL ...] [-f FILE | -] [--dont-filter] [--priority N] [--no-wait] [--timeout S]",
           lambda c: actions.run_push(partitioned.PartitionedPush(c.crawl, c.parts), c.urls,
                                      c.opts, c.fingerprint, c.low_watermark, c.has_method,
                                      c.host_key_mode),
           takes_urls=True),
    Action("status", "show the crawl's counts, workers and bounds", "[--json] [--hosts]",
           lambda c: partitioned.run_status(c.crawl, c.opts, c.label, c.parts,
                                            c.low_watermark, c.alerts_config),
           needs_state=True),
    Action("recrawl", "show one page's recrawl state: next due time, change rate, last "
           "outcome", "URL [--json]",
           lambda c: actions.run_recrawl(c.crawl, c.urls, c.opts, c.fingerprint,
                                         c.host_key_mode, c.parts),
           takes_urls=True, needs_state=True),
    Action("dead", "list the crawl's dead letters", "[--limit N] [--json]",
           lambda c: partitioned.run_dead(c.crawl, c.opts, c.parts), needs_state=True),
    Action("failed", "list the requests that failed for good",
           "[--reason R] [--limit N] [--json]",
           lambda c: partitioned.run_failed(c.crawl, c.opts, c.parts), needs_state=True),
    Action("retry", "push failed requests (--dead: dead letters) again, once each",
           "(--reason R | --all) [--dead]",
           lambda c: partitioned.run_retry(c.crawl, c.opts, c.parts, c.host_key_mode),
           needs_state=True),
    Action("top", "live terminal view: depth, pages/min, workers, hosts, alerts",
           "[--interval S] [--once] [--limit N]",
           lambda c: monitoring_actions.run("top", c.crawl, c.opts, c.alerts_config,
                                            c.forget_after, c.parts), needs_state=True),
    Action("monitor", "serve the dashboard, Prometheus /metrics and /api/* for the fleet",
           "--port P [--host H] [--host-metrics N]",
           lambda c: monitoring_actions.run("monitor", c.crawl, c.opts, c.alerts_config,
                                            c.forget_after, c.parts)),
    Action("purge", "delete every key of the crawl (asks first)", "[--yes]",
           lambda c: partitioned.run_purge(c.crawl, c.opts, c.label, c.parts, c.confirm)),
    Action("shards", "show which Redis master holds which partition of the crawl",
           "[--json]", lambda c: partitioned.run_shards(c.crawl, c.opts, c.parts)),
    Action("sessions", "list the session pools and sessions; retire one, or reset a pool",
           "[--pool P] [--retire ID] [--reset] [--json]",
           lambda c: sessions.run(c.crawl, c.opts)),
    Action("budget", "set the crawl's (or a host's) budget, or show them (docs/control.md)",
           "[--host H] [--pages N] [--seconds S] [--json]",
           lambda c: budget_commands.run(c.crawl, c.opts, c.parts), needs_state=True),
    *control.ACTIONS(Action),  # crawl control (issue 34): pause, resume
    Action("settings", "list every FLEET_* setting with its type, default and meaning",
           "[--json]", _settings_action, needs_redis=False),
    Action("acl", "print the least-privilege ACL rules of the crawl's roles (worker, "
           "monitor, admin)", "[--role R] [--proxies] [--pool P] [--partitions P]", _acl_action,
           needs_redis=False, names_crawl=True),
    *(Action(**row) for row in (*lookup.ROWS, host.ROW)),  # url, hosts, urls, crawls, host
)}


#: action -> the least-privilege role it needs (scrapy_fleet/acl.py), checked at start;
#: every ``proxies`` action runs as ``admin`` (proxies/actions.py probes the pool's keys)
ACL_ROLES = {"push": "worker", "retry": "admin", "purge": "admin", "status": "monitor",
             "budget": "admin",
             "recrawl": "monitor",
             "dead": "monitor", "failed": "monitor", "top": "monitor", "monitor": "monitor",
             **lookup.ROLES, **host.ROLES, **control.ACL_ROLES}
