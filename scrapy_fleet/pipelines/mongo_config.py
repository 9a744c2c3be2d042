"""Validated ``FLEET_MONGO_*`` settings of the MongoDB pipeline (docs/mongo.md), and the stable
document id of an item."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pymongo import MongoClient
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object

from scrapy_fleet.catalog import SETTINGS
from scrapy_fleet.checks import check, number
from scrapy_fleet.errors import FleetConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


#: Every setting this pipeline reads, with its default: the ``mongo`` rows of
#: :data:`scrapy_fleet.catalog.SETTINGS` (docs/mongo.md describes each one).
MONGO_DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS if s.section == "mongo"}


def _default_client_factory(uri: str) -> Any:
    return MongoClient(uri, appname="scrapy-fleet")


def _callable_setting(name: str, value: Any) -> Callable[..., Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = load_object(value)
        except (ImportError, AttributeError, ValueError, NameError) as exc:
            raise FleetConfigError(
                f"{name}={value!r} is invalid: cannot import it ({exc})") from None
    check(name, value, callable(value), "a callable or the import path of one")
    return value  # type: ignore[no-any-return]


def _field_list(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    check(name, value, isinstance(value, (list, tuple))
           and all(isinstance(v, str) and v and not v.startswith("$") for v in value),
           "a list of field names")
    return tuple(value)


def _field_name(name: str, value: Any) -> str:
    check(name, value, isinstance(value, str) and bool(value) and not value.startswith("$")
           and "." not in value and value != "_id", "a field name (no '$', no '.', not _id)")
    return str(value)


@dataclass(frozen=True)
class MongoConfig:
    """Validated ``FLEET_MONGO_*`` settings.  Times are seconds; see docs/mongo.md.

    Raises:
        FleetConfigError: from :meth:`from_settings` when a value is wrong; the message names
            the setting and the value.
    """

    uri: str
    database: str = "scrapy"
    #: ``None``: the spider's name.  Otherwise a ``%``-template with the keys ``spider`` and
    #: ``item_class`` (class name of the item, ``dict`` for dicts).
    collection: str | None = None
    id_fields: tuple[str, ...] = ("url",)
    id_function: Callable[[ItemAdapter], Any] | None = None
    batch_size: int = 100
    flush_interval: float = 1.0
    max_pending: int = 10_000
    concurrency: int = 2
    retry_backoff: float = 0.5
    retry_max_backoff: float = 30.0
    updated_field: str = "updated_at"
    first_seen_field: str = "first_seen_at"
    ttl: int | None = None
    unique_fields: tuple[str, ...] = ()
    client_factory: Callable[[str], Any] = field(default=_default_client_factory)

    @classmethod
    def from_settings(cls, settings: BaseSettings | Mapping[str, Any]) -> MongoConfig:
        """Read and validate every ``FLEET_MONGO_*`` setting, whether the pipeline is on
        or not (a wrong value is one clear line at start, not a surprise the day a URI is
        set).

        Raises:
            FleetConfigError: naming the first wrong setting and its value.
            NotConfigured: every value is right, but ``FLEET_MONGO_URI`` is unset or empty.
        """

        def g(name: str) -> Any:
            value = settings.get(name)
            return MONGO_DEFAULTS[name] if value is None else value

        uri = g("FLEET_MONGO_URI")
        if uri:
            check("FLEET_MONGO_URI", uri, isinstance(uri, str)
                   and uri.startswith(("mongodb://", "mongodb+srv://")),
                   "a mongodb:// or mongodb+srv:// URI")
        database = g("FLEET_MONGO_DATABASE")
        check("FLEET_MONGO_DATABASE", database, isinstance(database, str) and 0 < len(database)
               < 64 and not any(c in database for c in '/\\. "$\x00'),
               "a database name (1-63 characters, none of / \\ . \" $ or space)")
        collection = g("FLEET_MONGO_COLLECTION") or None
        if collection is not None:
            try:
                sample = collection % {"spider": "spider", "item_class": "Item"}
            except (TypeError, KeyError, ValueError):
                sample = None
            check("FLEET_MONGO_COLLECTION", collection, isinstance(sample, str)
                   and bool(sample) and "$" not in sample and "\x00" not in sample
                   and not sample.startswith("system."),
                   "a collection name, optionally with %(spider)s and %(item_class)s")
        id_function = _callable_setting("FLEET_MONGO_ID_FUNCTION", g("FLEET_MONGO_ID_FUNCTION"))
        id_fields = _field_list("FLEET_MONGO_ID_FIELDS", g("FLEET_MONGO_ID_FIELDS"))
        check("FLEET_MONGO_ID_FIELDS", g("FLEET_MONGO_ID_FIELDS"),
               bool(id_fields) or id_function is not None,
               "at least one field name (or set FLEET_MONGO_ID_FUNCTION)")
        batch_size = number("FLEET_MONGO_BATCH_SIZE", g("FLEET_MONGO_BATCH_SIZE"), int, 1,
                             "an integer between 1 and 100000")
        check("FLEET_MONGO_BATCH_SIZE", batch_size, batch_size <= 100_000,
               "an integer between 1 and 100000")
        backoff = number("FLEET_MONGO_RETRY_BACKOFF", g("FLEET_MONGO_RETRY_BACKOFF"), float,
                          0.0, "seconds > 0", exclusive=True)
        max_backoff = number("FLEET_MONGO_RETRY_MAX_BACKOFF", g("FLEET_MONGO_RETRY_MAX_BACKOFF"),
                              float, backoff, "seconds >= FLEET_MONGO_RETRY_BACKOFF")
        ttl = g("FLEET_MONGO_TTL")
        if isinstance(ttl, str) and ttl.strip().lower() in ("", "none", "null"):
            ttl = None
        updated_field = _field_name("FLEET_MONGO_UPDATED_FIELD", g("FLEET_MONGO_UPDATED_FIELD"))
        first_seen = _field_name("FLEET_MONGO_FIRST_SEEN_FIELD", g("FLEET_MONGO_FIRST_SEEN_FIELD"))
        check("FLEET_MONGO_FIRST_SEEN_FIELD", first_seen, first_seen != updated_field,
               "a field name other than FLEET_MONGO_UPDATED_FIELD")
        factory = _callable_setting("FLEET_MONGO_CLIENT_FACTORY", g("FLEET_MONGO_CLIENT_FACTORY"))
        config = cls(
            uri=uri,
            database=database,
            collection=collection,
            id_fields=id_fields,
            id_function=id_function,
            batch_size=batch_size,
            flush_interval=number("FLEET_MONGO_FLUSH_INTERVAL", g("FLEET_MONGO_FLUSH_INTERVAL"),
                                   float, 0.0, "seconds >= 0"),
            max_pending=number("FLEET_MONGO_MAX_PENDING", g("FLEET_MONGO_MAX_PENDING"), int, 1,
                                "an integer >= 1"),
            concurrency=number("FLEET_MONGO_CONCURRENCY", g("FLEET_MONGO_CONCURRENCY"), int, 1,
                                "an integer >= 1"),
            retry_backoff=backoff,
            retry_max_backoff=max_backoff,
            updated_field=updated_field,
            first_seen_field=first_seen,
            ttl=None if ttl is None else number("FLEET_MONGO_TTL", ttl, int, 1,
                                                  "whole seconds >= 1 or None"),
            unique_fields=_field_list("FLEET_MONGO_UNIQUE_FIELDS", g("FLEET_MONGO_UNIQUE_FIELDS")),
            client_factory=factory or _default_client_factory,
        )
        if not uri:
            raise NotConfigured("FLEET_MONGO_URI is not set")
        return config


def default_document_id(values: Sequence[Any]) -> str:
    """Stable ``_id`` of an item from the values of its id fields.

    Returns:
        the 40-character hex SHA-1 of the compact JSON array of *values* (keys sorted,
        non-JSON values such as datetimes by their ``str()``): the same values always give the
        same id, on any worker.
    """
    payload = json.dumps(list(values), sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False, default=str)
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()

