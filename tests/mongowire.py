"""A small STATEFUL MongoDB wire-protocol server for tests and the demo (no mongod needed).

:class:`MongoWireServer` runs one or more mockupdb listeners (a thread per client connection,
so several worker processes can connect at once) in front of ONE in-memory store.  The store
applies ``update`` commands with the semantics of :mod:`fakemongo` (``_id`` equality filters,
``upsert``, ``$set``, ``$setOnInsert``, ``$min``, ``$max``, BSON round trip) and answers
as mongod does: ``n``,
``nModified``, ``upserted: [{index, _id}]`` and ``writeErrors`` when any.  It also answers
the handshake (``hello``/``isMaster``, maxWireVersion 17 = MongoDB 6.0), ``ping``,
``buildInfo``, ``endSessions``, ``createIndexes``, ``listIndexes``, ``count``, ``find`` and
the ``aggregate`` that pymongo's ``count_documents`` sends (filters: equality, ``$gt``,
``$gte``, ``$lt``, ``$lte``, ``$in``); any other command fails with code 59.

Access control, when ``users`` (name -> password) is given, as mongod with ``--auth``: a
connection authenticates with SASL PLAIN (``authMechanism=PLAIN`` in the URI: one
``saslStart``, no SCRAM to emulate); wrong credentials get code 18 AuthenticationFailed; any
command but the handshake, ``ping``, ``buildInfo``, ``saslStart`` and ``endSessions`` on a
connection that did not authenticate, and ``update`` / ``createIndexes`` of a user listed in
``read_only``, get code 13 Unauthorized.

For the tests:

* ``writes[(db, collection, _id)]``: how many upserts of each document were applied;
* ``updates``: every ``update`` command received, as ``(listener index, command document)``;
* ``on_update(listener, ids) -> bool``: called (under the server lock) after an ``update``
  command was applied; returning True hangs up instead of replying, i.e. the write is in the
  store but the client never learns it (as when the client dies right after sending it);
* ``auth_failures``: ``(listener, user)`` of every refused ``saslStart``;
* ``refused``: ``(listener, user or None, command document)`` of every command answered
  with code 13 (``updates`` does not list refused ``update`` commands).

By hand (for ``make demo MONGO_URI=...``)::

    .venv/bin/python tests/mongowire.py --port 27017 [--user NAME:PASSWORD] [--read-only NAME]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fakemongo import FakeCollection, FakeMongoClient
from mockupdb import MockupDB

HELLO: dict[str, Any] = {
    "ismaster": True,
    "isWritablePrimary": True,
    "helloOk": True,
    "minWireVersion": 0,
    "maxWireVersion": 17,
    "maxBsonObjectSize": 16 * 1024 * 1024,
    "maxMessageSizeBytes": 48_000_000,
    "maxWriteBatchSize": 100_000,
}

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": lambda a, b: a is not None and a > b,
    "$gte": lambda a, b: a is not None and a >= b,
    "$lt": lambda a, b: a is not None and a < b,
    "$lte": lambda a, b: a is not None and a <= b,
    "$in": lambda a, b: a in b,
    "$eq": lambda a, b: a == b,
}

#: Commands a connection may send before it authenticated (lower case).
_PUBLIC = frozenset({"ismaster", "hello", "ping", "buildinfo", "saslstart", "saslcontinue",
                     "endsessions"})
#: Commands a read-only user may not send.
_WRITES = frozenset({"update", "createIndexes"})


def matches(doc: Mapping[str, Any], filt: Mapping[str, Any]) -> bool:
    """Whether *doc* matches a filter of equalities and ``$gt/$gte/$lt/$lte/$in/$eq``."""
    for key, cond in filt.items():
        value = doc.get(key)
        if isinstance(cond, Mapping) and cond and all(k.startswith("$") for k in cond):
            for op, arg in cond.items():
                if op not in _COMPARE:
                    raise NotImplementedError(f"mongowire: filter operator {op}")
                if not _COMPARE[op](value, arg):
                    return False
        elif value != cond:
            return False
    return True


class MongoWireServer:
    """Stateful wire server on ``listeners`` loopback ports sharing one store.

    ``users`` (name -> password) turns access control on, ``read_only`` names users that may
    not write (see the module docstring).
    """

    def __init__(self, listeners: int = 1, port: int = 0,
                 users: Mapping[str, str] | None = None, read_only: Iterable[str] = ()) -> None:
        self.store = FakeMongoClient()
        self.writes: Counter[tuple[str, str, Any]] = Counter()
        self.updates: list[tuple[int, dict[str, Any]]] = []
        self.commands: Counter[str] = Counter()
        self.on_update: Callable[[int, list[Any]], bool] | None = None
        self.users = dict(users or {})
        self.read_only = set(read_only)
        self.auth_failures: list[tuple[int, str]] = []
        self.refused: list[tuple[int, str | None, dict[str, Any]]] = []
        self._sessions: dict[tuple[int, int], str] = {}  # (listener, client port) -> user
        self._lock = threading.RLock()
        self._servers: list[MockupDB] = []
        for index in range(listeners):
            server = MockupDB(port=port if index == 0 else 0, auto_ismaster=None)
            server.autoresponds(lambda request, index=index: self._handle(index, request))
            self._servers.append(server)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> MongoWireServer:
        for server in self._servers:
            server.run()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop()

    def __enter__(self) -> MongoWireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget the store and everything recorded (not the authenticated connections)."""
        with self._lock:
            self.store = FakeMongoClient()
            self.writes.clear()
            self.commands.clear()
            self.updates, self.auth_failures, self.refused = [], [], []

    def port(self, listener: int = 0) -> int:
        return int(self._servers[listener].port)

    def uri(self, listener: int = 0, user: str | None = None, password: str = "") -> str:
        """URI of a listener; with *user*, authenticating with PLAIN as *user*/*password*."""
        if user is None:
            return f"mongodb://127.0.0.1:{self.port(listener)}/?directConnection=true"
        return (f"mongodb://{user}:{password}@127.0.0.1:{self.port(listener)}/"
                "?directConnection=true&authMechanism=PLAIN")

    # -- reading the store --------------------------------------------------------------------

    def collection(self, database: str, name: str) -> FakeCollection:
        return self.store[database][name]

    def documents(self, database: str, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return self.collection(database, name).find()

    # -- the request loop ---------------------------------------------------------------------

    def _handle(self, listener: int, request: Any) -> bool:
        name = getattr(request, "command_name", None)
        if name is None:  # legacy op, not a command
            return bool(request.command_err(code=59, errmsg="mongowire: commands only"))
        doc = dict(request.doc)
        database = doc.get("$db") or (request.namespace or "admin").split(".")[0]
        with self._lock:
            self.commands[name] += 1
            try:
                if name == "saslStart":
                    return self._sasl_start(listener, request, doc)
                if self.users and name.lower() not in _PUBLIC:
                    denied = self._denied(listener, request, name, database)
                    if denied:
                        self.refused.append((listener, self._user(listener, request), doc))
                        return self._error(request, 13, "Unauthorized", denied)
                if name.lower() in ("ismaster", "hello"):
                    return self._reply(request, **HELLO, localTime=time.time())
                if name in ("ping", "endSessions", "killCursors"):
                    return self._reply(request)
                if name == "buildInfo" or name == "buildinfo":
                    return self._reply(request, version="6.0.0", versionArray=[6, 0, 0, 0])
                if name == "update":
                    return self._update(listener, request, database, doc)
                coll = self.collection(database, str(doc.get(name)))
                if name == "createIndexes":
                    before = len(coll.indexes)
                    for spec in doc["indexes"]:
                        options = {k: v for k, v in spec.items() if k not in ("key", "name")}
                        coll.create_index(list(spec["key"].items()), name=spec["name"],
                                          **options)
                    return self._reply(request, numIndexesBefore=before,
                                       numIndexesAfter=len(coll.indexes))
                if name == "listIndexes":
                    specs = [{"v": 2, "key": dict(s["key"]), "name": n,
                              **{k: v for k, v in s.items() if k != "key"}}
                             for n, s in coll.indexes.items()]
                    return self._cursor(request, database, coll.name, specs)
                if name == "count":
                    found = [d for d in coll.docs.values() if matches(d, doc.get("query") or {})]
                    return self._reply(request, n=len(found))
                if name == "find":
                    found = [d for d in coll.docs.values() if matches(d, doc.get("filter") or {})]
                    if doc.get("limit"):
                        found = found[: int(doc["limit"])]
                    return self._cursor(request, database, coll.name, found)
                if name == "aggregate":
                    return self._aggregate(request, database, coll, doc.get("pipeline") or [])
            except NotImplementedError as exc:
                return bool(request.command_err(code=59, errmsg=str(exc)))
            return bool(request.command_err(code=59, errmsg=f"no such command: '{name}'"))

    def _user(self, listener: int, request: Any) -> str | None:
        try:
            return self._sessions.get((listener, request.client_port))
        except OSError:  # the client is gone
            return None

    def _sasl_start(self, listener: int, request: Any, doc: dict[str, Any]) -> bool:
        if doc.get("mechanism") != "PLAIN":
            return self._error(request, 334, "MechanismUnavailable",
                               f"mongowire: only PLAIN, not {doc.get('mechanism')}")
        _, user, password = bytes(doc.get("payload") or b"\0\0").decode().split("\0", 2)
        if user not in self.users or self.users[user] != password:
            self.auth_failures.append((listener, user))
            return self._error(request, 18, "AuthenticationFailed", "Authentication failed.")
        try:
            self._sessions[(listener, request.client_port)] = user
        except OSError:
            return True
        return self._reply(request, conversationId=1, done=True, payload=b"")

    def _denied(self, listener: int, request: Any, name: str, database: str) -> str | None:
        """Why the connection may not run command *name*, or None."""
        user = self._user(listener, request)
        if user is None:
            return f"command {name} requires authentication"
        if name in _WRITES and user in self.read_only:
            return f"not authorized on {database} to execute command {{ {name}: ... }}"
        return None

    def _error(self, request: Any, code: int, code_name: str, errmsg: str) -> bool:
        try:
            request.command_err(code=code, errmsg=errmsg, codeName=code_name)
        except OSError:  # the client is gone
            pass
        return True

    def _reply(self, request: Any, **fields: Any) -> bool:
        try:
            request.ok(**fields)
        except OSError:  # the client is gone (e.g. a SIGKILLed worker): nobody to answer
            pass
        return True

    def _cursor(self, request: Any, database: str, coll: str, batch: list[Any]) -> bool:
        return self._reply(request, cursor={"id": 0, "ns": f"{database}.{coll}",
                                            "firstBatch": batch})

    def _aggregate(self, request: Any, database: str, coll: FakeCollection,
                   pipeline: list[Mapping[str, Any]]) -> bool:
        docs = list(coll.docs.values())
        for stage in pipeline:
            (op, arg), = stage.items()
            if op == "$match":
                docs = [d for d in docs if matches(d, arg)]
            elif op == "$skip":
                docs = docs[int(arg):]
            elif op == "$limit":
                docs = docs[: int(arg)]
            elif op == "$group" and dict(arg) == {"_id": 1, "n": {"$sum": 1}}:
                docs = [{"_id": 1, "n": len(docs)}] if docs else []
            else:
                raise NotImplementedError(f"mongowire: aggregate stage {op} {arg!r}")
        return self._cursor(request, database, coll.name, docs)

    def _update(self, listener: int, request: Any, database: str, doc: dict[str, Any]) -> bool:
        coll = self.collection(database, str(doc["update"]))
        self.updates.append((listener, doc))
        result: dict[str, Any] = {"nUpserted": 0, "nMatched": 0, "nModified": 0, "upserted": []}
        errors: list[dict[str, Any]] = []
        applied: list[Any] = []
        for index, spec in enumerate(doc.get("updates") or []):
            error = coll._apply(index, spec["q"], spec["u"], bool(spec.get("upsert")), result)
            if error is not None:
                errors.append({k: error[k] for k in ("index", "code", "errmsg")})
                if doc.get("ordered", True):
                    break
                continue
            applied.append(spec["q"]["_id"])
            self.writes[(database, coll.name, spec["q"]["_id"])] += 1
        if self.on_update is not None and self.on_update(listener, applied):
            try:
                return bool(request.hangup())
            except OSError:
                return True
        reply: dict[str, Any] = {"n": result["nMatched"] + result["nUpserted"],
                                 "nModified": result["nModified"]}
        if result["upserted"]:
            reply["upserted"] = result["upserted"]
        if errors:
            reply["writeErrors"] = errors
        return self._reply(request, **reply)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a stateful MongoDB wire test server.")
    parser.add_argument("--port", type=int, default=27017)
    parser.add_argument("--user", action="append", default=[], metavar="NAME:PASSWORD",
                        help="turn access control on (PLAIN); repeatable")
    parser.add_argument("--read-only", action="append", default=[], metavar="NAME",
                        help="a user that may not write; repeatable")
    args = parser.parse_args()
    users = dict(spec.split(":", 1) for spec in args.user)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with MongoWireServer(port=args.port, users=users, read_only=args.read_only) as server:
        print(server.uri(), flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            totals = Counter(f"{db}.{coll}" for db, coll, _ in server.writes)
            print(f"documents: {dict(totals)}; upserts applied: {sum(server.writes.values())}",
                  flush=True)


if __name__ == "__main__":
    main()
