"""``scrapy_fleet.Addon``: one line in ``ADDONS`` turns a Scrapy project into a fleet worker."""

from __future__ import annotations

from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

#: component -> order, added to the project's component dicts
SPIDER_MIDDLEWARES = {"scrapy_fleet.frontier.spidermw.FleetSpiderMiddleware": 0,
                      # recrawl: items carry their fetch time and signature (FLEET_RECRAWL)
                      "scrapy_fleet.recrawl.items.FleetRecrawlItems": 950,
                      # recrawl: a sitemap's <lastmod> goes with its links (recrawl/sitemaps.py)
                      "scrapy_fleet.recrawl.sitemaps.FleetSitemapLastmod": 940}
ITEM_PIPELINES = {
    # listed when their setting is given; each also disables itself (NotConfigured) without
    "scrapy_fleet.pipelines.mongo.MongoPipeline": 300,
    "scrapy_fleet.pipelines.jsonlines.JsonLinesPipeline": 800,
}


DOWNLOADER_MIDDLEWARES = {
    "scrapy_fleet.politeness.middlewares.FleetRobotsTxtMiddleware": 100,
    "scrapy_fleet.politeness.middlewares.FleetPolitenessMiddleware": 560,
    # after politeness, before HttpProxyMiddleware (750); sees answers after redirects (600)
    # and decompression (590): scrapy_fleet/proxies/middleware.py
    "scrapy_fleet.proxies.middleware.FleetProxyMiddleware": 585,
    # recrawl: conditional GET and the outcome of a fetch, after the retries (550) and
    # redirects (600) are decided and the body decompressed (590): recrawl/middleware.py
    "scrapy_fleet.recrawl.middleware.FleetRecrawlMiddleware": 540,
}

#: first of all extensions: checks the settings and Redis before Scrapy builds its engine,
#: so a worker that cannot start stops with one clear line (startup.py)
EXTENSIONS = {"scrapy_fleet.startup.FleetStartupCheck": -1000,
              # requests that fail for good: recorded with their acknowledgement (failures/)
              "scrapy_fleet.failures.watch.FleetFailureWatch": 0}

#: components listed only when their setting is given
_ENABLED_BY: dict[str, tuple[str, ...]] = {
    "scrapy_fleet.pipelines.mongo.MongoPipeline": ("FLEET_MONGO_URI",),
    "scrapy_fleet.pipelines.jsonlines.JsonLinesPipeline": ("FLEET_JSONL_PATH",),
    "scrapy_fleet.proxies.middleware.FleetProxyMiddleware": ("FLEET_PROXIES",
                                                             "FLEET_PROXY_POOL"),
    "scrapy_fleet.recrawl.middleware.FleetRecrawlMiddleware": ("FLEET_RECRAWL",),
    "scrapy_fleet.recrawl.items.FleetRecrawlItems": ("FLEET_RECRAWL",),
    "scrapy_fleet.recrawl.sitemaps.FleetSitemapLastmod": ("FLEET_RECRAWL",),
}


def _given(value: object) -> bool:
    """A setting that enables a component: set, and not "off" (FLEET_RECRAWL's default)."""
    return bool(value) and not (isinstance(value, str) and value.strip().lower() == "off")


class Addon:
    """Sets the fleet's scheduler, dupefilter, start-request middleware and item pipelines.

    Usage in ``settings.py``::

        ADDONS = {"scrapy_fleet.Addon": 500}
        FLEET_REDIS_URL = "redis://user:password@redis-host:6379/0"

    ``SCHEDULER`` and ``DUPEFILTER_CLASS`` are set at the add-on priority, so a value given in
    the project's settings or on the command line wins (and then the fleet is not used).
    No ``SCHEDULER_*`` setting is read or redefined.

    Before Scrapy builds its engine, the extension ``scrapy_fleet.startup.FleetStartupCheck``
    validates every ``FLEET_*`` setting and PINGs Redis: a worker that cannot start logs one
    ERROR line (what is wrong, how to fix it) and ``scrapy crawl`` exits with status 1.
    """

    def update_settings(self, settings: BaseSettings) -> None:
        self._politeness_settings(settings)
        self._browser_settings(settings)
        settings.set("SCHEDULER", "scrapy_fleet.frontier.scheduler.FleetScheduler", "addon")
        settings.set("DUPEFILTER_CLASS",
                     "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter", "addon")
        for name, components in (("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
                                 ("ITEM_PIPELINES", ITEM_PIPELINES),
                                 ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
                                 ("EXTENSIONS", EXTENSIONS)):
            current = settings.getdict(name)
            for path, order in components.items():
                needs = _ENABLED_BY.get(path)
                if needs and not any(_given(settings.get(name)) for name in needs):
                    continue  # not configured: not listed (no "Disabled ..." warning)
                if path not in current and load_object(path) not in current:
                    settings.set_in_component_priority_dict(name, load_object(path), order)

    @staticmethod
    def _browser_settings(settings: BaseSettings) -> None:
        """``FLEET_PLAYWRIGHT = True``: scrapy-playwright's download handlers, the asyncio
        reactor and the abort rule for heavy resources (browser/handler.py).  Wrong values
        are reported by the start-up check, which validates them again (browser/settings.py)."""
        try:
            enabled = settings.getbool("FLEET_PLAYWRIGHT")
        except ValueError:
            return  # the start-up check names the setting and the value
        if not enabled:
            return
        from scrapy_fleet.browser.handler import DEFAULT_ABORT, abort_types, install

        abort = abort_types(settings.get("FLEET_PLAYWRIGHT_ABORT", DEFAULT_ABORT))
        install(settings, abort if isinstance(abort, (list, tuple)) else DEFAULT_ABORT)

    @staticmethod
    def _politeness_settings(settings: BaseSettings) -> None:
        """Toward one host the fleet behaves like one Scrapy process with the project's
        settings: ``DOWNLOAD_DELAY`` becomes the fleet-wide interval (``FLEET_HOST_DELAY``)
        and is set to 0 in each worker, so that per-process delays do not stack on it;
        ``CONCURRENT_REQUESTS_PER_DOMAIN`` is the fleet-wide cap unless
        ``FLEET_HOST_CONCURRENCY`` is set (config.py).  Scrapy's own RobotsTxtMiddleware is
        replaced by the fleet's shared one."""
        if settings.get("FLEET_HOST_DELAY") is None:
            settings.set("FLEET_HOST_DELAY", settings.getfloat("DOWNLOAD_DELAY"),
                         settings.getpriority("DOWNLOAD_DELAY") or 0)
        priority = max(settings.getpriority("DOWNLOAD_DELAY") or 0, 15)
        settings.set("DOWNLOAD_DELAY", 0, priority)  # (a 0 delay has no jitter to turn off)
        current = settings.getdict("DOWNLOADER_MIDDLEWARES")
        robots = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
        if robots not in current:
            settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES",
                                                    load_object(robots), None)
