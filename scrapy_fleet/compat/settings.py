"""scrapy-redis's settings, read by the add-on: each means in the fleet what it meant there,
or the worker refuses it with one line naming the fleet's way (docs/from-scrapy-redis.md).

:func:`translate` runs in ``Addon.update_settings`` (before any component is built):

* ``REDIS_URL``, else ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB`` with ``REDIS_PARAMS``'s
  ``username``/``password``/``db`` (scrapy_redis/connection.py reads them so), becomes
  ``FLEET_REDIS_URL`` when that is not set;
* ``MAX_IDLE_TIME_BEFORE_CLOSE = N`` (N > 0: a spider idle N seconds closes) becomes
  ``FLEET_IDLE_TIMEOUT = N`` when that is not set (0, scrapy-redis's default: never close, is
  the fleet's default too);
* a ``SCHEDULER`` or ``DUPEFILTER_CLASS`` of scrapy-redis left beside the add-on is replaced
  by the fleet's, with one INFO line.

:func:`check` runs in the worker's start-up check and refuses, with one line each,
``SCHEDULER_PERSIST = False`` (scrapy-redis then wipes the queue and dupefilter when a spider
closes; the fleet keeps its state until ``scrapy fleet purge``), ``SCHEDULER_FLUSH_ON_START =
True`` (``scrapy fleet purge SPIDER --yes`` before the crawl) and both
``REDIS_START_URLS_AS_SET`` and ``_AS_ZSET``.  The other start-URL settings
(``REDIS_START_URLS_KEY``, ``_BATCH_SIZE``, ``REDIS_ENCODING``) are read by the spiders
themselves, as in scrapy-redis; ``SCHEDULER_IDLE_BEFORE_CLOSE`` (a blocking pop's timeout) and
``SCHEDULER_QUEUE_CLASS``/``SCHEDULER_QUEUE_KEY``/``SCHEDULER_DUPEFILTER_KEY``/
``SCHEDULER_SERIALIZER`` have no effect (named in the INFO line when set).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from scrapy.settings import BaseSettings

from scrapy_fleet.errors import FleetConfigError

logger = logging.getLogger(__name__)

#: the components a scrapy-redis project names, replaced by the add-on's
REPLACED = {"SCHEDULER": "scrapy_fleet.frontier.scheduler.FleetScheduler",
            "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"}
#: scrapy-redis settings without effect in the fleet (the frontier is the fleet's)
UNUSED = ("SCHEDULER_IDLE_BEFORE_CLOSE", "SCHEDULER_QUEUE_CLASS", "SCHEDULER_QUEUE_KEY",
          "SCHEDULER_DUPEFILTER_KEY", "SCHEDULER_DUPEFILTER_CLASS", "SCHEDULER_SERIALIZER")


def _is_scrapy_redis(value: Any) -> bool:
    path = value if isinstance(value, str) else (
        f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}")
    return path.startswith("scrapy_redis.")


def redis_url_of(settings: BaseSettings) -> str | None:
    """The URL of scrapy-redis's Redis in *settings* (``REDIS_URL``, else
    ``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB`` and ``REDIS_PARAMS``' credentials), None when
    none of them is set."""
    if settings.get("REDIS_URL"):
        return str(settings.get("REDIS_URL"))
    params = settings.getdict("REDIS_PARAMS")
    if not (settings.get("REDIS_HOST") or settings.get("REDIS_PORT") or params.get("host")):
        return None
    host = settings.get("REDIS_HOST") or params.get("host") or "localhost"
    port = settings.get("REDIS_PORT") or params.get("port") or 6379
    db = settings.get("REDIS_DB") or params.get("db") or 0
    user, password = params.get("username"), params.get("password")
    auth = ""
    if password:
        auth = f"{quote(str(user or ''), safe='')}:{quote(str(password), safe='')}@"
    return f"redis://{auth}{host}:{int(port)}/{int(db)}"


def translate(settings: BaseSettings) -> None:
    """Translate scrapy-redis's settings in place (module docstring); logs one INFO line
    naming what it did, when it did anything."""
    done: list[str] = []
    if settings.get("FLEET_REDIS_URL") is None:
        url = redis_url_of(settings)
        if url is not None:
            source = "REDIS_URL" if settings.get("REDIS_URL") else "REDIS_HOST"
            settings.set("FLEET_REDIS_URL", url, settings.getpriority(source) or 0)
            done.append(f"{source} -> FLEET_REDIS_URL")
    idle = settings.get("MAX_IDLE_TIME_BEFORE_CLOSE")
    if idle is not None and settings.get("FLEET_IDLE_TIMEOUT") is None:
        try:
            seconds = float(idle)
        except (TypeError, ValueError):
            seconds = -1.0  # the start-up check names it
        if seconds > 0:
            settings.set("FLEET_IDLE_TIMEOUT", seconds,
                         settings.getpriority("MAX_IDLE_TIME_BEFORE_CLOSE") or 0)
            done.append(f"MAX_IDLE_TIME_BEFORE_CLOSE={idle:g} -> FLEET_IDLE_TIMEOUT"
                        if isinstance(idle, float | int) else
                        f"MAX_IDLE_TIME_BEFORE_CLOSE={idle} -> FLEET_IDLE_TIMEOUT")
    for name, ours in REPLACED.items():
        if _is_scrapy_redis(settings.get(name)):
            priority = max(settings.getpriority(name) or 0, 0)
            settings.set(name, ours, priority)
            done.append(f"{name} -> {ours.rsplit('.', 1)[1]}")
    unused = [name for name in UNUSED if settings.get(name) is not None]
    if unused:
        done.append(", ".join(unused) + ": no effect (the frontier is the fleet's)")
    if done:
        logger.info("scrapy-redis settings: %s (docs/from-scrapy-redis.md)", "; ".join(done))


def check(settings: BaseSettings) -> None:
    """Refuse the scrapy-redis settings the fleet cannot honour (module docstring).

    Raises:
        FleetConfigError: naming the setting and the fleet's way.
    """
    from scrapy_fleet.compat.feeder import start_key_kind

    if settings.get("SCHEDULER_PERSIST") is not None and not settings.getbool(
            "SCHEDULER_PERSIST"):
        raise FleetConfigError(
            "SCHEDULER_PERSIST=False (scrapy-redis: wipe the queue and dupefilter when a spider "
            "closes) cannot hold in a fleet, whose state outlives its workers: remove it, and "
            "run `scrapy fleet purge SPIDER --yes` once the crawl is over")
    if settings.getbool("SCHEDULER_FLUSH_ON_START"):
        raise FleetConfigError(
            "SCHEDULER_FLUSH_ON_START=True would let every starting worker wipe the fleet's "
            "crawl: remove it, and run `scrapy fleet purge SPIDER --yes` before starting")
    idle = settings.get("MAX_IDLE_TIME_BEFORE_CLOSE")
    if idle is not None:
        try:
            float(idle)
        except (TypeError, ValueError):
            raise FleetConfigError(f"MAX_IDLE_TIME_BEFORE_CLOSE={idle!r} is not a number of "
                                   "seconds (the fleet's FLEET_IDLE_TIMEOUT)") from None
    start_key_kind(settings)
