"""The known duplicates of a partitioned crawl's foreign links (frontier/lean.py
LeanDestination, issue 21): a link for another partition that partition's filter is known to
hold is left out of the lean push (no Bloom lookup, no write), and after that partition lost
writes (a failover to a lagging replica: its keys restored from a snapshot taken before them)
the left-out link is pushed again and fetched, never lost to the cache."""

from __future__ import annotations

import asyncio

import redis
from support import hosts_in_partition, push_row

from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.frontier.routing import split_ref
from scrapy_fleet.keys.crawl import CrawlKeys

KEYS = CrawlKeys("fleet", "lc")
PARTS = 4


def calls(c: redis.Redis, name: str) -> int:
    """How many times the server ran *name* (INFO commandstats), scripts' commands included."""
    return int(c.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def snapshot(c: redis.Redis, keys: CrawlKeys) -> dict[bytes, bytes]:
    pattern = keys.pattern.replace("{", "\\{").replace("}", "\\}")
    return {k: c.dump(k) for k in c.scan_iter(match=pattern)}  # type: ignore[misc]


def restore(c: redis.Redis, keys: CrawlKeys, snap: dict[bytes, bytes]) -> None:
    for k in snapshot(c, keys):
        c.delete(k)
    for k, v in snap.items():
        c.restore(k, 0, v)


def test_a_known_foreign_duplicate_is_left_out_and_pushed_again_after_a_rollback(redis_url):
    a1, a2, a3 = hosts_in_partition(0, PARTS, 3)
    b, far = hosts_in_partition(3, PARTS, 2)
    p3 = KEYS.partition(3, PARTS)
    c = redis.Redis.from_url(redis_url)
    link = push_row(far, b"far", 1)  # the foreign link every page of partition 0 finds

    async def main() -> None:
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), PARTS,
                                 dupe_cache=800)
        try:
            fr.home = 0
            await fr.call(CallBatch(pushes=[push_row(h) for h in (a1, a2, a3, b)]))
            pages = {e.payload: e for e in (await fr.call(CallBatch(take=3))).leased}
            assert sorted(pages) == [a1.encode(), a2.encode(), a3.encode()]
            before = snapshot(c, p3)  # partition 3 as a lagging replica holds it

            def ack(host: str) -> CallBatch:
                e = pages[host.encode()]
                return CallBatch(acks=[(e.entry_id, e.token)], pushes=[link])

            r = await fr.call(ack(a1))
            assert (r.acked, r.push_flags, fr.foreign_calls) == (1, [1], 1)
            # the same link from the next page: known, left out (no Bloom lookup, no write)
            lookups, writes = calls(c, "getrange"), calls(c, "bitfield")
            r = await fr.call(ack(a2))
            assert (r.acked, r.push_flags, r.duplicates, r.cached) == (1, [0], 1, 1)
            assert fr.lean_dests[3].dupes.hits == 1 and fr.foreign_calls == 2
            assert (calls(c, "getrange"), calls(c, "bitfield")) == (lookups, writes)
            assert c.hget(p3.stats, "duplicates") == b"1" and int(c.get(p3.queue_count)) == 2
            # partition 3 fails over to a replica that lacked both lean pushes: the link is
            # no longer in its filter nor in its queue (same marker, same filter generation)
            restore(c, p3, before)
            assert int(c.get(p3.queue_count)) == 1
            r = await fr.call(ack(a3))
            # refused (its evidence, the previous lean call's reply cache, is gone), the cache
            # of partition 3 cleared, the push sent again whole: the link is new again
            assert (r.acked, r.push_flags) == (1, [1])
            assert fr.lean_dests[3].sent == 4 and fr.lean_dests[3].dupes.hits == 1
            assert int(c.get(p3.queue_count)) == 2
            fr.home = 3
            got = (await fr.call(CallBatch(take=5))).leased
            assert sorted(e.payload for e in got) == sorted([b.encode(), b"far"])
            assert {split_ref(e.entry_id)[0] for e in got} == {3}
        finally:
            await fr.close()

    try:
        asyncio.run(main())
    finally:
        c.close()


def test_the_cache_is_bounded_by_the_setting_over_both_kinds_of_calls(redis_url):
    """FLEET_DUPEFILTER_CACHE: half to the partitions' frontier clients (their own pages'
    links), half to the lean pushes' destinations (foreign links), 1/P of each half each."""
    fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), PARTS, dupe_cache=800)
    sizes = ([f.dupes.size for f in fr.fronts], [d.dupes.size for d in fr.lean_dests])
    asyncio.run(fr.close())
    assert sizes == ([100] * PARTS, [100] * PARTS)
