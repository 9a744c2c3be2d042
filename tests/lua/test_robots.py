"""Shared robots.txt: per origin (RFC 9309), retried with a growing wait when it cannot be
fetched, given up after FLEET_ROBOTSTXT_MAX_ATTEMPTS (issue 9, items 1 and 2).

The crawl tests run real workers against a closed port and against local servers answering
503 / 429 for robots.txt; the Lua tests call lua/politeness.lua and lua/frontier.lua on a real
redis-server.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import msgpack
import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings
from support import (
    TEST_PROJECT,
    free_port,
    read_items,
    start_worker,
    tail,
    wait_all,
    worker_stats,
)

from scrapy_fleet import codec, lua
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.keys import CrawlKeys
from scrapy_fleet.politeness.hosts import robots_origin
from testsite import generate_site


def run_probe(n: int, urls: list[str], redis_url: str, env: dict[str, str], tmp_path: Path,
              extra: dict[str, object], timeout: float = 120) -> tuple[list[Path], list[Path]]:
    """*n* workers of the ``robots_probe`` spider (start requests *urls*, with an errback)."""
    outs = [tmp_path / f"out-{i}.jsonl" for i in range(n)]
    logs = [tmp_path / f"w-{i}.log" for i in range(n)]
    settings: dict[str, object] = {
        "FLEET_REDIS_URL": redis_url, "ROBOTSTXT_OBEY": True, "FLEET_IDLE_TIMEOUT": 3,
        "FLEET_BACKOFF_BASE": 0.2, "FLEET_BACKOFF_MAX": 2}
    settings.update(extra)
    procs = [start_worker(TEST_PROJECT, "robots_probe",
                          {**settings, "FLEET_JSONL_PATH": outs[i]}, env, logs[i],
                          spider_args={"urls": ",".join(urls)}) for i in range(n)]
    codes = wait_all(procs, timeout)  # an unreachable robots.txt must not keep them running
    assert codes == [0] * n, tail(logs[0])
    return outs, logs


def total(logs: list[Path], key: str) -> float:
    return sum(worker_stats(log).get(key, 0) for log in logs)


# -- crawls ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["refused", 429])
def test_unfetchable_robots_txt_is_retried_then_its_requests_fail(
        failure, redis_url, worker_env, tmp_path, site_factory):
    if failure == "refused":
        base = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
        site = None
    else:
        generate_site(tmp_path / "www", 5, 1)
        site = site_factory(tmp_path / "www", behaviour={"robots_status": {"127.0.0.1": 429}})
        base = site.url
    url = f"{base}site/p/0.html"
    started = time.monotonic()
    outs, logs = run_probe(2, [url], redis_url, worker_env, tmp_path,
                           {"FLEET_ROBOTSTXT_HOLD": 1, "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 3})
    elapsed = time.monotonic() - started
    # three attempts for the fleet, each by one worker, then the request failed: the crawl
    # ended by itself (idle close), with the reason in the errback and the dead letters
    assert total(logs, "fleet/politeness/robots_fetched") == 3
    # one request each (Scrapy's RetryMiddleware does not multiply them), and no page
    assert total(logs, "downloader/request_count") == 3
    assert total(logs, "fleet/politeness/robots_failed") == 3
    assert total(logs, "fleet/politeness/robots_hold") == 2  # sent back after attempts 1, 2
    assert total(logs, "fleet/politeness/robots_unreachable") == 1
    items = read_items(outs)
    assert [(i["url"], i["error"]) for i in items] == [(url, "RobotsTxtUnavailable")]
    origin = robots_origin(url)
    assert f"robots.txt of {origin} could not be fetched in 3 attempt(s)" in items[0]["message"]
    admin = FrontierAdmin(redis_url, "robots_probe")
    letters = list(admin.dead_letters())
    assert [codec.decode_dict(d["data"])["url"] for d in letters] == [url]
    assert letters[0]["reason"] == items[0]["message"]
    status = admin.status()
    assert (status["queued"], status["leased"], status["delayed"]) == (0, 0, 0)
    # logged once per origin, by the worker that gave up
    gave_up = sum(log.read_text().count("could not be fetched in 3 attempt(s)") for log in logs)
    assert gave_up == 1
    # waiting, nobody spins: frontier and politeness round trips stay a few per second per
    # worker (the bug made ~190 frontier calls a second)
    calls = total(logs, "fleet/redis/roundtrips") + total(logs, "fleet/politeness/redis_calls")
    assert calls / (2 * elapsed) < 25, (calls, elapsed)
    assert total(logs, "fleet/frontier/leased") == 3  # one lease per attempt, no more
    if site is not None:
        robots = sorted(r["t"] for r in site.requests() if r["path"] == "/robots.txt")
        assert len(robots) == 3
        gaps = [b - a for a, b in itertools.pairwise(robots)]
        # FLEET_ROBOTSTXT_HOLD * 2^(n-1): 1 s, then 2 s (a wait is never shorter)
        assert gaps[0] >= 0.95 and gaps[1] >= 1.95, gaps
        assert not [r for r in site.requests() if r["path"].startswith("/site/")]


@pytest.mark.slow
def test_robots_txt_is_per_origin_while_politeness_stays_per_host(
        redis_url, worker_env, tmp_path, site_factory):
    generate_site(tmp_path / "www", 20, 2, seed=3)
    www = tmp_path / "www"
    # three origins of one host (FLEET_HOST_KEY="host": one politeness key, 127.0.0.1)
    failing = site_factory(www, behaviour={"robots_status": {"127.0.0.1": 503}})
    one, two = (site_factory(www, behaviour={"robots": {
        "127.0.0.1": f"User-agent: *\nDisallow: /site/p/{n}\n"}}) for n in (1, 2))
    urls = [f"{failing.url}site/p/{i}.html" for i in range(3)]
    urls += [f"{site.url}site/p/{i}.html" for site in (one, two) for i in range(10)]
    outs, logs = run_probe(2, urls, redis_url, worker_env, tmp_path,
                           {"FLEET_ROBOTSTXT_HOLD": 6, "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 2,
                            "FLEET_HOST_KEY": "host"})
    failing_robots = sorted(r["t"] for r in failing.requests() if r["path"] == "/robots.txt")
    assert len(failing_robots) == 2  # two attempts, then given up
    assert failing_robots[1] - failing_robots[0] >= 5.95
    assert not [r for r in failing.requests() if r["path"] != "/robots.txt"]
    # each origin's robots.txt fetched once and its own rules applied to its own pages
    for site, forbidden in ((one, "/site/p/1.html"), (two, "/site/p/2.html")):
        paths = [r["path"] for r in site.requests()]
        assert paths.count("/robots.txt") == 1
        expected = {f"/site/p/{i}.html" for i in range(10)} - {forbidden}
        assert {p for p in paths if p != "/robots.txt"} == expected
        # not held back by the failing origin: done before its second robots.txt attempt
        assert max(r["t"] for r in site.requests()) < failing_robots[1]
    items = read_items(outs)
    failed = sorted(i["url"] for i in items if i.get("error") == "RobotsTxtUnavailable")
    assert failed == sorted(urls[:3])
    assert len([i for i in items if i.get("status") == 200]) == 18
    assert total(logs, "fleet/politeness/robots_unreachable") == 3
    letters = list(FrontierAdmin(redis_url, "robots_probe").dead_letters())
    assert len(letters) == 3
    assert all(robots_origin(failing.url) in d["reason"] for d in letters)


# -- the Lua parts ---------------------------------------------------------------------------


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
    admin.push([(bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, "a.test", 600)])
    assert admin.status()["delayed"] == 1
    assert admin.call(CallBatch(take=5), worker="w").leased == []
    time.sleep(0.7)
    leased = admin.call(CallBatch(take=5), worker="w").leased
    assert [codec.decode_dict(e.payload)["url"] for e in leased] == [url]


@pytest.mark.parametrize("value", [-1, 2.5, "many", True])
def test_max_attempts_setting_is_validated(value):
    with pytest.raises(FleetConfigError, match="FLEET_ROBOTSTXT_MAX_ATTEMPTS"):
        FleetConfig.from_settings(Settings({"FLEET_ROBOTSTXT_MAX_ATTEMPTS": value}))


def test_max_attempts_setting_default_and_zero():
    assert FleetConfig.from_settings(Settings()).robotstxt_max_attempts == 4
    assert FleetConfig.from_settings(
        Settings({"FLEET_ROBOTSTXT_MAX_ATTEMPTS": "0"})).robotstxt_max_attempts == 0
