"""One ``bulk_write`` of upserts and the classification of its outcome: written, rejected for
good, to be retried, or a MongoDB failure that waiting cannot heal and that stops the crawl
(docs/mongo.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import bson
from itemadapter import ItemAdapter
from pymongo import UpdateOne
from pymongo.errors import (
    BulkWriteError,
    ConfigurationError,
    DocumentTooLarge,
    OperationFailure,
    PyMongoError,
)

from scrapy_fleet import engine_hooks
from scrapy_fleet.errors import FleetError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


#: Server error codes after which the same write may succeed later (network, elections,
#: shutdown, timeouts).  Mirrors pymongo's retryable-write codes.
TRANSIENT_CODES = frozenset({
    6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 64, 50,
})
#: Duplicate key: with upserts on ``_id`` only a race between two upserts of the same new
#: document, which succeeds when retried.  Against a unique secondary index it is permanent, so
#: an op is retried at most this many times for it before being rejected.
DUPLICATE_KEY = 11000
DUPLICATE_KEY_RETRIES = 3
#: Largest document MongoDB accepts (bytes).
MAX_BSON_SIZE = 16 * 1024 * 1024

STAT_PREFIX = "fleet/mongo/"

#: Server error codes that no retry heals: the URI's credentials, or its user's rights.
AUTHENTICATION_FAILED = 18
UNAUTHORIZED = 13
#: MongoDB Atlas's proxy answers some authentication and authorization failures with this
#: generic code ("bad auth : authentication failed", "user is not allowed to do action ...");
#: other Atlas errors with it (quotas...) are retried like before.
ATLAS_ERROR = 8000

#: Close reasons of a crawl stopped by a MongoDB failure that waiting cannot heal.
AUTH_FAILED_REASON = "mongo_auth_failed"
UNAUTHORIZED_REASON = "mongo_unauthorized"
CONFIG_ERROR_REASON = "mongo_config_error"


class DocumentRejected(FleetError):
    """An item's document MongoDB (or pymongo's BSON encoding) refused for good: the item was
    not written.  Raised by ``MongoPipeline.process_item``; its request fails with the reason
    ``item/mongo/<code>`` (``fleet_reason``: ``121`` validation, ``11000`` duplicate of a
    unique secondary key, ``invalid_document``, ``document_too_large``...), see
    docs/failures.md."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
        self.fleet_reason = f"item/mongo/{code}"


@dataclass(frozen=True)
class FatalError:
    """A MongoDB failure that waiting cannot heal, and how the crawl is stopped for it."""

    reason: str  #: close reason of the spider (``mongo_auth_failed``...)
    key: str  #: ``fleet/mongo/fatal/<key>``: the server error code, or the exception class
    exc: BaseException


def _errmsg(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if isinstance(details, Mapping) and details.get("errmsg"):
        return str(details["errmsg"])
    return str(exc)


def fatal_error(exc: BaseException) -> FatalError | None:
    """*exc* as a failure that no retry heals, or ``None`` (then it is retried as before).

    Authentication failed (code 18; Atlas code 8000 saying "bad auth" / "authentication"),
    not authorized (code 13; Atlas code 8000 saying "not allowed" / "not authorized"), and
    ``pymongo.errors.ConfigurationError`` (invalid URI or options, a mongodb+srv name that does
    not resolve, a missing dependency of the auth mechanism, an unsupported server version).
    """
    if isinstance(exc, ConfigurationError):
        return FatalError(CONFIG_ERROR_REASON, type(exc).__name__, exc)
    if not isinstance(exc, OperationFailure) or isinstance(exc, BulkWriteError):
        return None
    code = exc.code
    if code == AUTHENTICATION_FAILED:
        return FatalError(AUTH_FAILED_REASON, str(code), exc)
    if code == UNAUTHORIZED:
        return FatalError(UNAUTHORIZED_REASON, str(code), exc)
    if code == ATLAS_ERROR:
        message = _errmsg(exc).lower()
        if "bad auth" in message or "authentication" in message:
            return FatalError(AUTH_FAILED_REASON, str(code), exc)
        if "not allowed" in message or "not authorized" in message:
            return FatalError(UNAUTHORIZED_REASON, str(code), exc)
    return None


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, OperationFailure):
        details = exc.details if isinstance(exc.details, Mapping) else {}
        name = details.get("codeName")
        return f"{type(exc).__name__} {exc.code}{f' {name}' if name else ''}: {_errmsg(exc)}"
    return f"{type(exc).__name__}: {exc}"


def stop_acknowledging(crawler: Crawler | None, reason: str) -> bool:
    """Tell the fleet scheduler to acknowledge no request from now on
    (:meth:`~scrapy_fleet.frontier.scheduler.FleetScheduler.withhold_acknowledgements`).

    After a fatal MongoDB failure the requests still in progress have items that were not
    written: the scheduler keeps them leased and releases them when it closes (they go back to
    the queue, without the penalty of an expiry).  With another scheduler this changes nothing.

    Returns:
        False when there is no running engine or its scheduler cannot withhold.
    """
    ledger = engine_hooks.ledger_of(crawler)
    if ledger is None:
        return False
    ledger.withhold_acknowledgements(reason)
    return True



_SCALARS = (str, int, float, bool, bytes, datetime, type(None))


def plain_value(value: Any) -> Any:
    """*value* with nested items (of any ItemAdapter type) turned into dicts, for BSON.

    Same result as ``ItemAdapter.asdict`` but scalars, the bulk of item fields, are returned
    without the per-value adapter lookups (a several-fold speed-up on typical items).
    """
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if ItemAdapter.is_item(value):
        return {k: plain_value(v) for k, v in ItemAdapter(value).items()}
    return value


class WriteOp:
    """One item's pending upsert, and the future completed when it is settled."""

    __slots__ = ("collection", "doc_id", "dup_retries", "future", "update")

    def __init__(self, collection: str, doc_id: Any, update: dict[str, Any],
                 future: asyncio.Future[None]) -> None:
        self.collection = collection
        self.doc_id = doc_id
        self.update = update
        self.future = future
        self.dup_retries = 0


@dataclass
class WriteOutcome:
    """What one ``bulk_write`` attempt did with a batch (indices into the batch)."""

    written: list[int] = field(default_factory=list)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)  # index, code, message
    retry: list[int] = field(default_factory=list)
    upserted: int = 0
    modified: int = 0
    error: BaseException | None = None  # why `retry` is not empty (back-off applies)
    retry_now: bool = False  # retry without back-off (bad documents were taken out)
    fatal: BaseException | None = None  # not a MongoDB error: fail the items
    stop: FatalError | None = None  # credentials, rights, configuration: stop the crawl


def _isolate_bad_documents(ops: Sequence[WriteOp], exc: BaseException) -> WriteOutcome:
    """A batch that pymongo refused to encode: find which documents are at fault."""
    out = WriteOutcome()
    for i, op in enumerate(ops):
        try:
            size = len(bson.encode({"q": {"_id": op.doc_id}, "u": op.update}))
        except Exception as err:  # any encoding error rejects the document
            out.rejected.append((i, "invalid_document", f"{type(err).__name__}: {err}"))
            continue
        if size > MAX_BSON_SIZE:
            out.rejected.append((i, "document_too_large", f"{size} bytes"))
        else:
            out.retry.append(i)
    if not out.rejected:  # could not pin it on a document: do not loop on it
        return WriteOutcome(fatal=exc)
    out.retry_now = True
    return out


def write_batch(collection: Any, ops: Sequence[WriteOp]) -> WriteOutcome:
    """Send *ops* as one ``bulk_write(ordered=False)``, once, and classify the result.

    Runs in a worker thread (blocking I/O).  Never raises: the outcome says which ops were
    written, which MongoDB rejected for good (with the error code), and which must be retried.
    """
    requests = [UpdateOne({"_id": op.doc_id}, op.update, upsert=True) for op in ops]
    try:
        result = collection.bulk_write(requests, ordered=False)
    except BulkWriteError as exc:
        return _classify_bulk_error(ops, exc)
    except (bson.errors.InvalidDocument, DocumentTooLarge) as exc:
        return _isolate_bad_documents(ops, exc)
    except PyMongoError as exc:
        stop = fatal_error(exc)
        if stop is not None:  # credentials, rights, configuration: waiting does not help
            return WriteOutcome(stop=stop)
        # network, elections, timeouts...: retried
        return WriteOutcome(retry=list(range(len(ops))), error=exc)
    except Exception as exc:  # a bug, not an outage: surface it
        return WriteOutcome(fatal=exc)
    return WriteOutcome(written=list(range(len(ops))), upserted=result.upserted_count,
                    modified=result.modified_count)


def _classify_bulk_error(ops: Sequence[WriteOp], exc: BulkWriteError) -> WriteOutcome:
    details = exc.details or {}
    out = WriteOutcome(upserted=int(details.get("nUpserted", 0)),
                   modified=int(details.get("nModified", 0)), error=exc)
    failed: set[int] = set()
    for err in details.get("writeErrors") or []:
        index = int(err.get("index", -1))
        if not 0 <= index < len(ops):
            continue
        failed.add(index)
        code = err.get("code")
        if code in TRANSIENT_CODES:
            out.retry.append(index)
        elif code == DUPLICATE_KEY and ops[index].dup_retries < DUPLICATE_KEY_RETRIES:
            ops[index].dup_retries += 1
            out.retry.append(index)
        else:
            out.rejected.append((index, str(code), str(err.get("errmsg", ""))))
    others = [i for i in range(len(ops)) if i not in failed]
    if details.get("writeConcernErrors"):
        # Applied on the primary but not acknowledged as the URI's write concern asks:
        # not durable yet.  Upserts are idempotent, so sending them again is harmless.
        out.retry.extend(others)
        out.upserted = out.modified = 0
    else:
        out.written.extend(others)
    out.retry.sort()
    return out

