"""``scrapy_fleet.Addon``: one line in ``ADDONS`` turns a Scrapy project into a fleet worker."""

from __future__ import annotations

import logging
import math

from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from scrapy_fleet.budget_settings import carry_closespider
from scrapy_fleet.compat.settings import REPLACED, translate

logger = logging.getLogger(__name__)

#: Scrapy commands that fetch a few pages for a developer and exit (docs/scrapy-compat.md):
#: in a fleet project they run as plain Scrapy, in their one process.  With the fleet's
#: scheduler their requests went into the live crawl's frontier (``scrapy parse``'s wrapped
#: callback could not even be stored: a failed record in the crawl) and the command waited
#: for work forever.
ONE_PROCESS_COMMANDS = frozenset({"shell", "parse", "fetch", "view", "check", "bench"})

#: component -> order, added to the project's component dicts
SPIDER_MIDDLEWARES = {"scrapy_fleet.frontier.spidermw.FleetSpiderMiddleware": 0,
                      # recrawl: items carry their fetch time and signature (FLEET_RECRAWL)
                      "scrapy_fleet.recrawl.items.FleetRecrawlItems": 950,
                      # recrawl: a sitemap's <lastmod> goes with its links (recrawl/sitemaps.py)
                      "scrapy_fleet.recrawl.sitemaps.FleetSitemapLastmod": 940,
                      # sessions: children keep their parent's session (sessions/drawing.py)
                      "scrapy_fleet.sessions.drawing.FleetSessionsSpiderMiddleware": 800}
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
    # last before the network: a leased request whose lease a stall may have lost waits for
    # the revalidation, or is not sent (frontier/leaseguard.py ORDER)
    "scrapy_fleet.frontier.leaseguard.FleetLeaseGuardMiddleware": 990,
    # sessions: draws the session before the cookies (700) name its jar; sees the answers
    # after the retries (550) and redirects (600): sessions/drawing.py
    "scrapy_fleet.sessions.drawing.FleetSessionsMiddleware": 545,
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
    "scrapy_fleet.sessions.drawing.FleetSessionsMiddleware": ("FLEET_SESSION_POOL_SIZE",),
    "scrapy_fleet.sessions.drawing.FleetSessionsSpiderMiddleware": ("FLEET_SESSION_POOL_SIZE",),
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
        from scrapy_fleet import engine_hooks

        command = engine_hooks.running_command()
        if command in ONE_PROCESS_COMMANDS:
            logger.info("scrapy %s runs as plain Scrapy in this fleet project: it does not "
                        "touch the fleet's frontier, filter or politeness in Redis", command)
            return
        translate(settings)  # a scrapy-redis project's settings (docs/from-scrapy-redis.md)
        carry_closespider(settings)  # CLOSESPIDER_PAGECOUNT/_TIMEOUT: the crawl's budgets
        self._politeness_settings(settings)
        self._browser_settings(settings)
        self._cookie_settings(settings)
        for name, path in REPLACED.items():
            settings.set(name, path, "addon")
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
    def _cookie_settings(settings: BaseSettings) -> None:
        """Scrapy's cookie jars live in Redis (docs/sessions.md): the fleet's
        ``FleetCookiesMiddleware`` takes the place (700) of Scrapy's ``CookiesMiddleware``,
        unless ``FLEET_COOKIES`` is False (Scrapy's own, per process).  A wrong value keeps
        the fleet's: the start-up check names it and stops the worker."""
        try:
            enabled = settings.getbool("FLEET_COOKIES", True)
        except ValueError:
            enabled = True
        if not enabled:
            return
        current = settings.getdict("DOWNLOADER_MIDDLEWARES")
        scrapys = "scrapy.downloadermiddlewares.cookies.CookiesMiddleware"
        if scrapys in current or load_object(scrapys) in current:
            return  # the project lists (or disables) Scrapy's own: its choice
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES",
                                                load_object(scrapys), None)
        fleets = "scrapy_fleet.sessions.middleware.FleetCookiesMiddleware"
        if fleets not in current and load_object(fleets) not in current:
            settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES",
                                                    load_object(fleets), 700)

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
        replaced by the fleet's shared one.  A ``DOWNLOAD_DELAY`` that is no number >= 0 is
        left in place (and nothing else done here): the start-up check refuses it by the
        name the user set (politeness/settings.py)."""
        if settings.get("FLEET_HOST_DELAY") is None:
            try:
                delay = settings.getfloat("DOWNLOAD_DELAY")
            except (TypeError, ValueError):
                delay = -1.0
            if not 0 <= delay < float("inf"):
                return  # left as it is: the start-up check names DOWNLOAD_DELAY and the value
            settings.set("FLEET_HOST_DELAY", delay, settings.getpriority("DOWNLOAD_DELAY") or 0)
        priority = max(settings.getpriority("DOWNLOAD_DELAY") or 0, 15)
        settings.set("DOWNLOAD_DELAY", 0, priority)  # (a 0 delay has no jitter to turn off)
        carry_autothrottle(settings)
        current = settings.getdict("DOWNLOADER_MIDDLEWARES")
        robots = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
        if robots not in current:
            settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES",
                                                    load_object(robots), None)


def carry_autothrottle(settings: BaseSettings) -> None:
    """Scrapy's AutoThrottle is one controller per process (N workers: N controllers);
    with ``FLEET_ADAPTIVE`` (the default) the fleet has one per host instead
    (docs/politeness.md), so ``AUTOTHROTTLE_ENABLED`` is turned off with one INFO line,
    and what it asked for is carried over: ``AUTOTHROTTLE_TARGET_CONCURRENCY`` (rounded
    up) becomes ``FLEET_HOST_CONCURRENCY`` unless that is set, and the slowest rate
    ``1 / AUTOTHROTTLE_MAX_DELAY`` the controller's floor (``FLEET_ADAPTIVE_MIN_RATE``)
    unless that is set.  ``AUTOTHROTTLE_START_DELAY`` has no counterpart: the controller
    starts at the configured rate (or the rate it learned in an earlier run)."""
    try:
        if not settings.getbool("AUTOTHROTTLE_ENABLED") or \
                not settings.getbool("FLEET_ADAPTIVE", True):
            return
        target = settings.getfloat("AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0)
        max_delay = settings.getfloat("AUTOTHROTTLE_MAX_DELAY", 60.0)
    except ValueError:
        return  # (the start-up check names a wrong FLEET_ADAPTIVE)
    carried = []
    if settings.get("FLEET_HOST_CONCURRENCY") is None and target > 0:
        settings.set("FLEET_HOST_CONCURRENCY", max(1, math.ceil(target)),
                     settings.getpriority("AUTOTHROTTLE_TARGET_CONCURRENCY") or 0)
        carried.append(f"FLEET_HOST_CONCURRENCY={max(1, math.ceil(target))}")
    if settings.get("FLEET_ADAPTIVE_MIN_RATE") is None and max_delay > 0:
        settings.set("FLEET_ADAPTIVE_MIN_RATE", 1 / max_delay,
                     settings.getpriority("AUTOTHROTTLE_MAX_DELAY") or 0)
        carried.append(f"FLEET_ADAPTIVE_MIN_RATE={1 / max_delay:g}")
    settings.set("AUTOTHROTTLE_ENABLED", False,
                 max(settings.getpriority("AUTOTHROTTLE_ENABLED") or 0, 15))
    carried_text = ", ".join(carried) or "nothing to carry over"
    fleet_wide, hosts = _adaptive_ceilings(settings)
    if fleet_wide:
        logger.info("AutoThrottle is per process: turned off, the fleet's adaptive politeness "
                    "has one controller per host for every worker (%s)", carried_text)
    else:
        # the controller slows a host down under its configured rate or delay (its ceiling,
        # docs/politeness.md): without one it does not act, and 429/503 only hold the host
        logger.info("AutoThrottle is per process: turned off; the fleet's adaptive "
                    "politeness, one controller per host for every worker, needs a rate or "
                    "delay to adapt under and %s: set FLEET_HOST_RATE, DOWNLOAD_DELAY or "
                    "FLEET_HOST_DELAY (%s)",
                    f"has one only for the {hosts} host(s) FLEET_HOST_OVERRIDES gives one"
                    if hosts else "none is set", carried_text)


def _adaptive_ceilings(settings: BaseSettings) -> tuple[bool, int]:
    """Whether a fleet-wide rate or delay is configured (``FLEET_HOST_RATE``,
    ``FLEET_HOST_DELAY``, by default the project's ``DOWNLOAD_DELAY``), and how many hosts of
    ``FLEET_HOST_OVERRIDES`` have one of their own: the ceilings the adaptive controller acts
    under.  A wrong value counts as configured (the start-up check refuses it by name)."""
    from scrapy_fleet.errors import FleetConfigError
    from scrapy_fleet.politeness.settings import politeness_config

    try:
        politeness = politeness_config(settings)
    except FleetConfigError:
        return True, 0
    hosts = sum(1 for interval, *_ in politeness.host_overrides.values() if interval)
    return politeness.host_interval > 0, hosts
