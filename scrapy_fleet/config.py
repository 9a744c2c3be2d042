"""All ``FLEET_*`` settings, read once into one validated :class:`FleetConfig`.

Every component of the fleet gets its configuration from :func:`FleetConfig.from_settings`
(cached per settings object), never by reading ``settings`` itself, so that a wrong value
fails at start with an error naming the setting and the value.  docs/settings.md lists each
setting with its type, default and meaning.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.browser.settings import BrowserConfig, browser_config
from scrapy_fleet.budget_settings import BudgetConfig, budget_config, check_partitions
from scrapy_fleet.checks import (
    check,
    number,
    setting_value,
    status_codes,
    validate_crawl_id,
    validate_key_prefix,
)
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.failures.settings import FailuresConfig, failures_config
from scrapy_fleet.frontier.backpressure_settings import BackpressureConfig, backpressure_config
from scrapy_fleet.frontier.dupefilter_settings import DupefilterConfig, dupefilter_config
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.group_settings import GroupConfig, group_config
from scrapy_fleet.jsonl_settings import JsonlConfig, jsonl_config
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.monitoring.settings import MonitoringConfig, monitoring_config
from scrapy_fleet.politeness.settings import PolitenessConfig, politeness_config
from scrapy_fleet.proxies.settings import ProxyConfig, proxy_config
from scrapy_fleet.recrawl.settings import RecrawlConfig, recrawl_config
from scrapy_fleet.redis_url import validate_redis_url
from scrapy_fleet.sessions.settings import (
    CookieConfig,
    SessionConfig,
    cookie_config,
    session_config,
)
from scrapy_fleet.stages.settings import StageConfig, stage_config

_START_MODES = ("once", "always", "never")


def default_worker_id() -> str:
    """``host:pid:start``: unique per process (a recycled pid has another start time, unix
    seconds), readable in ``scrapy fleet status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{int(_PROCESS_START)}"


_PROCESS_START = time.time()


#: largest FLEET_PARTITIONS (each partition's hash tag is searched for in keys/crawl.py)
MAX_PARTITIONS = 1024


def validate_partitions(value: Any, name: str = "FLEET_PARTITIONS") -> int:
    """*value* as a FLEET_PARTITIONS (an int from 1 to :data:`MAX_PARTITIONS`); *name*: what
    the error calls it (``--partitions`` of ``scrapy-fleet``).

    Raises:
        FleetConfigError: naming *name* and the value.
    """
    parts = number(name, value, int, 1, f"an integer from 1 to {MAX_PARTITIONS}")
    check(name, value, parts <= MAX_PARTITIONS, f"an integer from 1 to {MAX_PARTITIONS}")
    return parts


def _partitions(settings: BaseSettings | Mapping[str, Any], value: Any, host_key: str) -> int:
    """FLEET_PARTITIONS, checked against what a partitioned crawl needs (docs/partitions.md):
    a host key that names the same partition on every worker, and a fingerprinter that keeps
    equal fingerprints on one host (one Bloom filter per partition)."""
    parts = validate_partitions(value)
    if parts == 1:
        return parts
    if host_key == "ip":
        raise FleetConfigError(
            f"FLEET_PARTITIONS={parts} cannot be used with FLEET_HOST_KEY='ip': workers that "
            "resolve a name differently would put one URL in two partitions; use "
            "FLEET_HOST_KEY='host' or 'domain', or FLEET_PARTITIONS=1")
    fp_class = settings.get("REQUEST_FINGERPRINTER_CLASS") if hasattr(settings, "get") else None
    if fp_class is not None:
        from scrapy.utils.misc import load_object
        from scrapy.utils.request import RequestFingerprinter

        try:
            loaded = load_object(fp_class) if isinstance(fp_class, str) else fp_class
        except (ImportError, NameError, ValueError, AttributeError):
            loaded = None
        if loaded is not RequestFingerprinter:
            raise FleetConfigError(
                f"FLEET_PARTITIONS={parts} cannot be used with REQUEST_FINGERPRINTER_CLASS="
                f"{fp_class!r}: a partitioned crawl keeps one Bloom filter per partition of "
                "hosts, so only Scrapy's own fingerprinter (equal fingerprints only for equal "
                "URLs, hence one host) is accepted; use FLEET_PARTITIONS=1")
    return parts


@dataclass(frozen=True)
class FleetConfig:
    """Validated fleet settings.  Times are seconds; see docs/settings.md.  Made by
    :meth:`from_settings` only: the fields have no defaults of their own, the catalog's
    (catalog.py) are the one source.

    Raises:
        FleetConfigError: from :meth:`from_settings` when a value is wrong; the message names
            the setting and the value.
    """

    redis_url: str
    redis_timeout: float
    redis_retries: int
    redis_wait_replicas: int
    crawl_id: str | None
    key_prefix: str
    worker_id: str
    lease_timeout: float
    max_leases: int
    prefetch: int
    poll_interval: float
    flush_interval: float
    idle_timeout: float | None
    start_requests: str
    request_classes: tuple[str, ...]
    #: FLEET_DUPEFILTER_* (frontier/dupefilter_settings.py)
    dupefilter: DupefilterConfig
    #: FLEET_QUEUE_MAX, FLEET_QUEUE_LOW_WATERMARK, FLEET_HOST_QUEUE_MAX, FLEET_BACKPRESSURE_DELAY
    #: (frontier/backpressure_settings.py)
    backpressure: BackpressureConfig
    #: FLEET_HOST_*, FLEET_ROBOTSTXT_*, FLEET_MAX_CRAWL_DELAY, FLEET_BACKOFF_* and
    #: ROBOTSTXT_OBEY (politeness/settings.py)
    politeness: PolitenessConfig
    #: FLEET_JSONL_PATH and FLEET_JSONL_FSYNC (jsonl_settings.py)
    jsonl: JsonlConfig
    #: FLEET_ROLE and the response queue's bounds (stages/settings.py)
    stages: StageConfig
    #: FLEET_PLAYWRIGHT and FLEET_PLAYWRIGHT_ABORT (browser/settings.py)
    browser: BrowserConfig
    #: FLEET_HEARTBEAT_INTERVAL, FLEET_WORKER_*_AFTER, FLEET_STALL_AFTER, FLEET_ALERT_*
    #: (monitoring/settings.py)
    monitoring: MonitoringConfig
    ban_statuses: tuple[int, ...]  #: FLEET_BAN_STATUSES
    drain_timeout: float  #: FLEET_DRAIN_TIMEOUT
    #: FLEET_PROXIES and FLEET_PROXY_* (proxies/settings.py)
    proxy: ProxyConfig | None
    #: FLEET_FAILED_MAX (failures/settings.py, docs/failures.md)
    failures: FailuresConfig
    partitions: int  #: FLEET_PARTITIONS (docs/partitions.md)
    #: FLEET_RECRAWL* (docs/recrawl.md)
    recrawl: RecrawlConfig
    partition_flush: float  #: FLEET_PARTITION_FLUSH, seconds (docs/partitions.md)
    #: FLEET_COOKIES and FLEET_COOKIE_MAX_BYTES (sessions/settings.py, docs/sessions.md)
    cookies: CookieConfig
    #: FLEET_SESSION_* (sessions/settings.py, docs/sessions.md)
    sessions: SessionConfig
    #: FLEET_BUDGET_*, FLEET_HOST_BUDGET_PAGES (budget_settings.py, docs/control.md)
    budget: BudgetConfig
    #: FLEET_CRAWL_GROUP, FLEET_CRAWL_WEIGHT (group_settings.py, docs/control.md)
    group: GroupConfig

    @classmethod
    def from_settings(cls, settings: BaseSettings | Mapping[str, Any]) -> FleetConfig:
        """Read and validate every ``FLEET_*`` setting of the fleet core.

        Raises:
            FleetConfigError: naming the first wrong setting and its value.
        """
        if isinstance(settings, BaseSettings):
            cached = getattr(settings, "_fleet_config", None)
            frozen = getattr(settings, "frozen", False)
            if cached is not None and frozen:
                return cached  # type: ignore[no-any-return]
        g = lambda name: setting_value(settings, name)  # noqa: E731
        crawl_id = g("FLEET_CRAWL_ID")
        if crawl_id is not None:
            validate_crawl_id(crawl_id)
        prefix = validate_key_prefix(g("FLEET_KEY_PREFIX"))
        worker_id = g("FLEET_WORKER_ID") or default_worker_id()
        check("FLEET_WORKER_ID", worker_id, isinstance(worker_id, str) and len(worker_id) <= 200,
               "a string of at most 200 characters")
        idle = g("FLEET_IDLE_TIMEOUT")
        if isinstance(idle, str) and idle.strip().lower() in ("", "none", "null"):
            idle = None
        start_mode = g("FLEET_START_REQUESTS")
        check("FLEET_START_REQUESTS", start_mode, start_mode in _START_MODES,
               f"one of {', '.join(_START_MODES)}")
        classes = g("FLEET_REQUEST_CLASSES")
        if isinstance(classes, str):
            classes = [c.strip() for c in classes.split(",") if c.strip()]
        check("FLEET_REQUEST_CLASSES", classes,
               isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes),
               "a list of import paths")
        dupefilter = dupefilter_config(settings)
        backpressure = backpressure_config(settings)
        politeness = politeness_config(settings)
        partitions = _partitions(settings, g("FLEET_PARTITIONS"),  # issue 21
                                 politeness.host_key)
        jsonl = jsonl_config(settings)
        classes_ok = True
        for path in classes:
            try:
                from scrapy import Request
                from scrapy.utils.misc import load_object

                loaded = load_object(path)
                classes_ok = classes_ok and isinstance(loaded, type) and issubclass(loaded,
                                                                                   Request)
            except (ImportError, NameError, ValueError, AttributeError):
                classes_ok = False
        check("FLEET_REQUEST_CLASSES", classes, classes_ok,
               "import paths of scrapy.Request subclasses")
        monitoring = monitoring_config(settings)
        budget = budget_config(settings)  # issue 34
        check_partitions(budget, partitions)
        redis_url = validate_redis_url(g("FLEET_REDIS_URL"))
        group = group_config(settings, partitions, redis_url)  # issue 34: crawl groups
        config = cls(
            redis_url=redis_url,
            redis_timeout=number("FLEET_REDIS_TIMEOUT", g("FLEET_REDIS_TIMEOUT"), float, 0.0,
                                  "seconds > 0", exclusive=True),
            redis_retries=number("FLEET_REDIS_RETRIES", g("FLEET_REDIS_RETRIES"), int, 0,
                                  "an integer >= 0"),
            redis_wait_replicas=number("FLEET_REDIS_WAIT_REPLICAS",
                                        g("FLEET_REDIS_WAIT_REPLICAS"), int, 0,
                                        "an integer >= 0"),
            crawl_id=crawl_id,
            key_prefix=prefix,
            worker_id=worker_id,
            lease_timeout=number("FLEET_LEASE_TIMEOUT", g("FLEET_LEASE_TIMEOUT"), float, 1.0,
                                  "seconds >= 1"),
            max_leases=number("FLEET_MAX_LEASES", g("FLEET_MAX_LEASES"), int, 1,
                               "an integer >= 1"),
            prefetch=number("FLEET_PREFETCH", g("FLEET_PREFETCH"), int, 1, "an integer >= 1"),
            poll_interval=number("FLEET_POLL_INTERVAL", g("FLEET_POLL_INTERVAL"), float, 0.0,
                                  "seconds > 0", exclusive=True),
            flush_interval=number("FLEET_FLUSH_INTERVAL", g("FLEET_FLUSH_INTERVAL"), float, 0.0,
                                   "seconds >= 0"),
            idle_timeout=None if idle is None else number(
                "FLEET_IDLE_TIMEOUT", idle, float, 0.0, "seconds >= 0 or None"),
            start_requests=start_mode,
            request_classes=tuple(classes),
            dupefilter=dupefilter,
            backpressure=backpressure,
            politeness=politeness,
            jsonl=jsonl,
            monitoring=monitoring,
            ban_statuses=status_codes("FLEET_BAN_STATUSES", g("FLEET_BAN_STATUSES")),
            drain_timeout=number("FLEET_DRAIN_TIMEOUT", g("FLEET_DRAIN_TIMEOUT"), float, 0.0,
                                  "seconds >= 0"),
            proxy=proxy_config(settings),
            partitions=partitions,
            recrawl=recrawl_config(settings),
            partition_flush=number("FLEET_PARTITION_FLUSH", g("FLEET_PARTITION_FLUSH"), float,
                                   0.0, "seconds >= 0"),
            browser=browser_config(settings),
            stages=stage_config(settings),
            failures=failures_config(settings),
            cookies=cookie_config(settings),
            sessions=session_config(settings),
            budget=budget,
            group=group,
        )
        if isinstance(settings, BaseSettings) and getattr(settings, "frozen", False):
            try:
                settings._fleet_config = config  # type: ignore[attr-defined]
            except AttributeError:
                pass
        return config

    def frontier_params(self) -> FrontierParams:
        """The per-call constants of lua/frontier.lua."""
        return FrontierParams(self.lease_timeout, self.max_leases, self.dupefilter.capacity,
                              self.dupefilter.error_rate, self.backpressure.queue_max,
                              self.backpressure.host_queue_max, self.backpressure.delay,
                              self.politeness.host_interval,
                              self.politeness.host_burst if self.politeness.host_rate else 1,
                              self.politeness.host_concurrency, self.politeness.robots_obey,
                              self.politeness.rate_sets_interval,
                              lease_only_host=STAGE_HOST if self.stages.role == "parse" else "",
                              lease_except_host=STAGE_HOST if self.stages.role == "fetch"
                              else "",
                              failed_max=self.failures.max_kept,
                              recrawl_max=(self.recrawl.max_tracked or 0)
                              if self.recrawl.enabled else 0,
                              dead_after=self.monitoring.worker_dead_after,
                              adaptive=self._adaptive_params(),
                              budget_pages=self.budget.pages,
                              budget_seconds=self.budget.seconds,
                              host_budget_pages=self.budget.host_pages,
                              budget_items=self.budget.items,
                              budget_bytes=self.budget.bytes,
                              group_weight=self.group.weight)

    def _adaptive_params(self) -> tuple[float, float, float, float, float] | None:
        a = self.politeness.adaptive
        return (a.beta, a.step, a.window, a.latency_factor, a.min_rate) if a.enabled else None

    def crawl_keys(self, spider_name: str) -> CrawlKeys:
        """The key names of the crawl of *spider_name* (:meth:`resolve_crawl_id`), in its
        crawl group (FLEET_CRAWL_GROUP) when it has one."""
        return CrawlKeys(self.key_prefix, self.resolve_crawl_id(spider_name),
                         group=self.group.name)

    def resolve_crawl_id(self, spider_name: str) -> str:
        """The crawl's namespace: ``FLEET_CRAWL_ID`` or else the spider's name."""
        return validate_crawl_id(self.crawl_id or spider_name,
                                 "FLEET_CRAWL_ID" if self.crawl_id else "spider name")
