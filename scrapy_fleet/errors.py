"""Exceptions raised by scrapy_fleet.  All derive from :class:`FleetError`."""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest


class FleetError(Exception):
    """Base class of every error this package raises on purpose."""


class FleetConfigError(FleetError, ValueError):
    """A ``FLEET_*`` setting has a wrong value; the message names the setting and the value."""


class RedisUnavailableError(FleetError, ConnectionError):
    """Redis cannot be reached at ``FLEET_REDIS_URL``; the message gives the URL (no password)."""


class RedisPermissionError(FleetError, PermissionError):
    """The Redis (ACL) user of ``FLEET_REDIS_URL`` may not run a command the fleet needs; the
    message names the commands."""


class RequestEncodeError(FleetError, ValueError):
    """A request cannot be stored in the frontier (a lambda callback, a Selector in meta...)."""


class RequestDecodeError(FleetError, ValueError):
    """A frontier entry is corrupt, of an unknown format version, or names a forbidden class."""


class CallbackError(RequestDecodeError):
    """An entry names a callback or errback that is no request callback of the spider
    (``codec.callback_problem``): the worker files it as failed (``spider/CallbackError``)."""


class PushLineError(FleetError, ValueError):
    """A line given to the push helper is not a valid URL or request spec."""


class CrawlStateLostError(FleetError, RuntimeError):
    """Redis no longer holds the crawl's state (its crawl marker is gone): it restarted without
    its data, or the crawl was purged under the worker.  Going on would finish early as if the
    crawl were done, so the worker stops with this error."""


class RobotsTxtUnavailable(FleetError, IgnoreRequest):
    """A request's origin gave no usable robots.txt in ``FLEET_ROBOTSTXT_MAX_ATTEMPTS``
    attempts (no answer, 5xx or 429 each time): the request is not sent.  It reaches the
    request's errback as this failure, and its frontier entry goes to the dead letters with
    the same message (docs/politeness.md).  ``origin`` is ``scheme://host:port``."""

    def __init__(self, message: str, origin: str = "") -> None:
        super().__init__(message)
        self.origin = origin


class CrawlDelayTooLong(FleetError, IgnoreRequest):
    """A request's host asks (robots.txt ``Crawl-delay``) more than
    ``FLEET_SKIP_CRAWL_DELAY_OVER`` seconds between two requests: the request is not sent.
    It reaches the request's errback as this failure, and its frontier entry goes to the dead
    letters with the reason ``crawl_delay`` (docs/politeness.md).  ``origin`` is
    ``scheme://host:port``, ``delay`` the Crawl-delay (s)."""

    def __init__(self, message: str, origin: str = "", delay: float = 0.0) -> None:
        super().__init__(message)
        self.origin = origin
        self.delay = delay


class CrawlSpiderError(FleetError):
    """The crawl (its ``FLEET_CRAWL_ID``) belongs to another spider: a worker or a push of a
    second spider would lease the first one's requests and run its own callbacks on them.
    ``owner`` and ``spider`` are ``(name, class path)`` pairs, ``crawl_id`` the crawl's id."""

    def __init__(self, message: str, owner: tuple[str, str] = ("", ""),
                 spider: tuple[str, str] = ("", ""), crawl_id: str = "") -> None:
        super().__init__(message)
        self.owner = owner
        self.spider = spider
        self.crawl_id = crawl_id


class WorkerIdInUseError(FleetError):
    """Another live process runs with this ``FLEET_WORKER_ID``: two workers with one id would
    take each other's leases (identity.py)."""
