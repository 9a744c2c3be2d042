"""MongoDB item pipeline: idempotent bulk upserts, each item done only once it is written.

Every item becomes one upsert keyed by a stable document id::

    UpdateOne({"_id": <stable id>},
              {"$set": {<item fields>...},
               "$min": {"first_seen_at": <now>}, "$max": {"updated_at": <now>}},
              upsert=True)

so a page fetched twice (the fleet delivers at least once) overwrites its document instead of
adding a copy.  The times go through ``$min`` / ``$max``, so that two workers writing one page
at once (the later write may carry the earlier time) still leave ``first_seen_at`` the
earliest write time and ``updated_at`` the latest, never the one before the other.  Upserts
are grouped per collection and sent with ``bulk_write(ordered=False)`` when a batch holds
``FLEET_MONGO_BATCH_SIZE`` items, when its oldest item is ``FLEET_MONGO_FLUSH_INTERVAL``
seconds old, and on close.  pymongo runs in a small thread pool
of this pipeline's own; the reactor never waits on MongoDB.

Delivery contract (see docs/mongo.md): :meth:`MongoPipeline.process_item` returns only when the
item's write has been acknowledged by MongoDB (with the write concern of the URI).  Transient
failures are retried with exponential back-off for as long as it takes, so while MongoDB is down
the item stays in progress, Scrapy's scraper keeps the response in progress, and the fleet
scheduler does not acknowledge the request: if the worker dies, the lease expires and the page
is fetched again.  A document MongoDB rejects for good (validation, code 121, and other
non-transient write errors, or a document BSON cannot encode) is logged with its id, counted in
``fleet/mongo/write_errors/<code>`` and raised as :class:`DocumentRejected`, so that its request
fails (``item/mongo/<code>``: recorded among the failed requests, docs/failures.md); the rest of
its batch is unaffected.

Failures that waiting cannot heal stop the crawl instead of being retried forever: MongoDB
refusing the URI's credentials (code 18, or Atlas's 8000 "bad auth"), its user lacking the right
to write (code 13), or a URI / client configuration pymongo refuses (``ConfigurationError``).
At open they close the spider before any page is fetched; during the crawl the pipeline logs one
error, counts ``fleet/mongo/fatal/<code or name>``, drops the items it holds, makes the engine
stop reporting finished requests to the fleet scheduler (so none of them is acknowledged: the
scheduler releases their leases when it closes) and closes the spider with the reason
``mongo_auth_failed``, ``mongo_unauthorized`` or ``mongo_config_error``.

The pipeline needs Scrapy's asyncio reactor (the default since Scrapy 2.13).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pymongo import ASCENDING
from pymongo.errors import (
    OperationFailure,
    PyMongoError,
)
from scrapy.exceptions import CloseSpider, DropItem
from scrapy.utils.defer import maybe_deferred_to_future

from scrapy_fleet import engine_hooks
from scrapy_fleet.pipelines.mongo_config import (
    MongoConfig,
    default_document_id,
)
from scrapy_fleet.pipelines.mongo_writes import (
    AUTH_FAILED_REASON,
    STAT_PREFIX,
    UNAUTHORIZED_REASON,
    DocumentRejected,
    FatalError,
    WriteOp,
    WriteOutcome,
    describe_error,
    fatal_error,
    plain_value,
    stop_acknowledging,
    write_batch,
)
from scrapy_fleet.redact import redact as redact_uri
from scrapy_fleet.redact import scrub as _scrub

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class MongoPipeline:
    """Scrapy item pipeline writing items to MongoDB as idempotent upserts.

    Enabled by the fleet add-on at order 300 and inactive (``NotConfigured``) unless
    ``FLEET_MONGO_URI`` is set.  Settings, stats and the delivery guarantee: docs/mongo.md.

    ``process_item`` is a coroutine that finishes when the item is settled:

    * returns the item once MongoDB acknowledged its upsert;
    * raises :class:`~scrapy.exceptions.DropItem` when the item has no stable id (missing id
      fields; stat ``fleet/mongo/dropped/missing_id``);
    * raises :class:`DocumentRejected` when MongoDB (or BSON) rejected its document for good
      (stat ``fleet/mongo/write_errors/<code>``): Scrapy reports an item error, and the
      fleet records the item's request as failed (``item/mongo/<code>``);
    * does not finish while MongoDB is unreachable (retried with back-off, stat
      ``fleet/mongo/retries``), so the request that produced the item is not acknowledged;
    * raises :class:`~scrapy.exceptions.DropItem` (logged at DEBUG, stat
      ``fleet/mongo/dropped/fatal``) after a failure waiting cannot heal (see
      :func:`fatal_error`): the pipeline has then logged one error, counted
      ``fleet/mongo/fatal/<code or name>``, stopped the acknowledgements of the worker
      (:func:`stop_acknowledging`) and asked the engine to close the spider;
    * raises the exception of a non-MongoDB failure (a bug), which Scrapy reports as an item
      error.

    Args:
        config: validated settings.
        crawler: gives the stats collector and the spider (name of the default collection).
        stats: stats collector to use instead of the crawler's.
    """

    def __init__(self, config: MongoConfig, crawler: Crawler | None = None,
                 stats: StatsCollector | None = None) -> None:
        self.config = config
        self.crawler = crawler
        self.stats = stats if stats is not None else (crawler.stats if crawler else None)
        self.client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._writers: asyncio.Semaphore | None = None
        self._room: asyncio.Semaphore | None = None
        self._buffers: dict[str, list[WriteOp]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._indexed: set[str] = set()
        self._collection_names: dict[type, str] = {}
        self._spider_name = "items"
        self._active = 0  # items inside process_item
        self._idle: asyncio.Future[None] | None = None
        self._closing = False
        self._closed = False
        self._fatal: FatalError | None = None  # set once, by _stop
        self._unsettled: set[asyncio.Future[None]] = set()  # futures of queued or written ops
        self._close_task: asyncio.Task[None] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MongoPipeline:
        """Build the pipeline from ``crawler.settings``.

        Raises:
            NotConfigured: ``FLEET_MONGO_URI`` is not set (the pipeline is then skipped).
            FleetConfigError: a ``FLEET_MONGO_*`` setting has a wrong value.
        """
        return cls(MongoConfig.from_settings(crawler.settings), crawler=crawler)

    # -- Scrapy hooks -------------------------------------------------------------------------

    async def open_spider(self) -> None:
        """Create the client and thread pool, ``ping`` MongoDB (which authenticates), and
        create the indexes of the spider's collection.

        MongoDB being unreachable is logged and does not stop the crawl: index creation is
        tried again before the first write to each collection.  A failure waiting cannot heal
        (:func:`fatal_error`: wrong credentials, bad URI) is logged once, counted in
        ``fleet/mongo/fatal/<code or name>``, and closes the spider before any page is fetched.

        Raises:
            CloseSpider: reason ``mongo_auth_failed``, ``mongo_unauthorized`` or
                ``mongo_config_error``.
            RuntimeError: Scrapy does not run the asyncio reactor.
        """
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "MongoPipeline needs Scrapy's asyncio reactor (TWISTED_REACTOR = "
                "'twisted.internet.asyncioreactor.AsyncioSelectorReactor')") from None
        spider = getattr(self.crawler, "spider", None)
        if spider is not None and getattr(spider, "name", None):
            self._spider_name = spider.name
        self._executor = ThreadPoolExecutor(self.config.concurrency,
                                            thread_name_prefix="fleet-mongo")
        self._writers = asyncio.Semaphore(self.config.concurrency)
        self._room = asyncio.Semaphore(self.config.max_pending)
        name: str | None = None
        try:
            self.client = await self._loop.run_in_executor(
                self._executor, self.config.client_factory, self.config.uri)
            reachable = await self._loop.run_in_executor(self._executor, self._ping)
            if reachable and (self.config.collection is None
                              or "%(item_class)" not in self.config.collection):
                name = self.collection_name(None)
                await self._loop.run_in_executor(self._executor, self._ensure_indexes, name)
        except PyMongoError as exc:  # _ping and _ensure_indexes let only fatal errors out
            fatal = fatal_error(exc)
            if fatal is None:
                raise
            self._stop(fatal, name, opening=True)
            raise CloseSpider(fatal.reason) from None

    async def process_item(self, item: Any) -> Any:
        """Queue the item's upsert and wait until it is written (see the class docstring).

        Returns:
            the item, unchanged, once MongoDB acknowledged its upsert.

        Raises:
            DropItem: no stable id.
            DocumentRejected: a document MongoDB (or BSON) rejects for good.
            RuntimeError: called before :meth:`open_spider` or after :meth:`close_spider`.
        """
        if self._loop is None or self._room is None or self._closed:
            raise RuntimeError("MongoPipeline.process_item called while the pipeline is closed")
        if self._fatal is not None:
            raise self._not_written()
        op = self.build_op(item)
        self._active += 1
        try:
            await self._room.acquire()
            try:
                if self._fatal is not None:
                    raise self._not_written()
                self._unsettled.add(op.future)
                op.future.add_done_callback(self._unsettled.discard)
                self._enqueue(op)
                # shield: a cancelled caller must not cancel the write other items share.
                await asyncio.shield(op.future)
            finally:
                self._room.release()
        finally:
            self._active -= 1
            if not self._active and self._idle is not None and not self._idle.done():
                self._idle.set_result(None)
        return item

    async def close_spider(self) -> None:
        """Flush every batch, wait until all are settled, then close the client.

        While MongoDB is unreachable this waits (and retries) until it comes back: stopping a
        worker is never a reason to drop items.  After a fatal failure nothing is left to wait
        for (every item was dropped).
        """
        if self._loop is None or self._closed:
            return
        self._closing = True  # from now on every item is flushed at once
        for name in list(self._buffers):
            self._flush(name)
        while self._active:
            self._idle = self._loop.create_future()
            await self._idle
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        self._closed = True
        if self.client is not None and self._executor is not None:
            await self._loop.run_in_executor(self._executor, self.client.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    # -- building writes ----------------------------------------------------------------------

    def collection_name(self, item: Any) -> str:
        """Name of the collection *item* goes to (*item* ``None``: the per-spider default)."""
        template = self.config.collection
        if template is None:
            return self._spider_name
        cls = type(item)
        name = self._collection_names.get(cls)
        if name is None:
            name = template % {"spider": self._spider_name, "item_class": cls.__name__}
            self._collection_names[cls] = name
        return name

    def document_id(self, adapter: ItemAdapter) -> Any:
        """Stable ``_id`` of an item, or ``None`` when it has none.

        ``FLEET_MONGO_ID_FUNCTION(adapter)`` when set (its return value as is), otherwise
        :func:`default_document_id` of the ``FLEET_MONGO_ID_FIELDS`` values; ``None`` when one
        of them is missing, ``None`` or ``""``.
        """
        if self.config.id_function is not None:
            return self.config.id_function(adapter)
        values = []
        for name in self.config.id_fields:
            value = adapter.get(name)
            if value is None or value == "":
                return None
            values.append(value)
        return default_document_id(values)

    def build_op(self, item: Any) -> WriteOp:
        """The pending upsert of *item* (the ``$set``/``$min``/``$max`` document of the docs).

        Raises:
            DropItem: the item has no stable id (stat ``fleet/mongo/dropped/missing_id``).
        """
        adapter = ItemAdapter(item)
        doc_id = self.document_id(adapter)
        if doc_id is None:
            self._inc("dropped/missing_id")
            fields = ", ".join(self.config.id_fields) or "FLEET_MONGO_ID_FUNCTION"
            raise DropItem(f"MongoPipeline: item has no stable id (from {fields})")
        fields_doc = {name: plain_value(value) for name, value in adapter.items()}
        fields_doc.pop("_id", None)
        fields_doc.pop(self.config.first_seen_field, None)
        fields_doc.pop(self.config.updated_field, None)
        now = datetime.now(timezone.utc)
        update = {"$set": fields_doc, "$min": {self.config.first_seen_field: now},
                  "$max": {self.config.updated_field: now}}
        assert self._loop is not None
        return WriteOp(self.collection_name(item), doc_id, update, self._loop.create_future())

    # -- batching -----------------------------------------------------------------------------

    def _enqueue(self, op: WriteOp) -> None:
        assert self._loop is not None
        buffer = self._buffers.setdefault(op.collection, [])
        buffer.append(op)
        if len(buffer) >= self.config.batch_size or self._closing:
            self._flush(op.collection)
        elif op.collection not in self._timers:
            self._timers[op.collection] = self._loop.call_later(
                self.config.flush_interval, self._flush, op.collection)

    def _flush(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        ops = self._buffers.pop(name, None)
        if not ops:
            return
        assert self._loop is not None
        task = self._loop.create_task(self._write(name, ops))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, name: str, ops: list[WriteOp]) -> None:
        """Write *ops* to collection *name* until each one is written or rejected."""
        assert self._loop is not None and self._writers is not None
        attempt = 0
        try:
            while ops:
                async with self._writers:
                    outcome = await self._loop.run_in_executor(self._executor, self._attempt,
                                                               name, ops)
                ops = self._settle(name, ops, outcome)
                if not ops:
                    return
                if outcome.retry_now:
                    continue
                attempt += 1
                self._inc("retries")
                delay = min(self.config.retry_max_backoff,
                            self.config.retry_backoff * 2 ** (attempt - 1))
                delay *= 0.5 + random.random() / 2  # jitter, not crypto
                logger.warning("MongoDB write of %d item(s) to %s failed (%s: %s); retry %d in "
                               "%.2fs", len(ops), name, type(outcome.error).__name__,
                               outcome.error, attempt, delay)
                await asyncio.sleep(delay)
        except BaseException as exc:  # cancelled loop or a bug: never leave a future hanging
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(exc if isinstance(exc, Exception)
                                            else RuntimeError("MongoDB write cancelled"))
            raise

    def _attempt(self, name: str, ops: Sequence[WriteOp]) -> WriteOutcome:
        """One write attempt, in a worker thread."""
        if name not in self._indexed:
            try:
                self._ensure_indexes(name)
            except PyMongoError as exc:  # only the failures waiting cannot heal get here
                stop = fatal_error(exc)
                if stop is None:
                    return WriteOutcome(retry=list(range(len(ops))), error=exc)
                return WriteOutcome(stop=stop)
        return write_batch(self.client[self.config.database][name], ops)

    def _settle(self, name: str, ops: list[WriteOp], outcome: WriteOutcome) -> list[WriteOp]:
        """Complete the futures of settled ops, update stats; return the ops to retry."""
        self._inc("batches")
        if outcome.stop is not None:
            self._stop(outcome.stop, name)
            return []
        if outcome.fatal is not None:
            logger.error("MongoDB write of %d item(s) to %s failed", len(ops), name,
                         exc_info=outcome.fatal)
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(outcome.fatal)
            return []
        self._inc("upserted", outcome.upserted)
        self._inc("modified", outcome.modified)
        self._inc("written", len(outcome.written))
        for i in outcome.written:
            if not ops[i].future.done():
                ops[i].future.set_result(None)
        for i, code, message in outcome.rejected:
            op = ops[i]
            self._inc(f"write_errors/{code}")
            logger.error("MongoDB rejected document _id=%r in %s.%s (code %s): %s", op.doc_id,
                         self.config.database, name, code, message)
            if not op.future.done():
                op.future.set_exception(DocumentRejected(
                    f"MongoDB rejected document _id={op.doc_id!r} (code {code}): {message}",
                    code))
        return [ops[i] for i in outcome.retry]

    def _ping(self) -> bool:
        """``ping`` MongoDB, in a thread: False (logged) when it cannot be reached.

        Raises:
            PyMongoError: a failure waiting cannot heal (:func:`fatal_error`).
        """
        command = getattr(getattr(self.client, "admin", None), "command", None)
        if command is None:  # a client of FLEET_MONGO_CLIENT_FACTORY without commands
            return True
        try:
            command("ping")
        except PyMongoError as exc:
            if fatal_error(exc) is not None:
                raise
            logger.warning("MongoDB at %s cannot be reached yet (%s); the crawl starts anyway "
                           "and items wait in the pipeline until it can be reached",
                           redact_uri(self.config.uri),
                           _scrub(describe_error(exc), self.config.uri))
            return False
        return True

    def _ensure_indexes(self, name: str) -> None:
        """Create this pipeline's indexes on collection *name* (idempotent), in a thread.

        A user without the right to create indexes (code 13) gets a warning and no indexes.

        Raises:
            PyMongoError: a failure waiting cannot heal (:func:`fatal_error`).
        """
        coll = self.client[self.config.database][name]
        cfg = self.config
        try:
            if cfg.ttl is None:
                coll.create_index([(cfg.updated_field, ASCENDING)], name="fleet_updated")
            else:
                coll.create_index([(cfg.updated_field, ASCENDING)], name="fleet_updated",
                                  expireAfterSeconds=cfg.ttl)
            if cfg.unique_fields:
                coll.create_index([(f, ASCENDING) for f in cfg.unique_fields],
                                  name="fleet_unique", unique=True)
        except OperationFailure as exc:
            if exc.code in (85, 86):  # IndexOptionsConflict / IndexKeySpecsConflict
                logger.error("MongoDB index on %s.%s differs from the settings (%s); drop it to "
                             "apply FLEET_MONGO_TTL / FLEET_MONGO_UNIQUE_FIELDS", cfg.database,
                             name, exc)
                self._indexed.add(name)
                return
            fatal = fatal_error(exc)
            if fatal is not None and fatal.reason == UNAUTHORIZED_REASON:
                # writing may still be allowed (a custom role): the first write will tell
                logger.warning("The MongoDB user may not create indexes on %s.%s (%s); going "
                               "on without them: create them yourself or grant createIndex",
                               cfg.database, name, _scrub(describe_error(exc), cfg.uri))
                self._indexed.add(name)
                return
            if fatal is not None:
                raise
            logger.warning("Could not create MongoDB indexes on %s.%s yet: %s", cfg.database,
                           name, exc)
            return
        except PyMongoError as exc:
            if fatal_error(exc) is not None:
                raise
            logger.warning("Could not create MongoDB indexes on %s.%s yet: %s", cfg.database,
                           name, exc)
            return
        self._indexed.add(name)

    # -- failures waiting cannot heal ---------------------------------------------------------

    def _not_written(self) -> DropItem:
        """The DropItem of an item not written because of the fatal failure (and its stat)."""
        assert self._fatal is not None
        self._inc("dropped/fatal")
        return DropItem(f"MongoDB unusable ({self._fatal.reason}): item not written; its request "
                        "is not acknowledged and will be fetched again", log_level="DEBUG")

    def _stop(self, fatal: FatalError, collection: str | None, opening: bool = False) -> None:
        """Stop for good after *fatal*: one error, the stat, no more acknowledgements, every
        pending item dropped, other writes cancelled, the spider closed (at open: by the
        caller, which raises CloseSpider)."""
        if self._fatal is not None:
            return
        self._fatal = fatal
        self._inc(f"fatal/{fatal.key}")
        if self.crawler is not None:  # scrapy crawl exits with status 1
            engine_hooks.fail_exit_status(self.crawler, fatal.reason)
        closing = False
        if not opening:
            stop_acknowledging(self.crawler, fatal.reason)
            closing = self._request_close(fatal.reason)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._buffers.clear()
        pending = [future for future in self._unsettled if not future.done()]
        logger.error("%s", self._fatal_message(fatal, collection, opening, closing, len(pending)))
        for future in pending:
            future.set_exception(self._not_written())
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()  # a batch in back-off or in flight: its items are dropped above

    def _fatal_message(self, fatal: FatalError, collection: str | None, opening: bool,
                       closing: bool, pending: int) -> str:
        cfg = self.config
        uri = redact_uri(cfg.uri)
        cause = _scrub(describe_error(fatal.exc), cfg.uri)
        if fatal.reason == AUTH_FAILED_REASON:
            text = (f"MongoDB refused the credentials of FLEET_MONGO_URI={uri} ({cause}). "
                    "Retrying cannot fix this: check the user name, the password and "
                    "authSource / authMechanism.")
        elif fatal.reason == UNAUTHORIZED_REASON:
            target = f"{cfg.database}.{collection}" if collection else cfg.database
            text = (f"The MongoDB user of FLEET_MONGO_URI={uri} is not authorized to write to "
                    f"{target} ({cause}). Retrying cannot fix this: grant it readWrite on "
                    f"{cfg.database} (or insert, update and createIndex on the collection).")
        else:
            text = (f"FLEET_MONGO_URI={uri} cannot be used ({cause}). Retrying cannot fix "
                    "this: correct the URI or the client options.")
        if opening:
            return text + f" Closing the spider before any page is fetched ({fatal.reason})."
        text += (f" {pending} item(s) not written: their requests are not acknowledged and go "
                 "back to the frontier when the worker closes.")
        if closing:
            return text + f" Closing the spider ({fatal.reason})."
        return text + " No running engine to close: every further item is dropped."

    def _request_close(self, reason: str) -> bool:
        """Ask the running engine to close the spider with *reason* (in a task)."""
        engine = engine_hooks.running_engine(self.crawler)
        spider = getattr(engine, "spider", None)
        if engine is None or spider is None or self._loop is None:
            return False
        self._close_task = self._loop.create_task(self._close_spider_with(engine, spider,
                                                                          reason))
        return True

    @staticmethod
    async def _close_spider_with(engine: Any, spider: Any, reason: str) -> None:
        try:
            close = getattr(engine, "close_spider_async", None)  # Scrapy >= 2.14
            if close is not None:
                await close(reason=reason)
            else:
                await maybe_deferred_to_future(engine.close_spider(spider, reason))
        except Exception:
            logger.exception("Could not close the spider (%s)", reason)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(STAT_PREFIX + key, count)
