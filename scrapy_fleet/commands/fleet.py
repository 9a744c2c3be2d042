"""``scrapy fleet push|status|dead|purge SPIDER ...`` inside a Scrapy project.

Uses the project's settings (with the spider's ``custom_settings`` and ``-s`` options), so
``FLEET_REDIS_URL``, ``FLEET_CRAWL_ID``, ``FLEET_KEY_PREFIX``, the dupefilter parameters and
``REQUEST_FINGERPRINTER_CLASS`` are those the workers use.  See cli.py for the actions and
exit statuses.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.crawler import Crawler
from scrapy.exceptions import UsageError
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_fleet.commands import cli
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.client import FrontierAdmin


class Command(ScrapyCommand):
    requires_project = True
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "push|status|dead|purge SPIDER [URL ...] [-f FILE | -] [options]"

    def short_desc(self) -> str:
        return "Push URLs into the fleet's frontier, show its status, or purge it"

    def long_desc(self) -> str:
        return (__doc__ or "") + "\n" + (cli.__doc__ or "")

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        cli.add_action_arguments(parser)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) < 2:
            raise UsageError("expected an action (push, status, dead, purge) and a spider name")
        action, spider_name, urls = args[0], args[1], args[2:]
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
        try:
            config = FleetConfig.from_settings(settings)
            crawl_id = config.resolve_crawl_id(spidercls.name)
        except FleetConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            self.exitcode = 2
            return
        crawler = Crawler(spidercls, settings)
        fingerprinter = build_from_crawler(
            load_object(settings["REQUEST_FINGERPRINTER_CLASS"]), crawler)
        admin = FrontierAdmin(config.redis_url, crawl_id, prefix=config.key_prefix,
                              params=config.frontier_params(), timeout=config.redis_timeout,
                              retries=config.redis_retries,
                              wait_replicas=config.redis_wait_replicas)
        try:
            self.exitcode = cli.run_action(action, admin, urls, opts, fingerprinter.fingerprint,
                                           label=f"spider {spidercls.name!r}",
                                           low_watermark=config.queue_low,
                                           host_key_mode=config.host_key,
                                           has_method=lambda name: callable(
                                               getattr(spidercls, name, None)))
        finally:
            admin.close()
