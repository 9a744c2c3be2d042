"""A crawl written by an older layout of the keys is refused at start, never migrated.

The old crawl is built by hand in a real redis-server from what the previous layout wrote
(layout 1, before the ``layout`` key: queued entries as members "<host>\\t<priority key>\\t<id>"
of the ``queue`` ZSET with the request in ``data``, the entry's host in ``ehost``, leases
"token|score|worker"); a worker (``scrapy crawl``), the push helper, ``retry`` and the
frontier clients each refuse it with one line that says what to do, and write nothing; after
``scrapy fleet purge`` the crawl starts afresh with the current layout.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from scrapy import Request
from support import TEST_PROJECT, run_scrapy

from scrapy_fleet import codec
from scrapy_fleet.failures import admin as failures_admin
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.layout import CrawlLayoutError
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys

TIMEOUT = 60.0


def old_crawl(client: redis.Redis, keys: CrawlKeys) -> dict[bytes, bytes]:
    """Keys of a layout-1 crawl, as the previous frontier.lua left them: two queued entries
    (one of priority 1), one leased by worker "w" and one deferred; returns a DUMP of every key
    (to show that a refusal writes nothing)."""
    base = keys.base
    payload = codec.encode(Request("http://a.test/1"))
    client.zadd(f"{base}:queue", {f"a.test\t{10**15:016d}\t000000000000001": 0,
                                  f"a.test\t{10**15 - 1:016d}\t000000000000002": 0})
    client.hset(keys.data, mapping={f"{i:015d}": payload for i in range(1, 5)})
    client.hset(f"{base}:ehost", mapping={f"{i:015d}": "a.test" for i in range(1, 5)})
    client.hset(keys.lease, "000000000000003", "41|0|w")
    client.zadd(keys.leases, {"000000000000003": 10**13})
    client.zadd(keys.deferred, {"000000000000004|0": 10**13})
    client.hset(keys.hostq, "a.test", 4)
    client.zadd(keys.ready, {"a.test": 0})
    client.set(keys.seq, 4)
    client.set(keys.token, 41)
    client.set(keys.marker, "0123456789abcdef")
    client.hset(keys.stats, mapping={"pushed": 4, "leased": 1})
    return dump(client, keys)


def dump(client: redis.Redis, keys: CrawlKeys) -> dict[bytes, bytes]:
    return {k: client.dump(k) for k in sorted(client.scan_iter(match=keys.pattern))}


def test_a_crawl_of_the_previous_layout_is_refused_by_every_frontier_client(redis_url):
    admin = FrontierAdmin(redis_url, "old1")
    c, k = admin.client, admin.keys
    before = old_crawl(c, k)
    with pytest.raises(CrawlLayoutError) as refused:
        admin.call(CallBatch(take=1), worker="w")
    text = str(refused.value)
    assert text == (f"crawl 'old1' in Redis was written by another version of scrapy-fleet (no "
                    f"layout version; this version reads layout {LAYOUT_VERSION}): finish it "
                    "with the version that started it, or delete it with `scrapy fleet purge`")
    with pytest.raises(CrawlLayoutError):
        FrontierAdmin(redis_url, "old1").push([(b"k" * 12, 0, b"x", 0, "a.test")])
    with pytest.raises(CrawlLayoutError):
        failures_admin.retry(c, k, redis_url)

    async def connect() -> None:
        frontier = AsyncFrontier(redis_url, k, "w", FrontierParams())
        try:
            await frontier.connect()
        finally:
            await frontier.close()

    with pytest.raises(CrawlLayoutError):
        asyncio.run(connect())
    assert dump(c, k) == before  # nothing written, nothing moved


def test_a_crawl_of_another_layout_version_is_refused_and_a_new_one_gets_the_version(redis_url):
    admin = FrontierAdmin(redis_url, "fresh")
    c, k = admin.client, admin.keys
    assert admin.push([(b"k" * 12, 0, b"x", 0, "a.test")]).pushed == 1
    assert c.get(k.layout) == str(LAYOUT_VERSION).encode()  # written with the marker
    c.set(k.layout, LAYOUT_VERSION + 1)  # a later version wrote this crawl
    with pytest.raises(CrawlLayoutError, match=f"layout version {LAYOUT_VERSION + 1}; "):
        FrontierAdmin(redis_url, "fresh").call(CallBatch(take=1), worker="w")
    c.set(k.layout, LAYOUT_VERSION)
    leased = FrontierAdmin(redis_url, "fresh").call(CallBatch(take=1), worker="w").leased
    assert len(leased) == 1


def test_a_worker_and_push_refuse_an_old_crawl_in_one_line_and_purge_starts_it_afresh(
        site_factory, tmp_path, worker_env, redis_url):
    from testsite import generate_site

    generate_site(tmp_path / "www", 3, 1)
    site = site_factory(tmp_path / "www")
    site.start_path = "/site/"
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "starts")
    before = old_crawl(client, keys)
    settings = ["-s", f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_IDLE_TIMEOUT=1"]
    result = run_scrapy(TEST_PROJECT, ["crawl", "starts", "-a", f"start={site.start_url}",
                                       "-L", "INFO", *settings], worker_env, timeout=TIMEOUT)
    out = result.stderr + result.stdout
    assert result.returncode == 1, out
    errors = [line for line in out.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, out
    assert "Fleet worker cannot start: crawl 'starts' in Redis was written by another version" \
        in errors[0], out
    assert "or delete it with `scrapy fleet purge`" in errors[0], out
    assert "Traceback" not in out and site.requests() == []
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "starts", "http://a.test/2", *settings],
                        worker_env, timeout=TIMEOUT)
    assert pushed.returncode != 0
    assert pushed.stderr.strip().splitlines()[-1].startswith(
        "error: crawl 'starts' in Redis was written by another version"), pushed.stderr
    assert dump(client, keys) == before
    purged = run_scrapy(TEST_PROJECT, ["fleet", "purge", "starts", "--yes", *settings],
                        worker_env, timeout=TIMEOUT)
    assert purged.returncode == 0, purged.stderr + purged.stdout
    again = run_scrapy(TEST_PROJECT, ["fleet", "push", "starts", "http://a.test/2", *settings],
                       worker_env, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr + again.stdout
    assert client.get(keys.layout) == str(LAYOUT_VERSION).encode()
    assert not client.exists(*keys.layout1_keys())


class _FirstCallDuringCheck:
    """A real client whose EXISTS runs just after another worker's first frontier call: the
    interleaving of two workers starting one new crawl at the same moment (the other's call
    writes the marker and the layout between this check's GET and EXISTS)."""

    def __init__(self, client: redis.Redis, other_call) -> None:
        self.client, self.other_call = client, other_call

    def get(self, name: str) -> bytes | None:
        return self.client.get(name)

    def exists(self, *names: str) -> int:
        self.other_call()
        return self.client.exists(*names)


def test_a_new_crawl_started_by_two_workers_at_once_is_not_refused(redis_url):
    from scrapy_fleet.frontier import layout

    one, two = FrontierAdmin(redis_url, "race"), FrontierAdmin(redis_url, "race")
    racing = _FirstCallDuringCheck(two.client, lambda: one.call(CallBatch(), worker="w1:1:1"))
    layout.check_sync(racing, two.keys)  # the crawl is new: not "another version"
    assert two.client.get(two.keys.layout) == str(LAYOUT_VERSION).encode()
    two.call(CallBatch(), worker="w2:1:1")
    one.close()
    two.close()
