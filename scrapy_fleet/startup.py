"""The checks a fleet worker makes before Scrapy builds its engine.

A worker that cannot work (a wrong ``FLEET_*`` value, Redis down, a wrong password) must stop
with one clear line, not with the cascade of tracebacks Scrapy prints when a component fails
in ``Scheduler.open``: there the engine has opened half of the crawl, and closing the other
half fails too ("Scraper close failure", CoreStats' assertion...).

So the add-on lists :class:`FleetStartupCheck` as the first extension.  Scrapy builds the
extensions after every add-on has updated the settings and before it builds the engine
(downloader, scraper, scheduler); an exception raised there stops the crawl before anything
has started: nothing is fetched, nothing has to be closed, and ``scrapy crawl`` exits with
status 1 (Scrapy's "bootstrap failed").

On a failure the check logs one ERROR line naming the problem and its fix (with the
traceback when ``LOG_LEVEL`` is ``DEBUG``), then raises the :class:`~scrapy_fleet.errors.FleetError`
so that Scrapy marks the crawl failed.  Scrapy hands that exception on to asyncio, which would
log it a second time with its traceback ("Task exception was never retrieved"); a logging
filter drops that one record, and only for an exception this module has already reported.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object
from scrapy.utils.reactor import is_asyncio_reactor_installed

from scrapy_fleet import acl, identity, redis_client, redis_url
from scrapy_fleet.catalog import SETTINGS_HELP, unknown_settings
from scrapy_fleet.compat import per_worker
from scrapy_fleet.compat import settings as compat_settings
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import (
    CrawlSpiderError,
    FleetConfigError,
    FleetError,
    RedisPermissionError,
    RedisUnavailableError,
    WorkerIdInUseError,
)
from scrapy_fleet.frontier import layout, partition_count
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ProxyPoolKeys
from scrapy_fleet.recrawl import guard as recrawl_guard
from scrapy_fleet.recrawl.settings import recrawl_config
from scrapy_fleet.redact import redact

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: attribute set on an exception :func:`report` has logged
_REPORTED = "_fleet_startup_reported"
#: loggers that log a failed crawl's exception again (asyncio: AsyncCrawlerProcess, the
#: default; twisted: CrawlerProcess, with FORCE_CRAWLER_PROCESS)
_RELOGGING = ("asyncio", "twisted")


class FleetStartupCheck:
    """Extension listed by :class:`scrapy_fleet.Addon`: runs :func:`check_worker` when Scrapy
    builds its extensions, then disables itself (it has nothing to do during the crawl).

    Raises:
        FleetConfigError: a ``FLEET_*`` setting has a wrong value, or the reactor is not the
            asyncio one.
        RedisUnavailableError: Redis at ``FLEET_REDIS_URL`` does not answer PING, or refuses
            the credentials, or its TLS certificate cannot be verified.
        RedisPermissionError: its ACL user may not run a command a worker needs.
        CrawlSpiderError: the crawl belongs to another spider (identity.py).
        WorkerIdInUseError: a live worker runs with this FLEET_WORKER_ID (identity.py).
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetStartupCheck:
        try:
            check_worker(crawler)
        except FleetError as exc:
            report(crawler, exc)
            raise
        raise NotConfigured  # no message: not listed among the disabled components either


def check_worker(crawler: Crawler) -> FleetConfig:
    """Validate every fleet setting and, when the fleet's scheduler or dupefilter is used,
    the reactor, one PING to Redis (blocking, at most ``FLEET_REDIS_TIMEOUT`` seconds) and
    the permissions of its user (scrapy_fleet/acl.py: one script call that checks every
    command a worker sends, on the crawl's keys, and one on the proxy pool's keys when the
    crawl uses the pool).  A TLS URL with ``ssl_cert_reqs=none`` is logged as a warning.
    A Scrapy setting that would act per worker in silence (compat/per_worker.py: ``CLOSESPIDER_*``,
    AutoThrottle, ``DOWNLOAD_SLOTS``, ``JOBDIR``, feeds...) is logged as one warning each.
    A worker with the fleet's scheduler then records its spider as the crawl's (or checks
    it is the recorded one) and makes sure no live worker runs with its worker id
    (identity.py: this may wait up to FLEET_WORKER_DEAD_AFTER seconds for an earlier
    holder's heartbeat); while Redis is out of memory it waits (:func:`until_room`).
    With FLEET_JSONL_PATH, the file's folder is created and the file opened once.

    Raises:
        FleetConfigError: naming the wrong setting and its value (FLEET_JSONL_PATH: a file
            that cannot be written, and why).
        CrawlSpiderError: naming the crawl and both spiders.
        WorkerIdInUseError: naming the live worker (host, pid, start).
        RedisUnavailableError: naming the URL, password redacted.
        RedisPermissionError: naming the commands the Redis user may not run.
        CrawlLayoutError: the crawl's keys were written by another layout of the package.
    """
    settings = crawler.settings
    config = FleetConfig.from_settings(settings)
    compat_settings.check(settings)  # scrapy-redis settings the fleet cannot honour
    warn_unknown_settings(settings, logger.warning)
    spider = getattr(crawler, "spider", None)
    if spider is not None and getattr(spider, "name", None):
        config.resolve_crawl_id(spider.name)
    try:
        from scrapy_fleet.pipelines.mongo_config import MongoConfig
    except ImportError:  # pymongo missing: the pipeline itself reports it
        pass
    else:
        try:  # every FLEET_MONGO_* value, with or without a URI
            MongoConfig.from_settings(settings)
        except NotConfigured:
            pass
    from scrapy_fleet.frontier.dupefilter import RedisBloomDupeFilter
    from scrapy_fleet.frontier.scheduler import FleetScheduler

    fleet_scheduler = _is_subclass(settings, "SCHEDULER", FleetScheduler)
    if fleet_scheduler and not is_asyncio_reactor_installed():
        raise FleetConfigError(
            "TWISTED_REACTOR must be the asyncio reactor "
            "(twisted.internet.asyncioreactor.AsyncioSelectorReactor) for scrapy_fleet")
    if fleet_scheduler:  # Scrapy settings that would act per worker in silence
        per_worker.warn_per_worker_settings(settings, logger.warning)
        idle = per_worker.idle_warning(crawler.signals, config.idle_timeout)
        if idle:
            logger.warning("%s", idle, extra={"crawler": crawler})
    if fleet_scheduler or _is_subclass(settings, "DUPEFILTER_CLASS", RedisBloomDupeFilter):
        target = redis_url.parse(config.redis_url)
        if target.unverified:
            logger.warning("FLEET_REDIS_URL has ssl_cert_reqs=none: TLS certificate "
                           "verification is off, so any server can pose as %s",
                           redact(config.redis_url), extra={"crawler": crawler})
        client = redis_client.make_client(config.redis_url, config.redis_timeout)
        try:
            redis_client.ping_sync(client, config.redis_url)
            name = getattr(spider, "name", None)
            crawl_id = config.resolve_crawl_id(name) if name else config.crawl_id
            if crawl_id:
                proxy = config.proxy
                pool = (ProxyPoolKeys(config.key_prefix, proxy.pool_name(crawl_id))
                        if proxy is not None and proxy.enabled else None)
                keys = CrawlKeys(config.key_prefix, crawl_id)
                acl.check_sync(client, keys, "worker",
                               cluster=target.kind == "cluster", pool=pool)
                layout.check_sync(client, keys)
                # issue 21: FLEET_PARTITIONS is the crawl's, stored when it is created
                # (a P = 1 worker claims a new crawl first: two first workers with another
                # P each cannot both pass)
                # (both may write: they wait while Redis is out of memory, as _claim does)
                until_room(crawler, config, lambda: partition_count.start_sync(
                    client, keys, config.partitions, fleet_scheduler, layout_checked=True))
                # issue 22: a worker without FLEET_RECRAWL would drop the crawl's schedule
                if fleet_scheduler and not recrawl_config(settings).enabled:
                    recrawl_guard.check_sync(client, keys, config.partitions)
                if fleet_scheduler and name:
                    _claim(crawler, client, keys, config, name)
        finally:
            client.close()
    if config.jsonl.path:
        from scrapy_fleet.pipelines.jsonlines import prepare_path

        prepare_path(config, getattr(spider, "name", None) or "spider")
    return config


def _claim(crawler: Crawler, client: Any, keys: CrawlKeys, config: FleetConfig,
           name: str) -> None:
    """The crawl's spider and the worker id (identity.py), each retried while Redis is out
    of memory (docs/backpressure.md: a worker waits until Redis has room)."""
    spider = crawler.spider
    path = identity.spider_path(type(spider))
    until_room(crawler, config, lambda: identity.claim_crawl(client, keys, name, path))
    me = identity.Holder(socket.gethostname(), os.getpid(), time.time())
    poll = min(1.0, config.monitoring.heartbeat_interval / 2)
    until_room(crawler, config, lambda: identity.claim_worker_id(
        client, keys, config.worker_id, me, config.monitoring.worker_dead_after, poll,
        quiet_for=config.monitoring.heartbeat_interval))


def until_room(crawler: Crawler, config: FleetConfig, call: Callable[[], T]) -> T:
    """Run *call* (blocking Redis writes) again and again while Redis answers OOM (used
    memory above ``maxmemory`` with ``noeviction``): one WARNING, then a retry every
    4 x ``FLEET_POLL_INTERVAL`` seconds until Redis has room, as a running worker waits
    (docs/backpressure.md).  Counts ``fleet/backpressure/oom``.

    Raises:
        FleetError: interrupted (Ctrl-C) while waiting.
        redis.RedisError: any other error of *call*.
    """
    warned = False
    while True:
        try:
            return call()
        except redis.ResponseError as exc:
            if not redis_client.is_oom(exc):
                raise
            if crawler.stats is not None:
                crawler.stats.inc_value("fleet/backpressure/oom")
            if not warned:
                warned = True
                logger.warning("Redis at %s is out of memory (%s): the worker waits and tries "
                               "again every %.1f s until Redis has room (free memory, raise "
                               "maxmemory, or purge old crawls)", redact(config.redis_url),
                               str(exc).rstrip(". "), config.poll_interval * 4,
                               extra={"crawler": crawler})
        try:
            time.sleep(config.poll_interval * 4)
        except KeyboardInterrupt:
            raise FleetError("interrupted while waiting for Redis to have room") from None


def warn_unknown_settings(settings: Any, warn: Callable[..., Any]) -> int:
    """Call *warn* (``logger.warning`` or a printer, %-style) once for each ``FLEET_*``
    setting that scrapy_fleet does not know, naming the closest known one, and for each name
    of the project's settings module that Scrapy ignores because it is not in upper case
    (``FLEET_REDIS_URl``: Scrapy's ``Settings.setmodule`` reads upper-case names only);
    returns how many.  A typo is otherwise ignored without a word."""
    unknown = unknown_settings(settings)
    for name, close in unknown:
        warn("Unknown setting %s ignored%s (%s lists every FLEET_* setting)", name,
             f": did you mean {close}?" if close else "", SETTINGS_HELP)
    module_name = os.environ.get("SCRAPY_SETTINGS_MODULE")
    module = sys.modules.get(module_name) if module_name else None
    ignored = sorted(n for n in vars(module) if n.upper().startswith("FLEET_")
                     and not n.isupper()) if module is not None else []
    for name in ignored:
        guess = unknown_settings([name.upper()])  # empty: the upper-case name is known
        meant = guess[0][1] if guess else name.upper()
        warn("Setting %s in %s is ignored: Scrapy reads only names in upper case%s", name,
             module_name, f" (did you mean {meant}?)" if meant else "")
    return len(unknown) + len(ignored)


def _is_subclass(settings: BaseSettings, name: str, cls: type) -> bool:
    value = settings.get(name)
    try:
        obj = load_object(value) if isinstance(value, str) else value
    except Exception:  # a wrong path: Scrapy reports it when it builds the component
        return False
    return isinstance(obj, type) and issubclass(obj, cls)


def hint(exc: FleetError) -> str:
    """How to fix *exc*, for a user who did not write the code."""
    if isinstance(exc, RedisPermissionError):
        return ("Grant the Redis user those commands on the crawl's keys (ACL SETUSER; "
                "docs/deployment.md gives the rule of a worker)")
    if isinstance(exc, RedisUnavailableError):
        cause = exc.__cause__
        if isinstance(cause, redis.exceptions.InvalidResponse):
            return ("Set FLEET_REDIS_URL to the address of a Redis server (redis://HOST:PORT/DB, "
                    "Redis listens on port 6379 by default)")
        if "certificate" in str(exc):
            return ("Give the CA that signed the server's certificate as ssl_ca_certs=PATH "
                    "in FLEET_REDIS_URL (rediss://HOST:PORT/0?ssl_ca_certs=/path/ca.crt)")
        if isinstance(cause, redis.AuthenticationError):
            return ("Check the user name and password in FLEET_REDIS_URL "
                    "(redis://USER:PASSWORD@HOST:PORT/DB)")
        if isinstance(cause, redis.ResponseError):
            return ("Check FLEET_REDIS_URL (the database number) and the permissions of its "
                    "Redis user")
        return "Start Redis there, or set FLEET_REDIS_URL to the address of a running Redis"
    if isinstance(exc, CrawlSpiderError):
        return identity.spider_fix(exc)
    if isinstance(exc, WorkerIdInUseError):
        return identity.WORKER_ID_FIX
    if isinstance(exc, FleetConfigError):
        return ("Fix it in settings.py, in the spider's custom_settings or on the command line "
                f"(-s NAME=VALUE); {SETTINGS_HELP} lists the valid values")
    return ""


def report(crawler: Crawler, exc: FleetError) -> None:
    """Log *exc* as one ERROR line with its fix (its traceback too at ``LOG_LEVEL=DEBUG``,
    Scrapy's default, unless it is a wrong setting: its line says all there is), and keep
    asyncio and Twisted from logging it again when Scrapy re-raises it."""
    debug = _log_level(crawler.settings) <= logging.DEBUG \
        and not isinstance(exc, (FleetConfigError, CrawlSpiderError, WorkerIdInUseError))
    fix = hint(exc)
    logger.error("Fleet worker cannot start: %s%s", str(exc).rstrip(". "),
                 f". {fix}." if fix else "", exc_info=exc if debug else None,
                 extra={"crawler": crawler})
    setattr(exc, _REPORTED, True)
    for name in _RELOGGING:
        target = logging.getLogger(name)
        if _DROP_REPORTED not in target.filters:
            target.addFilter(_DROP_REPORTED)


def _log_level(settings: BaseSettings) -> int:
    level: Any = settings.get("LOG_LEVEL", "DEBUG")
    if isinstance(level, int):
        return level
    number = logging.getLevelName(str(level).strip().upper())
    return number if isinstance(number, int) else logging.INFO


class _DropReported(logging.Filter):
    """Drops records about an exception :func:`report` has already logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, _REPORTED, False)


_DROP_REPORTED = _DropReported()
