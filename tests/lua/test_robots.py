"""Shared robots.txt: per origin (RFC 9309), retried with a growing wait when it cannot be
fetched, given up after FLEET_ROBOTSTXT_MAX_ATTEMPTS (issue 9, items 1 and 2).

The tests call lua/politeness.lua and lua/frontier.lua on a real redis-server;
worker/test_robots_crawls.py runs real workers against servers that fail robots.txt.
"""

from __future__ import annotations

import time

import msgpack
import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings
from support import wait_server_past

from scrapy_fleet import codec, lua
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import robots_origin


def call(url: str, op: str, host: str, **args):
    """One call of lua/politeness.lua, as the robots.txt middleware makes it."""
    client = redis.Redis.from_url(url)
    keys = CrawlKeys("fleet", "robots")
    script = lua.load(client, "politeness.lua")
    reply = script(keys=keys.politeness_keys(),
                   args=[msgpack.packb({"op": op, "h": host, **args}, use_bin_type=False)])
    decoded = {k.decode(): v for k, v in msgpack.unpackb(reply, raw=True).items()}
    if decoded.get("entry"):
        decoded["entry"] = {k.decode(): v.decode() if k == b"err" else v for k, v in
                            msgpack.unpackb(decoded["entry"], raw=True).items()}
    return decoded


def store(url: str, origin: str, status: int, **args):
    fields = {"body": b"", "cd": -1, "hold": 1000, "cap": 4000, "ma": 5, "err": "boom",
              "ra": -1, "w": "w1", **args}
    return call(url, "robots_store", "a.test", o=origin, status=status, **fields)


def test_robots_failures_wait_longer_each_time_then_give_up(redis_url):
    origin = "http://a.test:80"
    waits = []
    for _ in range(4):
        reply = store(redis_url, origin, 503)
        waits.append(reply["entry"]["next"] - reply["now"])
        assert reply["entry"]["gone"] == 0
    assert waits == [1000, 2000, 4000, 4000]  # hold * 2^(n-1), capped
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "robots")
    # not known yet: the frontier keeps scouting the host (one request at a time)
    assert not client.hexists(keys.robots, "a.test")
    fifth = store(redis_url, origin, 0)
    assert (fifth["entry"]["gone"], fifth["entry"]["fails"], fifth["entry"]["err"]) == (
        1, 5, "boom")
    assert client.hget(keys.robots, "a.test") == origin.encode()  # known: given up
    # a Retry-After longer than the back-off wins; a usable answer starts the count again
    late = store(redis_url, "http://b.test:80", 429, ra=9000)
    assert late["entry"]["next"] - late["now"] == 9000
    ok = store(redis_url, "http://b.test:80", 404)
    assert (ok["entry"]["fails"], ok["entry"]["next"], ok["entry"]["gone"]) == (0, 0, 0)
    again = store(redis_url, "http://b.test:80", 503)
    assert again["entry"]["next"] - again["now"] == 1000


def test_robots_state_and_lock_are_per_origin(redis_url):
    first, second = "http://a.test:8001", "http://a.test:8002"
    assert call(redis_url, "robots_lock", "", o=first, w="w1", ttl=30000)["ok"] == 1
    assert call(redis_url, "robots_lock", "", o=first, w="w2", ttl=30000)["ok"] == 0
    assert call(redis_url, "robots_lock", "", o=first, w="w1", ttl=30000)["ok"] == 1  # renewed
    assert call(redis_url, "robots_lock", "", o=second, w="w2", ttl=30000)["ok"] == 1
    store(redis_url, first, 503)
    assert call(redis_url, "robots_get", "", o=second)["entry"] == b""
    assert call(redis_url, "robots_lock", "", o=first, w="w2", ttl=30000)["ok"] == 1  # freed
    # checked and taken in one step: a settled entry (usable, or failed with its next attempt
    # still ahead) is returned instead of the lock, so no second fetch starts right after one
    store(redis_url, second, 200)
    settled = call(redis_url, "robots_lock", "", o=second, w="w3", ttl=30000, rt=3600000)
    assert (settled["ok"], settled["entry"]["status"]) == (0, 200)
    # (w2 holds first's lock since above)
    assert call(redis_url, "robots_lock", "", o=first, w="w2", ttl=30000,
                rt=3600000)["ok"] == 0  # failed, its next attempt 1 s ahead
    time.sleep(1.05)
    assert call(redis_url, "robots_lock", "", o=first, w="w2", ttl=30000,
                rt=3600000)["ok"] == 1  # due
    # the failed robots.txt put no hold on the host: the other origins' pages go on
    keys = CrawlKeys("fleet", "robots")
    assert not redis.Redis.from_url(redis_url).hexists(keys.hold, "a.test")


def test_robots_origin_is_scheme_host_and_port():
    assert robots_origin("http://A.Test/x?y") == "http://a.test:80"
    assert robots_origin("https://a.test/") == "https://a.test:443"
    assert robots_origin("http://a.test:8080/p") == "http://a.test:8080"
    assert robots_origin("http://[::1]:81/") == "http://[::1]:81"
    assert robots_origin("mailto:x@a.test") == ""


def test_a_delayed_push_is_leased_only_after_its_delay(redis_url):
    admin = FrontierAdmin(redis_url, "delayed")
    url = "http://a.test/p"
    # (2 s: the first lease call must come before the delay is over, even on a loaded machine)
    admin.push([(bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, "a.test", 2000)])
    assert admin.status()["deferred"] == 1
    assert admin.call(CallBatch(take=5), worker="w").leased == []
    ((_, due),) = admin.client.zrange(admin.keys.deferred, 0, -1, withscores=True)
    wait_server_past(admin.client, due)
    leased = admin.call(CallBatch(take=5), worker="w").leased
    assert [codec.decode_dict(e.payload)["url"] for e in leased] == [url]


@pytest.mark.parametrize("value", [-1, 2.5, "many", True])
def test_max_attempts_setting_is_validated(value):
    with pytest.raises(FleetConfigError, match="FLEET_ROBOTSTXT_MAX_ATTEMPTS"):
        FleetConfig.from_settings(Settings({"FLEET_ROBOTSTXT_MAX_ATTEMPTS": value}))


def test_max_attempts_setting_default_and_zero():
    assert FleetConfig.from_settings(Settings()).politeness.robotstxt_max_attempts == 4
    assert FleetConfig.from_settings(
        Settings({"FLEET_ROBOTSTXT_MAX_ATTEMPTS": "0"})).politeness.robotstxt_max_attempts == 0
