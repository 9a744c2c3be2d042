"""Exceptions raised by scrapy_fleet.  All derive from :class:`FleetError`."""

from __future__ import annotations


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


class PushLineError(FleetError, ValueError):
    """A line given to the push helper is not a valid URL or request spec."""
