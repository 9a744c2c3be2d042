"""``scrapy fleet ACTION SPIDER ...`` inside a Scrapy project.

Uses the project's settings (with the spider's ``custom_settings`` and ``-s`` options), so
``FLEET_REDIS_URL``, ``FLEET_CRAWL_ID``, ``FLEET_KEY_PREFIX``, the dupefilter parameters and
``REQUEST_FINGERPRINTER_CLASS`` are those the workers use.  The actions, their help and the
exit statuses come from the table in registry.py (``cli.ACTIONS``, ``cli.EXIT_STATUSES``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import redis
from scrapy.commands import ScrapyCommand, ScrapyHelpFormatter
from scrapy.crawler import Crawler
from scrapy.exceptions import UsageError
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_fleet import codec, identity
from scrapy_fleet.commands import cli, host
from scrapy_fleet.compat.settings import translate
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import CrawlSpiderError, FleetConfigError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.monitoring.alerts import AlertConfig
from scrapy_fleet.startup import warn_unknown_settings

#: scrapy fleet import-scrapy-redis SPIDER (docs/from-scrapy-redis.md), in a project only
IMPORT_ACTION = "import-scrapy-redis"
#: actions that put requests into the crawl: refused when it belongs to another spider
_WRITES_REQUESTS = ("push", "retry")
#: the one line of a project whose settings do not enable the add-on
ADDON_OFF = ("error: this project's settings do not enable scrapy_fleet (ADDONS has no "
             "scrapy_fleet.Addon), so `scrapy crawl` would run as plain Scrapy: put "
             "\"scrapy_fleet.Addon\": 500 into the ADDONS dict of settings.py (a later "
             "`ADDONS = {}` line, as `scrapy startproject` writes, replaces an earlier one)")


#: the one line of `scrapy fleet` run outside any Scrapy project
NO_PROJECT = ("error: not inside a Scrapy project (no scrapy.cfg in this folder or a parent, "
              "and SCRAPY_SETTINGS_MODULE unset): run `scrapy fleet` in the project's folder, "
              "or use `scrapy-fleet --redis URL ACTION CRAWL_ID`, which needs no project")


def _inside_project() -> bool:
    """Scrapy's own test (``scrapy.utils.project.inside_project``): a scrapy.cfg in the
    current folder or a parent, or an importable SCRAPY_SETTINGS_MODULE."""
    from scrapy.utils.project import inside_project

    return inside_project()


def addon_enabled(settings: Any) -> bool:
    """True when ``ADDONS`` (settings, ``-s`` options) lists :class:`scrapy_fleet.Addon` or a
    subclass of it with a priority that is not None."""
    from scrapy.utils.misc import load_object

    from scrapy_fleet.addon import Addon

    for path, priority in settings.getdict("ADDONS").items():
        if priority is None:
            continue
        try:
            obj = load_object(path) if isinstance(path, str) else path
        except (ImportError, NameError, ValueError):
            continue  # Scrapy names a wrong path when it loads the add-ons
        if isinstance(obj, type) and issubclass(obj, Addon):
            return True
    return False


def _print_warning(message: str, *args: Any) -> None:
    print("warning: " + message % args, file=sys.stderr)


class FleetHelpFormatter(argparse.RawDescriptionHelpFormatter, ScrapyHelpFormatter):
    """Scrapy's help layout (titled sections) that keeps the line breaks of the description
    and epilog: the usage entries, actions and exit statuses stay one per line."""


def warn_plain_crawl() -> None:
    """``scrapy crawl`` in a project whose settings name ``FLEET_*`` settings but whose
    ``ADDONS`` lacks the add-on runs as plain Scrapy: say so on stderr, once (the crawl goes
    on; we cannot stop it).  Never raises."""
    try:
        from scrapy.utils.project import get_project_settings, inside_project

        from scrapy_fleet import engine_hooks

        if engine_hooks.running_command() not in ("crawl", "runspider") or not inside_project():
            return
        settings = get_project_settings()
        named = sorted(k for k in settings.attributes if str(k).startswith("FLEET_"))
        if named and not addon_enabled(settings):
            print(f"warning: {named[0]} is set but this project's settings do not enable "
                  "scrapy_fleet (ADDONS has no scrapy_fleet.Addon): this crawl runs as plain "
                  "Scrapy, without the fleet; put \"scrapy_fleet.Addon\": 500 into the ADDONS "
                  "dict of settings.py", file=sys.stderr)
    except Exception:  # a warning must never break a Scrapy command
        return


class Command(ScrapyCommand):
    requires_project = True
    default_settings = {"LOG_ENABLED": False}

    def __init__(self) -> None:
        super().__init__()
        # Scrapy builds this class for every command it runs (engine_hooks.running_command)
        warn_plain_crawl()

    def syntax(self) -> str:
        return "ACTION [SPIDER] [ARGS] (the actions are listed below)"

    def short_desc(self) -> str:
        return f"Fleet actions: {', '.join([*cli.ACTIONS, IMPORT_ACTION])} (scrapy fleet -h)"

    def long_desc(self) -> str:
        return cli.help_description(
            "scrapy fleet", "SPIDER",
            "The fleet's actions inside a Scrapy project, with the project's settings (and "
            "the spider's custom_settings and -s options): FLEET_REDIS_URL, FLEET_CRAWL_ID "
            "(default: the spider's name), FLEET_KEY_PREFIX, the dupefilter parameters and "
            "REQUEST_FINGERPRINTER_CLASS are those the workers use.  Outside a project, "
            "scrapy-fleet does the same.")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.formatter_class = FleetHelpFormatter
        parser.epilog = cli.help_epilog()
        cli.add_action_arguments(parser)
        parser.add_argument("--trust-pickles", action="store_true",
                            help="import-scrapy-redis: read scrapy-redis's pickled requests "
                                 "(only when whoever could write that Redis is trusted)")
        from scrapy_fleet.proxies.actions import add_proxies_arguments

        add_proxies_arguments(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        try:
            self._run(args, opts)
        except BrokenPipeError:  # `scrapy fleet status SPIDER | head`: quiet, like scrapy-fleet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.exitcode = 1

    def _run(self, args: list[str], opts: argparse.Namespace) -> None:
        actions = ", ".join([*cli.ACTIONS, "proxies"])
        if not args:
            raise UsageError(f"expected an action ({actions})")
        assert self.settings is not None
        if not _inside_project():
            print(NO_PROJECT, file=sys.stderr)
            self.exitcode = 2
            return
        if not addon_enabled(self.settings):
            print(ADDON_OFF, file=sys.stderr)
            self.exitcode = 2
            return
        proxies_action = args[0] == "proxies"
        args = host.reorder(args)  # host drop SPIDER HOST: the spider second (commands/host.py)
        if args[0] == "host" and (error := host.usage_error(args[2:])):
            print(error, file=sys.stderr)
            self.exitcode = 2
            return
        if args[0] == IMPORT_ACTION:  # coming from scrapy-redis (compat/importer.py)
            if len(args) != 2:
                raise UsageError(f"expected: {IMPORT_ACTION} SPIDER [--trust-pickles]")
            self._run_in_project(args[0], args[1], [], opts, proxies_action=False)
            return
        spec = cli.ACTIONS.get(args[0])
        if spec is None and not proxies_action:
            raise UsageError(f"unknown action {args[0]!r} (one of {actions})")
        assert self.settings is not None
        if proxies_action:
            # scrapy fleet proxies ACTION SPIDER [ARGS]: the pool of the spider's crawl
            if len(args) < 3:
                raise UsageError("expected: proxies list|add|remove|drain|reset SPIDER [ARGS]")
            action, spider_name, urls = args[1], args[2], args[3:]
            self._run_in_project(action, spider_name, urls, opts, proxies_action=True)
            return
        assert spec is not None
        if spec.names_crawl:  # acl SPIDER: the rules for the spider's crawl and settings
            if len(args) != 2:
                raise UsageError(f"{spec.name} takes one spider name")
            self._run_in_project(args[0], args[1], [], opts, proxies_action=False)
            return
        if not spec.needs_redis:
            if len(args) > 1:
                raise UsageError(f"{spec.name} takes no arguments")
            warn_unknown_settings(self.settings, _print_warning)
            # (crawls: the project's Redis and key prefix)
            opts.redis = self.settings.get("FLEET_REDIS_URL") or cli.DEFAULTS["FLEET_REDIS_URL"]
            opts.prefix = self.settings.get("FLEET_KEY_PREFIX") or cli.DEFAULTS["FLEET_KEY_PREFIX"]
            self.exitcode = cli.run_action(spec.name, None, [], opts, lambda r: b"",
                                           label="project")
            return
        if len(args) < 2:
            raise UsageError(f"{spec.name} needs a spider name")
        self._run_in_project(args[0], args[1], args[2:], opts, proxies_action=False)

    def _run_in_project(self, action: str, spider_name: str, urls: list[str],
                        opts: argparse.Namespace, proxies_action: bool) -> None:
        assert self.settings is not None
        settings = self.settings.copy()
        assert self.crawler_process is not None
        try:
            spidercls: Any = self.crawler_process.spider_loader.load(spider_name)
        except KeyError:
            print(f"error: no spider named {spider_name!r} in this project", file=sys.stderr)
            self.exitcode = 2
            return
        spidercls.update_settings(settings)
        translate(settings)  # a scrapy-redis project's REDIS_URL... (compat/settings.py)
        warn_unknown_settings(settings, _print_warning)
        try:
            config = FleetConfig.from_settings(settings)
            crawl_id = config.resolve_crawl_id(spidercls.name)
        except FleetConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        if proxies_action:
            self.exitcode = self._proxies(config, crawl_id, action, urls, opts)
            return
        if action == IMPORT_ACTION:
            self.exitcode = self._import(config, crawl_id, spidercls, settings, opts)
            return
        if cli.ACTIONS[action].names_crawl:
            from scrapy_fleet import redis_url

            proxy = config.proxy
            uses_pool = bool(opts.proxies or opts.pool or (proxy is not None and proxy.enabled))
            pool = opts.pool or (proxy.pool_name(crawl_id) if proxy is not None and
                                 proxy.enabled else None)
            from scrapy_fleet.compat.feeder import class_start_key

            start_key = class_start_key(spidercls, settings)
            target = cli.AclTarget(crawl_id, config.key_prefix, proxies=uses_pool, pool=pool,
                                   cluster=redis_url.parse(config.redis_url).kind == "cluster",
                                   partitions=config.partitions,
                                   start_keys=(start_key,) if start_key else ())
            self.exitcode = cli.run_action(action, None, [], opts, lambda r: b"",
                                           label=f"spider {spidercls.name!r}",
                                           acl_target=target)
            return
        if action in _WRITES_REQUESTS:
            owned = self._own_crawl(config, crawl_id, spidercls, action, opts)
            if owned is not True:
                self.exitcode = 2 if owned is False else owned
                return
        crawler = Crawler(spidercls, settings)
        fingerprinter = build_from_crawler(
            load_object(settings["REQUEST_FINGERPRINTER_CLASS"]), crawler)
        admin = FrontierAdmin(config.redis_url, crawl_id, prefix=config.key_prefix,
                              params=config.frontier_params(), timeout=config.redis_timeout,
                              retries=config.redis_retries,
                              wait_replicas=config.redis_wait_replicas)
        label = f"spider {spidercls.name!r}"
        owner = identity.recorded_spider(admin.client, admin.keys)
        if owner is not None and owner != spidercls.name:  # (status of another spider's crawl)
            label = f"spider {owner!r}, not {spidercls.name!r}"
        try:
            self.exitcode = cli.run_action(action, admin, urls, opts, fingerprinter.fingerprint,
                                           label=label,
                                           low_watermark=config.backpressure.queue_low,
                                           host_key_mode=config.politeness.host_key,
                                           alerts_config=AlertConfig.from_config(config.monitoring),
                                           forget_after=config.monitoring.worker_forget_after,
                                           partitions=config.partitions,
                                           has_method=lambda name: codec.callback_problem(
                                               spidercls, name, pushed=True) or getattr(
                                               spidercls, name, None))
        finally:
            admin.close()

    def _import(self, config: FleetConfig, crawl_id: str, spidercls: Any, settings: Any,
                opts: argparse.Namespace) -> int:
        """``import-scrapy-redis SPIDER``: compat/importer.py, into the spider's crawl."""
        from scrapy_fleet import redis_client
        from scrapy_fleet.compat import importer

        client = redis_client.make_client(config.redis_url, config.redis_timeout)
        try:
            why = importer.refusal(client, config, spidercls.name, opts.trust_pickles)
        except redis.RedisError as exc:
            why = f"error: {exc}"
        finally:
            client.close()
        if why is not None:
            print(why, file=sys.stderr)
            return 2
        # an import into a Redis out of memory gives up at once (exit status 3), as push --no-wait
        owned = self._own_crawl(config, crawl_id, spidercls, "push",
                                argparse.Namespace(no_wait=True, timeout=None))
        if owned is not True:
            return 2 if owned is False else owned
        crawler = Crawler(spidercls, settings)
        fingerprinter = build_from_crawler(
            load_object(settings["REQUEST_FINGERPRINTER_CLASS"]), crawler)
        spider = spidercls.from_crawler(crawler)
        admin = FrontierAdmin(config.redis_url, crawl_id, prefix=config.key_prefix,
                              params=config.frontier_params(), timeout=config.redis_timeout,
                              retries=config.redis_retries)
        try:
            return importer.run(admin, config, spider, fingerprinter.fingerprint,
                                trusted=opts.trust_pickles)
        except redis.RedisError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            admin.close()

    @staticmethod
    def _own_crawl(config: FleetConfig, crawl_id: str, spidercls: Any, action: str,
                   opts: argparse.Namespace) -> bool | int:
        """Record *spidercls* as the crawl's spider (push; retry only checks: it writes no
        request of its own), or check it is the recorded one (identity.py); False (and one
        line on stderr) when the crawl is another spider's.  A push waits while Redis is out
        of memory (as its batches do; the time counts against --timeout), and gives up with
        exit status 3 (returned) after --no-wait or --timeout.
        A Redis that does not answer, or a crawl of another layout (frontier/layout.py), is
        left to the action, which reports it its way."""
        from scrapy_fleet import redis_client
        from scrapy_fleet.commands import actions, push
        from scrapy_fleet.frontier import layout
        from scrapy_fleet.keys.crawl import CrawlKeys

        client = redis_client.make_client(config.redis_url, config.redis_timeout)
        keys = CrawlKeys(config.key_prefix, crawl_id)
        try:
            layout.check_sync(client, keys)  # (a crawl of another layout: nothing written here)
            claim = lambda: identity.claim_crawl(  # noqa: E731
                client, keys, spidercls.name, identity.spider_path(spidercls),
                record=action == "push")
            if action != "push":
                claim()
                return True
            waited = push.until_memory(claim, opts.no_wait, opts.timeout, actions.WaitDisplay())
            if opts.timeout is not None:
                opts.timeout = max(0.0, opts.timeout - waited)
        except push.FrontierFull:
            return actions.oom_at_start(crawl_id)
        except layout.CrawlLayoutError:
            pass  # the action refuses it, in its own words
        except CrawlSpiderError as exc:
            fix = identity.spider_fix(exc)
            done = "pushed" if action == "push" else "retried"
            print(f"error: {exc}: nothing {done}. {fix}", file=sys.stderr)
            return False
        except redis.RedisError:
            pass
        finally:
            client.close()
        return True

    @staticmethod
    def _proxies(config: FleetConfig, crawl_id: str, action: str, args: list[str],
                 opts: argparse.Namespace) -> int:
        from scrapy_fleet.proxies import actions as proxies_actions

        assert config.proxy is not None
        pool = opts.pool or config.proxy.pool_name(crawl_id)
        try:
            admin = proxies_actions.admin_for(config.redis_url, config.key_prefix, pool,
                                            config.proxy, config.redis_timeout)
        except FleetConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            status = proxies_actions.run(admin, action, args, as_json=opts.json, sites=opts.site)
        finally:
            admin.client.close()
        hint = proxies_actions.unused_pool_hint(action, status, config.proxy, crawl_id, pool)
        if hint:
            print(hint, file=sys.stderr)
        return status
