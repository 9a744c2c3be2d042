"""The frontier call and the lean push as one Redis Functions library (lua/library.py), on a
real Redis: loaded when a server lacks it, the call sent once more and run once; the caches
the library keeps between calls (the call's constants, ARGV[3]; each worker's heartbeat,
ARGV[2]) never answer for an argument that changed; a least-privileged worker loads and runs
it."""

from __future__ import annotations

import asyncio
import os

import msgpack
import pytest
import redis

from scrapy_fleet import acl, lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.lean import LeanResult, lean_args
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.lua import library


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def row(host: str, tag: bytes = b"r") -> tuple[bytes, int, bytes, int, str]:
    return os.urandom(12), 0, tag + host.encode(), 0, host


def libraries(client) -> list[bytes]:
    """Names of the libraries the server holds (FUNCTION LIST: flat lists in RESP2)."""
    return [dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"]
            for lib in client.function_list()]


def beat(state: str, pages: int = 0) -> bytes:
    return msgpack.packb({"hb": {"st": state, "pg": pages, "pid": 1}, "da": 15000,
                          "fa": 120000}, use_bin_type=False)


def test_a_server_without_the_library_gets_it_and_each_call_runs_once(client, redis_url):
    name = library.library()[0].encode()
    client.function_flush()
    admin = FrontierAdmin(redis_url, "fn")
    first = admin.push([row("a.test")])
    assert (first.pushed, first.queued) == (1, 1)
    assert libraries(client) == [name]
    client.function_flush()  # (a restart without persistence, a new empty primary)
    second = admin.push([row("a.test"), row("b.test")])
    assert (second.pushed, second.queued) == (2, 3)  # run once: not twice, not refused
    assert libraries(client) == [name]
    assert int(client.hget(admin.keys.stats, "pushed") or 0) == 3
    admin.close()

    async def worker_call() -> tuple[int, int]:
        frontier = AsyncFrontier(redis_url, CrawlKeys("fleet", "fn"), "w1:1:1", FrontierParams())
        try:
            got = await frontier.call(CallBatch(take=2))
            return len(got.leased), got.queued
        finally:
            await frontier.close()

    client.function_flush()
    assert asyncio.run(worker_call()) == (2, 1)
    assert libraries(client) == [name]
    # the lean push, a function of the same library
    client.function_flush()
    keys = CrawlKeys("fleet", "fnlean").partition(1, 4)
    lean = LeanResult.from_reply(lua.load(client, "push_lean.lua")(
        keys=keys.call_keys(PUSH_LEAN_CALL, "op1"),
        args=[lean_args([(*row("c.test")[:3], "c.test")], FrontierParams(), "")]))
    assert lean.pushed == 1 and client.get(keys.queue_count) == b"1"


def test_a_function_error_other_than_missing_is_raised_as_it_is(client):
    keys = CrawlKeys("fleet", "fnerr")
    with pytest.raises(redis.ResponseError, match="bad frontier call argument"):
        lua.load(client, "frontier.lua")(keys=keys.frontier_keys("op", "-", "w"),
                                         args=[b"\xc1", b""])
    assert libraries(client) == [library.library()[0].encode()]


def test_a_call_with_changed_constants_sees_them(redis_url):
    """ARGV[3] is checked once per distinct value and kept: a client whose constants change
    (here the per-host bound) is served the new ones, then the old ones again; and more
    distinct values than the cache holds (it is emptied) still each give their own."""
    admin = FrontierAdmin(redis_url, "cst", params=FrontierParams(host_queue_max=1))
    assert admin.push([row("h1.test"), row("h1.test")]).refused == [1]
    admin.params = FrontierParams()  # no per-host bound
    assert admin.push([row("h1.test"), row("h1.test")]).refused == []
    admin.params = FrontierParams(host_queue_max=1)
    assert admin.push([row("h1.test")]).refused == [0]
    for bound in range(1, 70):  # (CALL_CONSTANTS_MAX is 64)
        admin.params = FrontierParams(host_queue_max=bound)
        host = f"n{bound}.test"
        got = admin.push([row(host) for _ in range(bound + 1)])
        assert got.refused == [bound], bound
    admin.params = FrontierParams(host_queue_max=1)
    assert admin.push([row("h2.test"), row("h2.test")]).refused == [1]
    admin.close()


def test_a_changed_heartbeat_is_written_and_each_worker_keeps_its_own(redis_url, client):
    """ARGV[2] unchanged is not unpacked again, but a changed one is, per worker: the worker's
    hash always holds the heartbeat it sent last (its digest `hd` too)."""
    admin = FrontierAdmin(redis_url, "hb")
    keys = admin.keys
    for state in ("crawling", "idle", "crawling"):
        for worker in ("w1:1:1", "w2:1:1"):
            admin.call(CallBatch(), worker=worker, monitor=beat(f"{state}-{worker}"))
            assert client.hget(keys.worker_info(worker), "st") == f"{state}-{worker}".encode()
    # both workers sending the same heartbeat, alternately
    for _ in range(2):
        for worker in ("w1:1:1", "w2:1:1"):
            admin.call(CallBatch(), worker=worker, monitor=beat("same", 7))
            assert client.hmget(keys.worker_info(worker), "st", "pg") == [b"same", b"7"]
    # more workers than the cache holds (MON_MEMO_MAX, 1024: it is emptied), then the first
    for n in range(1030):
        admin.call(CallBatch(), worker=f"m{n}:1:1", monitor=beat(f"s{n}"))
    assert [client.hget(keys.worker_info(f"m{n}:1:1"), "st") for n in (0, 1023, 1029)] == \
        [b"s0", b"s1023", b"s1029"]
    admin.call(CallBatch(), worker="m0:1:1", monitor=beat("again"))
    assert client.hget(keys.worker_info("m0:1:1"), "st") == b"again"
    with pytest.raises(redis.ResponseError, match="bad heartbeat field"):
        admin.call(CallBatch(), worker="m0:1:1",
                   monitor=msgpack.packb({"hb": {"nope": 1}}, use_bin_type=False))
    admin.close()


def test_a_least_privileged_worker_loads_the_library_and_crawls(redis_server, redis_url,
                                                                client):
    rule = acl.acl_rule("worker", crawl_id="aclfn", optional=False)
    client.execute_command("ACL", "SETUSER", "fn-worker", "reset", "on", ">pw-fn", *rule.split())
    try:
        url = f"redis://fn-worker:pw-fn@127.0.0.1:{redis_server.port}/0"
        client.function_flush()
        admin = FrontierAdmin(url, "aclfn")
        admin.ping("worker")  # the start's probe passes
        assert admin.push([row("a.test")]).pushed == 1
        assert admin.call(CallBatch(take=1), worker="w1:1:1").leased
        admin.close()
        assert libraries(client) == [library.library()[0].encode()]
        # without FUNCTION LOAD, a server lacking the library refuses the call, naming it
        client.function_flush()
        less = " ".join(w for w in rule.split() if w != "+function|load")
        client.execute_command("ACL", "SETUSER", "fn-worker", "reset", "on", ">pw-fn",
                               *less.split())
        admin = FrontierAdmin(url, "aclfn")
        with pytest.raises(redis.exceptions.NoPermissionError, match="function"):
            admin.push([row("b.test")])
        admin.close()
    finally:
        client.execute_command("ACL", "DELUSER", "fn-worker")


def test_the_scripts_hold_no_test_clock_unless_a_test_turns_it_on():
    """Production pays nothing for the test clock: off (the default), neither the library
    nor any EVALSHA script reads its key."""
    from scrapy_fleet.keys.crawl import TEST_CLOCK_KEY
    from scrapy_fleet.lua import sources

    assert sources.test_clock() is None
    assert TEST_CLOCK_KEY not in library.library()[1]
    assert "server_now_ms_real" not in library.library()[1]
    assert not [name for name in sources.SCRIPTS if TEST_CLOCK_KEY in sources.source(name)]


def test_the_test_clock_moves_the_frontier_calls_clock(client, redis_url, lua_clock):
    """On, the frontier call's clock (its reply's ``now_ms``) is Redis TIME plus the offset
    the test added: an hour ahead after ``lua_clock(3600)``; its lease expires by it."""
    from support import server_ms

    from scrapy_fleet.keys.crawl import TEST_CLOCK_KEY

    assert TEST_CLOCK_KEY in library.library()[1]
    admin = FrontierAdmin(redis_url, "clock", params=FrontierParams(lease_timeout=60))
    admin.push([row("h.test")])
    before = admin.call(CallBatch(take=1), worker="w")
    assert len(before.leased) == 1 and before.now_ms <= server_ms(client)
    lua_clock(3600)
    after = admin.call(CallBatch(), worker="w2")
    assert after.now_ms > server_ms(client) + 3_000_000
    assert after.reclaimed == 1  # the lease of 60 s ran out on that clock
    admin.close()
