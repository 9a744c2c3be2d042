"""The worker's cache of Bloom keys it knows are in the filter (frontier/dupecache.py, issue 12)
against a real redis-server: known duplicates left out of a call and still counted, the
filter's generation checked before any write, the cache forgotten after a purge, a new filter
or a rollback that lost the last call."""

from __future__ import annotations

import pytest
import redis
from support import link_entry as entry

from scrapy_fleet import lua
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams, call_args
from scrapy_fleet.keys.crawl import CrawlKeys


def admin_for(url: str, cache: int = 0, crawl: str = "s") -> FrontierAdmin:
    return FrontierAdmin(url, crawl, params=FrontierParams(), dupe_cache=cache)


def stat(admin: FrontierAdmin, name: str) -> int:
    return int(admin.client.hget(admin.keys.stats, name) or 0)


def test_known_duplicates_are_left_out_and_still_counted(redis_url):
    admin = admin_for(redis_url, cache=1000)
    first = admin.push([entry("http://h.test/a"), entry("http://h.test/b")])
    assert first.push_flags == [1, 1] and first.cached == 0
    assert len(admin.dupes) == 2 and admin.dupes.gen
    again = admin.push([entry("http://h.test/a"), entry("http://h.test/c"),
                        entry("http://h.test/b")])
    assert again.push_flags == [0, 1, 0]
    assert (again.pushed, again.duplicates, again.cached) == (1, 2, 2)
    assert again.seen == [0, 2]
    assert stat(admin, "duplicates") == 2  # the fleet-wide counter counts them too
    assert admin.status()["queued"] == 3


def test_known_duplicate_links_of_an_ack_do_not_park_it(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/seen")])
    leased = admin.call(CallBatch(take=1), worker="w").leased[0]
    result = admin.call(CallBatch(acks=[(leased.entry_id, leased.token)],
                                  pushes=[entry("http://h.test/seen", group=1)]), worker="w")
    assert (result.acked, result.parked, result.cached) == (1, 0, 1)
    assert admin.status()["size"] == 0


def test_cache_after_purge_pushes_the_url_again(redis_url):
    admin = admin_for(redis_url, cache=1000)
    admin.push([entry("http://h.test/a")])
    old_gen = admin.dupes.gen
    assert bloom_key(b"http://h.test/a") in admin.dupes
    other = admin_for(redis_url)
    assert other.purge() > 0
    result = admin.push([entry("http://h.test/a")])  # the cache still holds it
    assert result.push_flags == [1] and result.cached == 0
    assert admin.status()["queued"] == 1
    assert admin.dupes.gen and admin.dupes.gen != old_gen
    assert bloom_key(b"http://h.test/a") in admin.dupes


def test_stale_generation_is_refused_before_any_write(redis_url):
    admin = admin_for(redis_url)
    admin.push([entry("http://h.test/a")])
    leased = admin.call(CallBatch(take=1), worker="w").leased[0]
    script = lua.load(admin.client, "frontier.lua")
    batch = CallBatch(acks=[(leased.entry_id, leased.token)], pushes=[entry("http://h.test/x", 1)])
    arg = call_args(batch, "w", admin.params, left_out=3, gen="not-the-filter")
    with pytest.raises(redis.ResponseError, match="stale filter generation"):
        script(keys=admin.keys.frontier_keys("op1", "-"), args=[arg])
    status = admin.status()
    assert (status["leased"], status["queued"], status["seen"]) == (1, 0, 1)
    assert status["counters"].get("duplicates", 0) == 0


def test_worker_client_cache_after_a_new_filter_and_after_a_purge(redis_url):
    """The worker's asyncio client (AsyncFrontier, as FleetScheduler runs it): known links are
    left out; when the filter is replaced while the crawl goes on (its keys deleted, the crawl
    marker kept) the refused call is sent again in full; after a purge (the marker gone too)
    the call fails with CrawlStateLostError before any write, as any call of a worker does."""
    import asyncio

    from scrapy_fleet.errors import CrawlStateLostError
    from scrapy_fleet.frontier.client import AsyncFrontier

    keys = CrawlKeys("fleet", "async")

    async def run() -> tuple[list[int], int, list[int], int, int, int]:
        fr = AsyncFrontier(redis_url, keys, "w1", FrontierParams())
        try:
            await fr.call(CallBatch(pushes=[entry("http://h.test/a")]))
            known = await fr.call(CallBatch(pushes=[entry("http://h.test/a"),
                                                    entry("http://h.test/b")]))
            await fr.client.delete(keys.bloom_meta, keys.bloom_slice(0))  # a new filter
            after = await fr.call(CallBatch(pushes=[entry("http://h.test/a"),
                                                    entry("http://h.test/b")]))
            queued = int(await fr.client.get(keys.queue_count) or 0)
            FrontierAdmin(redis_url, "async").purge()
            with pytest.raises(CrawlStateLostError):
                await fr.call(CallBatch(pushes=[entry("http://h.test/a")]))
            left = int(await fr.client.get(keys.queue_count) or 0)
            return known.push_flags, known.cached, after.push_flags, after.cached, queued, left
        finally:
            await fr.close()

    known_flags, known_cached, after_flags, after_cached, queued, left = asyncio.run(run())
    assert (known_flags, known_cached) == ([0, 1], 1)
    # a and b again (the new filter knows neither), nothing lost to the cache
    assert (after_flags, after_cached, queued) == ([1, 1], 0, 4)
    assert left == 0  # the refused call wrote nothing


#: a commit of main before issue 12's port: its frontier.lua writes the previous format
#: (host in `ehost`, leases "token|score|worker", deferred members "id|score")
def test_cache_is_not_trusted_after_a_rollback_that_lost_the_last_call(redis_url):
    """A failover to a lagging replica: the crawl comes back as it was before the worker's
    last call (every key restored from a snapshot taken before it; same filter generation).
    The links that call added to the filter are in the worker's cache but no longer in the
    filter: the next call leaving them out is refused, sent again in full, and they are
    pushed again (a lost page would never be fetched)."""
    admin = admin_for(redis_url, cache=1000, crawl="rb")
    c = admin.client
    admin.push([entry("http://h.test/root")])
    snapshot = {key: c.dump(key) for key in c.scan_iter(match=admin.keys.pattern)}
    admin.push([entry("http://h.test/lost")])  # its writes are lost with the failover
    assert bloom_key(b"http://h.test/lost") in admin.dupes
    for key in c.scan_iter(match=admin.keys.pattern):
        c.delete(key)
    for key, value in snapshot.items():
        c.restore(key, 0, value)
    again = admin.push([entry("http://h.test/lost"), entry("http://h.test/root")])
    assert again.push_flags == [1, 0] and again.cached == 0
    assert admin.status()["queued"] == 2
    # and later calls trust what they learnt since
    known = admin.push([entry("http://h.test/lost")])
    assert (known.push_flags, known.cached) == ([0], 1)
