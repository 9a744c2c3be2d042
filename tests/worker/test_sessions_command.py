"""``scrapy-fleet sessions CRAWL`` (issue 32 item 6, commands/sessions.py) against a real
Redis whose pools were made by the workers' own code (sessions/pool.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import redis
import redis.asyncio

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions.pool import SessionPools, jar_name, pool_report
from scrapy_fleet.sessions.settings import SessionConfig

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]
KEYS = CrawlKeys("fleet", "shop")


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--redis", redis_url, *args], capture_output=True, text=True,
                          timeout=60)


def make_pools(redis_url: str) -> None:
    """Pool shop.test: 2 sessions logged in, one of them retired by a 403; its jar holds a
    cookie (never shown)."""
    async def body() -> None:
        pools = SessionPools(redis.asyncio.Redis.from_url(redis_url), KEYS,
                             SessionConfig(pool_size=2), login=True)
        try:
            for _ in range(2):
                s = await pools.draw("shop.test")
                await pools.claim(s.id, "w")
                await pools.done(s.id, "w", True)
            await pools.retire("shop.test-1", "status/403")
            await pools.draw("shop.test")
        finally:
            await pools.client.aclose()
    asyncio.run(body())
    redis.Redis.from_url(redis_url).hset(KEYS.cookie_jar(jar_name("shop.test-2")),
                                         "shop.test\t/\tsid", "0\t{\"v\": \"s3cr3t\"}")


def test_the_listing_shows_states_counters_and_no_cookie(redis_url):
    make_pools(redis_url)
    text = cli(redis_url, "sessions", "shop")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("pool shop.test: 2 drawable (1 active), 3 created, 2 logins, "
                               "0 failed checks; retired: status/403 1")
    assert [line.split()[:2] for line in lines[1:]] == [
        ["shop.test-1", "retired"], ["shop.test-2", "active"], ["shop.test-3", "new"]]
    as_json = json.loads(cli(redis_url, "sessions", "shop", "--json").stdout)
    assert as_json[0]["sessions"]["shop.test-1"]["reason"] == "status/403"
    assert "s3cr3t" not in text.stdout + json.dumps(as_json)
    pushed = cli(redis_url, "push", "shop", "http://shop.test/")  # a crawl to show
    assert pushed.returncode == 0, pushed.stderr
    status = cli(redis_url, "status", "shop")
    assert "  sessions shop.test 1/2 active, 2 logins, 1 retired" in status.stdout.splitlines()
    as_status = json.loads(cli(redis_url, "status", "shop", "--json").stdout)
    assert as_status["sessions"] == {"shop.test": {
        "active": 1, "drawable": 2, "logins": 2, "check_failed": 0,
        "retired": {"status/403": 1}}}


def test_retire_and_reset(redis_url):
    make_pools(redis_url)
    retired = cli(redis_url, "sessions", "shop", "--retire", "shop.test-2")
    assert (retired.returncode, retired.stdout) == (0, "session shop.test-2 retired\n")
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "shop.test")
    assert report["sessions"]["shop.test-2"]["reason"] == "manual"
    reset = cli(redis_url, "sessions", "shop", "--pool", "shop.test", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith("1 sessions retired (reason reset)")
    report = pool_report(redis.Redis.from_url(redis_url), KEYS, "shop.test")
    assert {r["state"] for r in report["sessions"].values()} == {"retired"}
    assert report["counters"]["retired:reset"] == 1
    assert redis.Redis.from_url(redis_url).zcard(KEYS.session_pool("shop.test")) == 0


def test_an_unknown_pool_or_session_is_one_line_and_status_1(redis_url):
    make_pools(redis_url)
    for args, message in (
            (["--pool", "other.test"], "error: crawl 'shop' has no session pool 'other.test' "
                                       "(pools: shop.test)"),
            (["--retire", "shop.test-9"], "error: no session 'shop.test-9' in crawl 'shop'"),
            (["--retire", "nonsense"], "error: 'nonsense' is not a session id "
                                       "(<pool>-<number>)")):
        out = cli(redis_url, "sessions", "shop", *args)
        assert (out.returncode, out.stderr.splitlines()) == (1, [message]), out.stderr
