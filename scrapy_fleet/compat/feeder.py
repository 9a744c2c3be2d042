"""A scrapy-redis spider's start key, fed into the fleet's frontier without loss.

A spider with a ``redis_key`` and a ``make_request_from_data`` method (scrapy-redis's
``RedisSpider``/``RedisCrawlSpider``, or :mod:`scrapy_fleet.compat.spiders`) reads its start
data from that key, which producers fill with LPUSH, SADD or ZADD.  Left alone, scrapy-redis
pops entries from it in the spider's ``start_requests`` and ``spider_idle`` handler: a worker
killed after a pop loses them, and an entry popped while the spider closes is lost too.

With the add-on, :func:`take_over` is the one hook that replaces that loop: the spider's
``spider_idle`` handler is disconnected, FleetSpiderMiddleware does not read its start
requests (which would pop), and each worker runs a :class:`StartKeyFeeder` instead.  Each of
its steps is one call of lua/startkey.lua, which atomically

* forgets the entries whose requests the frontier now holds (this worker's book confirmed
  their push: ``first_unpushed_start``), moves those no request could be made from to
  ``{<key>}:fleet:bad`` (logged and counted), renews the deadlines of the others it holds
  (those taken or renewed over a third of the lease ago);
* takes over the entries of a worker that stopped renewing (killed) for
  ``FLEET_LEASE_TIMEOUT``, then moves new entries from the start key into
  ``{<key>}:fleet:taking`` (in scrapy-redis's order: a list from its head, a set at random, a
  sorted set highest score first), up to the worker's take: ``redis_batch_size`` at first,
  twice as many after each whole take the frontier confirms entries of, up to
  :data:`MAX_BATCH`;
* answers how many entries are left (in the key, and taken by anyone and not yet done).

So an entry leaves the producers' key only into the ``taking`` hash, and leaves that only once
the frontier holds its requests: a worker SIGKILLed in between leaves it to another worker.
Delivery is at least once (an entry taken over may have been pushed already; scrapy-redis's
requests are ``dont_filter``, so it is then fetched twice).  While entries are left the
worker's ``start_active`` keeps the fleet from closing for idleness; once none are left, the
fleet's own idle rules (FLEET_IDLE_TIMEOUT) apply.  The key is read from the fleet's Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals

from scrapy_fleet import lua, redis_client
from scrapy_fleet.codec import START_META_KEY
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.keys.fleet import StartKeyKeys

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from scrapy_fleet.config import FleetConfig
    from scrapy_fleet.frontier.ledger import LeaseLedger

logger = logging.getLogger(__name__)

#: a taken entry no request could be made from (goes to the bad list at the next step)
BAD = -1
#: entries a worker holds taken at most, whatever redis_batch_size says (one script call's
#: arguments stay far below Lua's unpack limit)
MAX_BATCH = 1000
#: seconds between two local checks of whether the frontier holds the held entries' requests
CONFIRM_CHECK = 0.02
#: an idle feeder (the start key empty, nothing held) waits FLEET_POLL_INTERVAL, then twice
#: as long after each empty step, up to this many times FLEET_POLL_INTERVAL
IDLE_BACKOFF = 8
#: a held entry's deadline is renewed once this share of FLEET_LEASE_TIMEOUT has passed
#: since it was taken or renewed (worker's clock)
RENEW_AFTER = 1 / 3


def is_start_key_spider(spider: Any) -> bool:
    """Does *spider* read its start data from a Redis key as scrapy-redis's spiders do (a str
    ``redis_key`` and a ``make_request_from_data`` method)?"""
    return isinstance(getattr(spider, "redis_key", None), str) and callable(
        getattr(spider, "make_request_from_data", None))


def class_start_key(spidercls: Any, settings: Any) -> str | None:
    """The start key a spider class will read, as scrapy-redis's ``setup_redis`` resolves it
    at start (its ``redis_key``, else ``REDIS_START_URLS_KEY``, else
    ``"%(name)s:start_urls"``, with ``%(name)s`` the spider's name); None for a spider that
    reads no start key (no ``redis_key`` attribute or no ``make_request_from_data``)."""
    if not hasattr(spidercls, "redis_key") or not callable(
            getattr(spidercls, "make_request_from_data", None)):
        return None
    key = spidercls.redis_key or settings.get("REDIS_START_URLS_KEY") or "%(name)s:start_urls"
    try:
        return str(key) % {"name": getattr(spidercls, "name", "")}
    except (TypeError, ValueError, KeyError):
        return str(key)


def start_key_kind(settings: Any) -> str:
    """``"list"``, ``"set"`` or ``"zset"``: the type of the start key, as scrapy-redis reads
    ``REDIS_START_URLS_AS_SET`` and ``REDIS_START_URLS_AS_ZSET`` (set first).

    Raises:
        FleetConfigError: both are true (scrapy-redis would silently use the set).
    """
    as_set = settings.getbool("REDIS_START_URLS_AS_SET")
    as_zset = settings.getbool("REDIS_START_URLS_AS_ZSET")
    if as_set and as_zset:
        raise FleetConfigError("REDIS_START_URLS_AS_SET and REDIS_START_URLS_AS_ZSET are both "
                               "true: set the one that matches the start key's type")
    return "set" if as_set else "zset" if as_zset else "list"


def take_over(crawler: Crawler, spider: Spider) -> None:
    """The fleet takes over *spider*'s start-key loop: its ``spider_idle`` handler (which
    would pop entries, and keep the spider open or close it by its own idle rule) is
    disconnected.  Its start requests are not read (FleetSpiderMiddleware)."""
    handler = getattr(spider, "spider_idle", None)
    if handler is not None:
        crawler.signals.disconnect(handler, signal=signals.spider_idle)


def batch_size(spider: Any, crawler: Crawler) -> int:
    """Entries a worker holds taken at most: the spider's ``redis_batch_size`` (scrapy-redis
    sets it from ``REDIS_START_URLS_BATCH_SIZE``, else ``CONCURRENT_REQUESTS``), at most
    :data:`MAX_BATCH`."""
    size = getattr(spider, "redis_batch_size", None)
    try:
        size = int(size) if size is not None else 0
    except (TypeError, ValueError):
        size = 0
    if size <= 0:
        size = max(1, crawler.settings.getint("CONCURRENT_REQUESTS", 16))
    return min(size, MAX_BATCH)


class StartKeyFeeder:
    """Feeds one worker's share of a start key into the frontier (module docstring).

    *enqueue*: the scheduler's ``enqueue_request``; *ledger*: its lease book, which says when
    the frontier accepted the requests (``first_unpushed_start``) and is kept from an idle
    close while entries are left (``start_active``).  Stats: ``fleet/startkey/taken``
    (entries), ``fleet/startkey/taken_over`` (of a stopped worker), ``fleet/startkey/requests``
    (requests made from them), ``fleet/startkey/bad`` (entries no request was made from),
    ``fleet/startkey/done`` (entries confirmed in the frontier).

    Redis time (bench/bench_scrapy_redis_start.py): a step takes ``take`` entries at most,
    from ``batch`` (the spider's ``redis_batch_size``) doubled once the frontier confirms
    entries of a whole take, up to
    :data:`MAX_BATCH`, back to ``batch`` when the key runs short; a step that would confirm,
    renew and take nothing is not sent; a held entry's deadline is renewed only after
    :data:`RENEW_AFTER` of FLEET_LEASE_TIMEOUT; an idle feeder backs off (``idle_wait``:
    FLEET_POLL_INTERVAL doubled after each empty step, up to :data:`IDLE_BACKOFF` times it)."""

    def __init__(self, crawler: Crawler, config: FleetConfig, spider: Spider,
                 ledger: LeaseLedger, enqueue: Callable[[Request], bool]) -> None:
        self.crawler, self.config, self.spider = crawler, config, spider
        self.ledger, self.enqueue = ledger, enqueue
        self.keys = StartKeyKeys(str(getattr(spider, "redis_key", "")))
        self.kind = start_key_kind(crawler.settings)
        self.batch = batch_size(spider, crawler)
        #: entries held at most (batch .. MAX_BATCH: doubled while the key fills whole takes
        #: and the frontier confirms them)
        self.take = self.batch
        self._full = False  # the last take was a whole one
        #: entry id -> index of the last start request made from it (BAD: none made)
        self.held: dict[str, int] = {}
        #: entry id -> when its deadline was set (loop clock, s)
        self._renewed: dict[str, float] = {}
        #: seconds an idle feeder waits before its next step (0: not idle)
        self.idle_wait = 0.0
        self._index = 0
        self._script: Any = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        logger.info("Reading start data from Redis key %r (%s, %d at a time) into the fleet's "
                    "frontier (docs/from-scrapy-redis.md)", self.keys.start, self.kind,
                    self.batch, extra={"spider": self.spider})
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop taking entries (before the worker's last frontier call)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def close(self) -> None:
        """After the worker's last frontier call: forget the entries whose requests it pushed,
        give the others back at once (another worker takes them over at its next step; a
        worker killed instead leaves them for FLEET_LEASE_TIMEOUT)."""
        await self.stop()
        self.ledger.start_active = False
        if self._script is None or not self.held:
            return
        client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                          is_async=True)
        self._script = lua.load(client, "startkey.lua")
        try:
            await self.step(give_back=True)
        except Exception as exc:  # their deadlines pass by themselves
            logger.warning("Could not give the start entries this worker held back (%s): "
                           "another worker takes them over after FLEET_LEASE_TIMEOUT", exc,
                           extra={"spider": self.spider})
        finally:
            await client.aclose()

    async def _run(self) -> None:
        client = redis_client.make_client(self.config.redis_url, self.config.redis_timeout,
                                          is_async=True)
        self._script = lua.load(client, "startkey.lua")
        self.ledger.start_active = True  # until the first step says whether entries are left
        try:
            while not (self.ledger.closing or self.ledger.draining):
                try:
                    full = await self.step()
                except (FleetConfigError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # Redis away: the entries wait in Redis meanwhile
                    logger.warning("Could not read start key %r (%s): trying again",
                                   self.keys.start, exc, extra={"spider": self.spider})
                    full = False
                    await asyncio.sleep(self.config.poll_interval * 4)
                if not full:
                    await self._until_confirmed()
                if self.idle_wait > 0:
                    await asyncio.sleep(self.idle_wait - self.config.poll_interval)
        finally:
            await client.aclose()

    async def _until_confirmed(self) -> None:
        """Wait FLEET_POLL_INTERVAL, or less: until the frontier holds the requests of half a
        batch of the entries this worker holds, or of all of them (a local check every
        CONFIRM_CHECK s, no Redis call), so that the next step frees their places and takes
        as many new entries at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.poll_interval
        enough = max(1, min(len(self.held), self.take // 2))
        while self.held and loop.time() < deadline and not self.ledger.closing:
            done, bad = self._confirmed()
            if len(done) + len(bad) >= enough:
                return
            await asyncio.sleep(CONFIRM_CHECK)
        await asyncio.sleep(max(0.0, deadline - loop.time()) if not self.held else 0)

    def _confirmed(self) -> tuple[list[str], list[str]]:
        """Entries whose requests the frontier accepted, and the bad ones."""
        first = self.ledger.first_unpushed_start()
        done = [i for i, last in self.held.items() if last != BAD and (
            first is None or first > last)]
        bad = [i for i, last in self.held.items() if last == BAD]
        return done, bad

    def _due_renewals(self, now: float) -> list[str]:
        """The held entries whose deadline was set over RENEW_AFTER of the lease ago."""
        before = now - self.config.lease_timeout * RENEW_AFTER
        return [i for i in self.held if self._renewed.get(i, now) <= before]

    async def step(self, give_back: bool = False) -> bool:
        """One call of lua/startkey.lua (none when it would confirm, renew and take nothing);
        returns True when it took a full batch (more may be waiting: the next step follows
        at once).  *give_back*: take nothing, and give the unconfirmed entries back."""
        now = asyncio.get_running_loop().time()
        done, bad = self._confirmed()
        for entry_id in (*done, *bad):
            del self.held[entry_id]
            self._renewed.pop(entry_id, None)
        if self._full and done:  # after a whole take, the frontier confirms: take more
            self.take, self._full = min(MAX_BATCH, self.take * 2), False
        want = 0 if self.ledger.outbox_size >= self.take else self.take - len(self.held)
        want = -1 if give_back else max(0, want)
        renew = list(self.held) if give_back else self._due_renewals(now)
        if want == 0 and not (done or bad or renew):
            return False
        args = [self.kind, self.config.worker_id, int(self.config.lease_timeout * 1000),
                want, len(done), len(bad), *done, *bad, *renew]
        remaining, overdue, taken = await redis_client.call_retrying_async(
            lambda: self._script(keys=self.keys.call_keys(), args=args),
            self.config.redis_url, self.config.redis_retries)
        self._renewed.update(dict.fromkeys(renew, now))
        self._inc("fleet/startkey/done", len(done))
        self._inc("fleet/startkey/bad", len(bad))
        self._inc("fleet/startkey/taken_over", int(overdue))
        pairs = list(zip(taken[::2], taken[1::2], strict=True))
        self._inc("fleet/startkey/taken", len(pairs))
        for raw_id, entry in pairs:
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            self.held[entry_id] = self._make(entry)
            self._renewed[entry_id] = now
        self.ledger.start_active = int(remaining) > 0 or bool(self.held)
        self._adapt(want, len(pairs), int(remaining))
        return want > 0 and len(pairs) >= want

    def _adapt(self, want: int, taken: int, remaining: int) -> None:
        """After a step that asked for *want* entries and got *taken*: the take (doubled at
        the next step that confirms entries after a whole take, the spider's batch after a
        short one: a worker whose pushes do not reach the frontier keeps the spider's batch)
        and the idle wait (doubled while steps find nothing to take and nothing is left or
        held)."""
        if want > 0:
            self._full = taken >= want and len(self.held) >= self.take
            if taken < want:
                self.take = self.batch
        if taken == 0 and not self.held and (want > 0 or remaining == 0):
            poll = self.config.poll_interval
            self.idle_wait = min(IDLE_BACKOFF * poll, max(poll, 2 * self.idle_wait))
        elif taken or self.held:
            self.idle_wait = 0.0

    def _make(self, entry: bytes) -> int:
        """Enqueue the requests the spider makes from *entry*; the index of the last one, or
        BAD when it made none (logged)."""
        try:
            made = self.spider.make_request_from_data(entry)  # type: ignore[attr-defined]
            requests = [made] if isinstance(made, Request) else list(
                made if isinstance(made, Iterable) else ())
        except Exception as exc:
            logger.error("No request could be made from start entry %r of %r (%s: %s): moved "
                         "to %r", entry[:200], self.keys.start, type(exc).__name__, exc,
                         self.keys.bad, extra={"spider": self.spider})
            return BAD
        requests = [r for r in requests if isinstance(r, Request)]
        if not requests:
            logger.error("No request made from start entry %r of %r: moved to %r",
                         entry[:200], self.keys.start, self.keys.bad,
                         extra={"spider": self.spider})
            return BAD
        for request in requests:
            request.meta[START_META_KEY] = self._index
            self._index += 1
            self.enqueue(request)
        self._inc("fleet/startkey/requests", len(requests))
        return self._index - 1

    def _inc(self, key: str, count: int) -> None:
        if count and self.crawler.stats is not None:
            self.crawler.stats.inc_value(key, count)
