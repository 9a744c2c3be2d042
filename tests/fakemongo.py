"""A small in-process stand-in for pymongo's client, with the semantics the Mongo pipeline uses.

Chosen over mongomock: mongomock 4.3's ``bulk_write([UpdateOne(...)])`` breaks with
pymongo >= 4.10 (it calls pymongo internals that changed), and the pipeline needs only a few
operations.  What this fake does the way a server + pymongo would:

* ``bulk_write(requests, ordered=...)`` takes real ``pymongo.UpdateOne`` objects (``_id``
  equality filters, ``$set`` / ``$setOnInsert`` / ``$min`` / ``$max``, ``upsert``), returns a real
  ``pymongo.results.BulkWriteResult`` and raises a real ``pymongo.errors.BulkWriteError`` with
  the server's ``details`` shape (``writeErrors`` with ``index``/``code``/``errmsg``,
  ``nUpserted``, ``nModified``...).  Unordered batches go on after a failed document.
* A document is encoded with BSON before anything is applied: an unencodable value raises
  ``bson.errors.InvalidDocument`` for the whole call, as pymongo does client-side.
* Stored documents go through a BSON round trip (datetimes come back naive UTC, millisecond
  precision).
* ``validator(doc) -> bool`` rejects a document with code 121; unique indexes reject a
  duplicate with code 11000; ``$set`` and ``$setOnInsert`` of one path give code 40.
* Fault injection: ``fail_next`` (exceptions raised by the next calls, in order), ``down``
  (every call raises ``AutoReconnect``), ``write_concern_errors`` (next calls apply the writes
  but report a write concern error), ``index_fail_next`` (raised by the next ``create_index``
  calls), and ``client.admin.fail_next`` (raised by the next ``client.admin.command`` calls,
  e.g. the pipeline's ``ping`` at open).

Every ``bulk_write`` call is recorded in ``calls`` as ``(ordered, [(filter, update, upsert)])``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import bson
from pymongo import UpdateOne
from pymongo.errors import AutoReconnect, BulkWriteError, OperationFailure
from pymongo.results import BulkWriteResult, UpdateResult


def page_id(item: Any) -> str:
    """An ``FLEET_MONGO_ID_FUNCTION`` for tests (import path ``fakemongo.page_id``)."""
    return f"page:{item['url']}"


class FakeMongoClient:
    """``client[db][collection]`` gives a :class:`FakeCollection` (one per name)."""

    def __init__(self, uri: str | None = None, **_: Any) -> None:
        self.uri = uri
        self.databases: dict[str, FakeDatabase] = {}
        self.admin = FakeAdmin()
        self.closed = False
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> FakeDatabase:
        with self._lock:
            return self.databases.setdefault(name, FakeDatabase(self, name))

    def close(self) -> None:
        self.closed = True


class FakeAdmin:
    """``client.admin``: ``command("ping")`` only; records the commands in ``commands``."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.fail_next: list[BaseException] = []

    def command(self, name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.commands.append(name)
        if self.fail_next:
            raise self.fail_next.pop(0)
        if name != "ping":
            raise NotImplementedError(f"fake admin supports ping only, not {name}")
        return {"ok": 1.0}


class FakeDatabase:
    def __init__(self, client: FakeMongoClient, name: str) -> None:
        self.client = client
        self.name = name
        self.collections: dict[str, FakeCollection] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> FakeCollection:
        with self._lock:
            return self.collections.setdefault(name, FakeCollection(self, name))


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for part in parts[:-1]:
        doc = doc.setdefault(part, {})
    doc[parts[-1]] = copy.deepcopy(value)


class FakeCollection:
    def __init__(self, database: FakeDatabase, name: str) -> None:
        self.database = database
        self.name = name
        self.docs: dict[Any, dict[str, Any]] = {}
        self.indexes: dict[str, dict[str, Any]] = {"_id_": {"key": [("_id", 1)]}}
        self.validator: Callable[[dict[str, Any]], bool] | None = None
        self.fail_next: list[BaseException] = []
        self.down = False
        self.write_concern_errors = 0
        self.index_fail_next: list[BaseException] = []
        self.calls: list[tuple[bool, list[tuple[Any, Any, Any]]]] = []
        self._lock = threading.RLock()

    # -- writes -------------------------------------------------------------------------------

    def bulk_write(self, requests: Iterable[Any], ordered: bool = True) -> BulkWriteResult:
        requests = list(requests)
        with self._lock:
            self.calls.append((ordered, [(r._filter, r._doc, r._upsert) for r in requests]))
            if self.down:
                raise AutoReconnect("fake: connection refused")
            if self.fail_next:
                raise self.fail_next.pop(0)
            for r in requests:
                if not isinstance(r, UpdateOne):
                    raise TypeError(f"fake supports UpdateOne only, got {r!r}")
                bson.encode({"q": r._filter, "u": r._doc})  # InvalidDocument, like pymongo
            result: dict[str, Any] = {
                "writeErrors": [],
                "writeConcernErrors": [],
                "nInserted": 0,
                "nUpserted": 0,
                "nMatched": 0,
                "nModified": 0,
                "nRemoved": 0,
                "upserted": [],
            }
            for index, r in enumerate(requests):
                error = self._apply(index, r._filter, r._doc, bool(r._upsert), result)
                if error is not None:
                    result["writeErrors"].append(error)
                    if ordered:
                        break
            if self.write_concern_errors:
                self.write_concern_errors -= 1
                result["writeConcernErrors"].append(
                    {"code": 64, "errmsg": "waiting for replication timed out"}
                )
            if result["writeErrors"] or result["writeConcernErrors"]:
                raise BulkWriteError(result)
            return BulkWriteResult(result, True)

    def update_one(
        self, filter: Mapping[str, Any], update: Mapping[str, Any], upsert: bool = False
    ) -> UpdateResult:
        try:
            res = self.bulk_write([UpdateOne(filter, update, upsert=upsert)])
        except BulkWriteError as exc:
            err = exc.details["writeErrors"][0]
            raise OperationFailure(err["errmsg"], err["code"]) from None
        raw = {"n": res.matched_count + res.upserted_count, "nModified": res.modified_count}
        if res.upserted_ids:
            raw["upserted"] = res.upserted_ids[0]
        return UpdateResult(raw, True)

    def _apply(
        self,
        index: int,
        filt: Mapping[str, Any],
        update: Mapping[str, Any],
        upsert: bool,
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        if set(filt) != {"_id"}:
            raise NotImplementedError("fake supports {'_id': value} filters only")
        doc_id = filt["_id"]
        sets = update.get("$set", {})
        on_insert = update.get("$setOnInsert", {})
        lows, highs = update.get("$min", {}), update.get("$max", {})
        paths = [*sets, *on_insert, *lows, *highs]
        if len(paths) != len(set(paths)):
            return {
                "index": index,
                "code": 40,
                "errmsg": "Updating the path would create a conflict",
                "op": {"q": filt, "u": update},
            }
        existing = self.docs.get(doc_id)
        if existing is None and not upsert:
            return None
        new = copy.deepcopy(existing) if existing is not None else {"_id": doc_id}
        for path, value in sets.items():
            _set_path(new, path, value)
        if existing is None:
            for path, value in on_insert.items():
                _set_path(new, path, value)
        new = bson.decode(bson.encode(new))  # (compared as stored: BSON datetimes)
        for path, value in lows.items():  # top-level paths only
            value = bson.decode(bson.encode({"v": value}))["v"]
            if path not in new or value < new[path]:
                _set_path(new, path, value)
        for path, value in highs.items():
            value = bson.decode(bson.encode({"v": value}))["v"]
            if path not in new or value > new[path]:
                _set_path(new, path, value)
        new = bson.decode(bson.encode(new))
        if self.validator is not None and not self.validator(new):
            return {
                "index": index,
                "code": 121,
                "errmsg": "Document failed validation",
                "op": {"q": filt, "u": update},
            }
        clash = self._unique_clash(new)
        if clash:
            return {
                "index": index,
                "code": 11000,
                "errmsg": f"E11000 duplicate key {clash}",
                "op": {"q": filt, "u": update},
            }
        if existing is None:
            result["nUpserted"] += 1
            result["upserted"].append({"index": index, "_id": doc_id})
        else:
            result["nMatched"] += 1
            if new != existing:
                result["nModified"] += 1
        self.docs[doc_id] = new
        return None

    def _unique_clash(self, new: dict[str, Any]) -> str | None:
        for name, spec in self.indexes.items():
            if not spec.get("unique"):
                continue
            key = [new.get(f) for f, _ in spec["key"]]
            for other in self.docs.values():
                if other["_id"] != new["_id"] and [other.get(f) for f, _ in spec["key"]] == key:
                    return f"index {name} {key!r}"
        return None

    # -- indexes and reads --------------------------------------------------------------------

    def create_index(
        self, keys: list[tuple[str, int]], name: str | None = None, **options: Any
    ) -> str:
        with self._lock:
            if self.index_fail_next:
                raise self.index_fail_next.pop(0)
            name = name or "_".join(f"{k}_{d}" for k, d in keys)
            spec = {"key": list(keys), **options}
            old = self.indexes.get(name)
            if old is not None and old != spec:
                raise OperationFailure(
                    f"Index with name: {name} already exists with different options", 85
                )
            self.indexes[name] = spec
            return name

    def index_information(self) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self.indexes)

    def find(self, filter: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        filter = filter or {}
        with self._lock:
            return [
                copy.deepcopy(d)
                for d in self.docs.values()
                if all(d.get(k) == v for k, v in filter.items())
            ]

    def find_one(self, filter: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        found = self.find(filter)
        return found[0] if found else None

    def count_documents(self, filter: Mapping[str, Any]) -> int:
        return len(self.find(filter))
