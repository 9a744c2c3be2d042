"""Per-host politeness state in Redis: GCRA, caps, holds, back-off, host keys, settings."""

from __future__ import annotations

import time

import msgpack
import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings
from support import host_entry as entry
from support import server_ms, wait_server_past, wait_until

from scrapy_fleet import codec, lua
from scrapy_fleet.addon import Addon
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import host_key


def url_of(e) -> str:
    return codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url


def politeness_call(url: str, op: str, host: str, **args):
    """One call of lua/politeness.lua, as the downloader middlewares make it."""
    client = redis.Redis.from_url(url)
    keys = CrawlKeys("fleet", "hosts")
    script = lua.load(client, "politeness.lua")
    reply = script(keys=keys.politeness_keys(),
                   args=[msgpack.packb({"op": op, "h": host, **args})])
    decoded = msgpack.unpackb(reply, raw=False)
    return decoded if isinstance(decoded, dict) else {}


def test_gcra_spaces_leases_by_the_servers_clock(redis_url):
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_interval=0.4))
    admin.push([entry(f"http://a.test/{i}") for i in range(3)])
    replies = [admin.call(CallBatch(take=3), worker="w")]
    while sum(len(r.leased) for r in replies) < 3:
        time.sleep(0.02)
        replies.append(admin.call(CallBatch(take=3), worker="w"))
    got = [len(r.leased) for r in replies]
    assert got[0] == 1 and max(got) == 1  # one per interval, even when three are asked for
    # the third waited two intervals, on the server's clock: each lease put the host's next
    # turn one interval (0.4 s) later, and every call between two leases was told to wait
    # for it (next_ready, seconds), the leases being the calls the turn had come for
    turns = [r.next_ready for r in replies if r.leased][:2]
    assert turns == [pytest.approx(0.4, abs=0.005)] * 2, turns
    waits = [r.next_ready for r in replies if not r.leased]
    assert all(w is not None and 0 < w <= 0.4 for w in waits), waits


def test_a_call_that_leases_less_than_asked_says_when_the_next_host_may_go(redis_url):
    """Issue 9 (trial): with a per-host rate, a worker leased one request per poll (0.5 s)
    whatever the rate, because nothing told it when the host's next turn was.  The reply now
    carries it (``next_ready``, seconds) and the scheduler calls again then."""
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_interval=0.2))
    admin.push([entry(f"http://a.test/{i}") for i in range(3)]
               + [entry(f"http://b.test/{i}") for i in range(2)])
    first = admin.call(CallBatch(take=5), worker="w")
    assert len(first.leased) == 2  # one per host
    assert first.next_ready is not None and 0 < first.next_ready <= 0.2
    later = admin.call(CallBatch(), worker="w")  # asked for nothing: no time to report
    assert later.next_ready is None
    admin.call(CallBatch(take=5), worker="w")
    for _ in range(40):  # lease what is left; once nothing waits for a turn, no time
        last = admin.call(CallBatch(take=5), worker="w")
        if not last.leased and last.queued == 0:
            break
        time.sleep(0.05)
    assert last.queued == 0 and last.next_ready is None


def test_burst_lets_that_many_go_at_once(redis_url):
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_interval=10,
                                                                    host_burst=3))
    admin.push([entry(f"http://a.test/{i}") for i in range(5)])
    assert len(admin.call(CallBatch(take=5), worker="w").leased) == 3


def test_concurrency_slot_comes_back_when_a_lease_expires(redis_url):
    # (a 3 s lease: the second call must come before it expires, even on a loaded machine)
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(lease_timeout=3,
                                                                    host_concurrency=1))
    admin.push([entry("http://a.test/1"), entry("http://a.test/2"), entry("http://b.test/1")])
    first = admin.call(CallBatch(take=3), worker="dies")
    assert sorted(url_of(e) for e in first.leased) == ["http://a.test/1", "http://b.test/1"]
    assert admin.call(CallBatch(take=3), worker="w2").leased == []  # a.test is at its cap
    wait_server_past(admin.client, max(admin.client.zscore(admin.keys.leases, e.entry_id)
                                       for e in first.leased))
    again = admin.call(CallBatch(take=3), worker="w2")  # the dead worker's leases expire
    assert {url_of(e) for e in again.leased} >= {"http://a.test/1"}
    assert len([e for e in again.leased if "a.test" in url_of(e)]) == 1  # still one at a time


def test_concurrency_slot_comes_back_when_the_download_is_over(redis_url):
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_concurrency=1))
    admin.push([entry(f"http://a.test/{i}") for i in range(3)])
    first = admin.call(CallBatch(take=3), worker="w").leased
    assert [url_of(e) for e in first] == ["http://a.test/0"]
    lease = (first[0].entry_id, first[0].token)
    live = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "hosts")
    # a notice with a stale token changes nothing
    stale = admin.call(CallBatch(downloaded=[(lease[0], lease[1] + 1)], take=3), worker="w")
    assert stale.leased == []
    # the download is over: the next request of the host may go while this one is parsed
    second = admin.call(CallBatch(downloaded=[lease], take=3), worker="w").leased
    assert [url_of(e) for e in second] == ["http://a.test/1"]
    assert int(live.hget(keys.hostlive, "a.test")) == 1
    # the same notice again, then the ack: the slot is not given back twice
    admin.call(CallBatch(downloaded=[lease]), worker="w")
    res = admin.call(CallBatch(acks=[lease], take=3), worker="w")
    assert (res.acked, res.leased) == (1, [])
    assert int(live.hget(keys.hostlive, "a.test")) == 1
    assert live.hget(keys.wlive, "w|a.test") == b"1"


def test_download_over_and_ack_in_one_call_free_the_slot_once(redis_url):
    """The notice and the acknowledgement of one lease in the same call (a worker that parsed
    the response before its next call): the ack drops the lease and frees its slot, once; the
    lease value is not rewritten first, and the host's next request is leased in that call."""
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_concurrency=1))
    admin.push([entry(f"http://a.test/{i}") for i in range(3)])
    keys = CrawlKeys("fleet", "hosts")
    live = redis.Redis.from_url(redis_url)
    (first,) = admin.call(CallBatch(take=3), worker="w").leased
    lease = (first.entry_id, first.token)
    res = admin.call(CallBatch(downloaded=[lease], acks=[lease], take=3), worker="w")
    assert res.acked == 1
    assert [url_of(e) for e in res.leased] == ["http://a.test/1"]
    assert int(live.hget(keys.hostlive, "a.test")) == 1  # the new lease's slot only
    assert live.hget(keys.wlive, "w|a.test") == b"1"
    assert live.hexists(keys.lease, first.entry_id) == 0
    # a stale notice and ack of the same lease again: nothing more is freed
    again = admin.call(CallBatch(downloaded=[lease], acks=[lease], take=3), worker="w")
    assert (again.acked, again.leased, again.lost) == (0, [], [first.entry_id])
    assert int(live.hget(keys.hostlive, "a.test")) == 1


def test_one_call_leases_many_heads_of_one_host_in_order(redis_url):
    """A host without a cap gives one call as many of its entries as it asks for, read 1, 2, 4
    ... at a time: FIFO across those reads, best priority first, every entry once."""
    admin = FrontierAdmin(redis_url, "hosts")
    admin.push([entry(f"http://a.test/{i:02d}") for i in range(40)])
    hi = Request("http://a.test/urgent", priority=5)
    admin.push([(bloom_key(hi.url.encode()), 5, codec.encode(hi), 0, "a.test")])
    got = [url_of(e) for e in admin.call(CallBatch(take=30), worker="w").leased]
    assert got == ["http://a.test/urgent"] + [f"http://a.test/{i:02d}" for i in range(29)]
    rest = [url_of(e) for e in admin.call(CallBatch(take=30), worker="w").leased]
    assert rest == [f"http://a.test/{i:02d}" for i in range(29, 40)]


def test_hold_blocks_a_host_and_not_the_others(redis_url):
    admin = FrontierAdmin(redis_url, "hosts")
    admin.push([entry("http://a.test/1"), entry("http://b.test/1")])
    # (a 2 s hold: the next call must come before it ends, even on a loaded machine)
    reply = politeness_call(redis_url, "backoff", "a.test", ra=2)
    assert reply["delay"] == 2000
    assert [url_of(e) for e in admin.call(CallBatch(take=2), worker="w").leased] == [
        "http://b.test/1"]
    assert politeness_call(redis_url, "hold", "a.test")["wait"] > 0
    wait_until(lambda: politeness_call(redis_url, "hold", "a.test")["wait"] == 0, 30,
               "the hold to end", interval=0.02)
    assert [url_of(e) for e in admin.call(CallBatch(take=2), worker="w").leased] == [
        "http://a.test/1"]
    assert politeness_call(redis_url, "hold", "a.test")["wait"] == 0


def test_backoff_without_retry_after_doubles_and_success_resets(redis_url):
    delays = [politeness_call(redis_url, "backoff", "dead.test", ra=-1, base=1000,
                              max=3000, jit=1.0)["delay"] for _ in range(4)]
    assert delays == [1000, 2000, 3000, 3000]  # base * 2^(n-1), capped
    politeness_call(redis_url, "success", "dead.test")
    assert politeness_call(redis_url, "backoff", "dead.test", ra=-1, base=1000, max=3000,
                           jit=1.0)["delay"] == 1000


def test_guard_token_shares_the_frontiers_limiter(redis_url):
    admin = FrontierAdmin(redis_url, "hosts", params=FrontierParams(host_interval=1.0))
    admin.push([entry("http://a.test/1")])
    assert len(admin.call(CallBatch(take=1), worker="w").leased) == 1  # token taken
    wait = politeness_call(redis_url, "take", "a.test", pt=1000, pb=1, pc=0)["wait"]
    assert 800 < wait <= 1000  # the guard must wait for the same host's next turn
    assert politeness_call(redis_url, "take", "b.test", pt=1000, pb=1, pc=0)["wait"] == 0


def test_a_late_rate_turn_keeps_at_most_half_an_interval_of_its_lateness(redis_url):
    """A rate's token taken late keeps its schedule (TAT + T) only up to T/2 of lateness,
    so two turns are never closer than T/2 (issue 35: a 1-s window held 27 requests at 25/s)."""
    client = redis.Redis.from_url(redis_url)
    tat_key = CrawlKeys("fleet", "hosts").tat
    for late, kept in ((200, 200), (700, 500)):  # ms late, of it kept (T = 1000)
        before = server_ms(client)
        client.hset(tat_key, "a.test", before - late)
        assert politeness_call(redis_url, "take", "a.test", pt=1000, pb=1, pc=0, pr=1)["wait"] == 0
        after = server_ms(client)
        tat = int(float(client.hget(tat_key, "a.test")))
        # the next turn: T after the late moment, less what the token kept of its lateness
        assert before + 1000 - kept <= tat <= after + 1000 - kept, (late, tat - before)


@pytest.mark.parametrize("url,mode,expected", [
    ("http://Sub.Example.co.uk:8080/x", "host", "sub.example.co.uk"),
    ("http://a.example.co.uk/x", "domain", "example.co.uk"),
    ("http://b.example.co.uk/y", "domain", "example.co.uk"),
    ("http://127.0.0.2:9000/", "ip", "127.0.0.2"),
    ("http://localhost/", "ip", "127.0.0.1"),
])
def test_host_keys(url, mode, expected):
    assert host_key(url, mode) == expected


def test_addon_turns_per_process_settings_into_fleet_wide_ones():
    settings = Settings({"DOWNLOAD_DELAY": 2.5, "CONCURRENT_REQUESTS_PER_DOMAIN": 3},
                        priority="project")
    Addon().update_settings(settings)
    assert settings.getfloat("DOWNLOAD_DELAY") == 0  # no per-process delay stacks on top
    config = FleetConfig.from_settings(settings)
    assert (config.politeness.host_interval, config.politeness.host_concurrency) == (2.5, 3)
    middlewares = {getattr(k, "__qualname__", k): v
                   for k, v in settings.getdict("DOWNLOADER_MIDDLEWARES").items()}
    assert middlewares["RobotsTxtMiddleware"] is None  # replaced by the fleet's shared one
    assert middlewares["FleetRobotsTxtMiddleware"] == 100
    rated = FleetConfig.from_settings({"FLEET_HOST_RATE": 4, "FLEET_HOST_DELAY": 0.1,
                                       "FLEET_HOST_OVERRIDES": '{"x.test": {"rate": 0.5}}'})
    assert rated.politeness.host_interval == 0.25
    assert rated.politeness.host_overrides == {"x.test": (2.0, None, None, True)}
