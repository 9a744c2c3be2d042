"""The start-key feeder's Redis calls (compat/feeder.py ``StartKeyFeeder``, issue 36's Redis
time): on a real Redis and lua/startkey.lua, a long start key is taken in growing batches
once the frontier confirms each whole take (few calls for many entries), a worker whose
entries are not confirmed takes no more (nothing lost if it dies), a step with nothing to
confirm, renew or take is not sent, deadlines are renewed only as the lease runs out, and an
idle feeder backs off.  The frontier side is a stand-in for the worker's lease book: what it
says is what the test confirms."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_fleet.compat.feeder import IDLE_BACKOFF, MAX_BATCH, StartKeyFeeder
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys.fleet import StartKeyKeys

START = "feed:start_urls"
KEYS = StartKeyKeys(START)


class Book:
    """The lease book's side the feeder reads (frontier/ledger.py): the requests it was given
    are in the frontier up to ``pushed`` (None: all of them)."""

    def __init__(self) -> None:
        self.start_active = False
        self.closing = self.draining = False
        self.outbox_size = 0
        self.pushed: int | None = None  # the first start index not in the frontier

    def first_unpushed_start(self) -> int | None:
        return self.pushed


class FeedSpider(Spider):
    name = "feed"
    redis_key = START
    redis_batch_size = 16

    def make_request_from_data(self, data: bytes) -> Request:
        return Request(data.decode())


def feeder(redis_url: str, **settings: Any) -> tuple[StartKeyFeeder, Book, list[Request]]:
    values = {"FLEET_REDIS_URL": redis_url, "FLEET_WORKER_ID": "w1",
              "FLEET_POLL_INTERVAL": 0.5, **settings}
    crawler = get_crawler(FeedSpider, values)
    spider = FeedSpider()
    book, made = Book(), []
    fed = StartKeyFeeder(crawler, FleetConfig.from_settings(crawler.settings), spider,
                         book, lambda r: made.append(r) or True)  # type: ignore[arg-type]
    return fed, book, made


def script_calls(client: redis.Redis) -> int:
    """EVALSHA calls that ran (not the first one's NOSCRIPT, after which redis-py loads the
    script)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


async def steps(fed: StartKeyFeeder, book: Book, client: redis.Redis,
                confirm: bool) -> tuple[int, int]:
    """Steps until the key is empty (or 300 steps), the frontier confirming every request
    after each step when *confirm*: (steps, script calls)."""
    from scrapy_fleet import lua, redis_client

    aclient = redis_client.make_client(fed.config.redis_url, 5.0, is_async=True)
    fed._script = lua.load(aclient, "startkey.lua")
    before = script_calls(client)
    n = 0
    try:
        while n < 300 and (client.llen(START) or fed.held):
            await fed.step()
            n += 1
            book.pushed = None if confirm else 0
            if not confirm and n >= 20:
                break
    finally:
        await aclient.aclose()
    return n, script_calls(client) - before


def test_a_long_key_is_taken_in_growing_batches_as_the_frontier_confirms(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.lpush(START, *[f"http://h.test/{i}" for i in range(1500)])
    fed, book, made = feeder(redis_url)
    book.pushed = None
    _, calls = asyncio.run(steps(fed, book, client, confirm=True))
    assert client.llen(START) == 0 and client.zcard(KEYS.deadlines) == 0
    assert sorted(r.url for r in made) == sorted(f"http://h.test/{i}" for i in range(1500))
    # 16, 32, ... 512, then 1000 a take: 7 takes and the call that confirms the last one
    # (16 at a time would have taken 94 calls)
    assert MAX_BATCH == 1000 and calls == 8, calls
    assert fed.take == 16  # the key ran short: back to the spider's batch


def test_a_worker_whose_entries_are_not_confirmed_takes_no_more(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.lpush(START, *[f"http://h.test/{i}" for i in range(100)])
    fed, book, _ = feeder(redis_url, FLEET_LEASE_TIMEOUT=600)
    book.pushed = 0  # nothing in the frontier
    n, calls = asyncio.run(steps(fed, book, client, confirm=False))
    # one take of the spider's batch, then nothing sent: nothing to confirm, renew or take
    assert (n, calls, fed.take, len(fed.held)) == (20, 1, 16, 16)
    assert client.zcard(KEYS.deadlines) == 16 and client.llen(START) == 84


def test_deadlines_are_renewed_only_as_the_lease_runs_out(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.lpush(START, *[f"http://h.test/{i}" for i in range(20)])
    fed, book, _ = feeder(redis_url, FLEET_LEASE_TIMEOUT=3)
    book.pushed = 0

    async def run() -> tuple[int, int, dict[bytes, float], dict[bytes, float]]:
        from scrapy_fleet import lua, redis_client

        aclient = redis_client.make_client(fed.config.redis_url, 5.0, is_async=True)
        fed._script = lua.load(aclient, "startkey.lua")
        try:
            await fed.step()
            first = dict(client.zrange(KEYS.deadlines, 0, -1, withscores=True))
            before = script_calls(client)
            await fed.step()  # at once: nothing due
            quiet = script_calls(client) - before
            await asyncio.sleep(1.2)  # over a third of the 3 s lease
            await fed.step()
            return quiet, script_calls(client) - before, first, dict(
                client.zrange(KEYS.deadlines, 0, -1, withscores=True))
        finally:
            await aclient.aclose()

    quiet, calls, first, later = asyncio.run(run())
    assert (quiet, calls) == (0, 1)
    assert set(later) == set(first) and len(first) == 16
    assert all(later[k] >= first[k] + 1000 for k in first)  # (ms: Redis's clock moved on)


def test_an_idle_feeder_backs_off(redis_url):
    client = redis.Redis.from_url(redis_url)
    fed, book, _ = feeder(redis_url)

    async def run() -> list[float]:
        from scrapy_fleet import lua, redis_client

        aclient = redis_client.make_client(fed.config.redis_url, 5.0, is_async=True)
        fed._script = lua.load(aclient, "startkey.lua")
        waits = []
        try:
            for _ in range(6):
                await fed.step()
                waits.append(fed.idle_wait)
            client.lpush(START, "http://h.test/late")  # a producer again: at once
            await fed.step()
            waits.append(fed.idle_wait)
        finally:
            await aclient.aclose()
        return waits

    waits = asyncio.run(run())
    assert waits == [0.5, 1.0, 2.0, 4.0, 0.5 * IDLE_BACKOFF, 0.5 * IDLE_BACKOFF, 0.0]
    assert book.start_active and len(fed.held) == 1


@pytest.mark.parametrize("seconds", [3.0])
def test_the_loop_of_an_idle_feeder_calls_redis_less_and_less(redis_url, seconds):
    """The feeder's own loop on an empty key, FLEET_POLL_INTERVAL 0.05 s: with the back-off
    its calls over *seconds* are about seconds / (8 x 0.05) plus the ramp, not one per poll
    interval (60)."""
    client = redis.Redis.from_url(redis_url)
    fed, _, _ = feeder(redis_url, FLEET_POLL_INTERVAL=0.05)

    async def run() -> int:
        before = script_calls(client)
        fed.start()
        await asyncio.sleep(seconds)
        await fed.stop()
        return script_calls(client) - before

    calls = asyncio.run(run())
    assert 1 <= calls <= seconds / (IDLE_BACKOFF * 0.05) + 5, calls
