"""PartitionedFrontier (issue 21) against a real Redis server: routing by the lease's
partition, push before ack, a refused foreign push deferring its page."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from support import hosts_in_partition, partition_user, push_row

from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.frontier.routing import partition_params, split_ref
from scrapy_fleet.keys.crawl import CrawlKeys

KEYS = CrawlKeys("fleet", "pf")


def run(coro):
    return asyncio.run(coro)


def test_the_crawl_bound_is_split_over_partitions():
    assert partition_params(FrontierParams(queue_max=10), 4).queue_max == 3
    assert partition_params(FrontierParams(queue_max=None), 4).queue_max is None
    assert partition_params(FrontierParams(queue_max=10, host_queue_max=5),
                            1).queue_max == 10


def test_leases_acks_and_links_go_to_their_partitions(redis_url):
    parts = 4
    a, b = hosts_in_partition(0, parts)[0], hosts_in_partition(3, parts)[0]

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts)
        try:
            await fr.connect()
            r = await fr.call(CallBatch(pushes=[push_row(a), push_row(b)]))
            assert r.push_flags == [1, 1] and r.refused == []
            fr.home = 3
            got = (await fr.call(CallBatch(take=5))).leased
            assert [split_ref(e.entry_id)[0] for e in got] == [3] and got[0].payload == b.encode()
            e = got[0]
            # its links: one for its own partition (with the ack), one for partition 0 (before)
            batch = CallBatch(acks=[(e.entry_id, e.token)],
                              pushes=[push_row(b, b"own", 1), push_row(a, b"far", 1)])
            r = await fr.call(batch)
            assert r.acked == 1 and r.push_flags == [1, 1] and fr.foreign_calls == 1
            # a stale token: the lost lease is named with its partition
            r = await fr.call(CallBatch(acks=[(e.entry_id, e.token)]))
            assert r.lost == [e.entry_id]
        finally:
            await fr.close()
    run(main())
    c = redis.Redis.from_url(redis_url)
    p0, p3 = KEYS.partition(0, parts), KEYS.partition(3, parts)
    assert int(c.get(p0.queue_count)) == 2 and int(c.get(p3.queue_count)) == 1
    assert c.hget(p3.stats, "acked") == b"1" and c.hget(p3.stats, "stale_acks") == b"1"
    assert c.hget(p0.stats, "pushed") == b"2"  # one by the push, one foreign link
    assert not c.exists(KEYS.queue_count)


def test_a_refused_foreign_link_defers_its_page_and_nothing_is_lost(redis_url):
    """Partition 0 is full (FLEET_QUEUE_MAX split 2 ways: 1 each): the link a page of
    partition 1 found for it is refused there, so the page is not acknowledged but deferred;
    once partition 0 has room the page is fetched again and its link gets in."""
    parts = 2
    a0, a1 = hosts_in_partition(0, parts, 2)
    b = hosts_in_partition(1, parts)[0]
    params = FrontierParams(queue_max=2, defer_delay=0.3)
    c = redis.Redis.from_url(redis_url)
    p0, p1 = KEYS.partition(0, parts), KEYS.partition(1, parts)

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", params, parts)
        try:
            await fr.connect()
            r = await fr.call(CallBatch(pushes=[push_row(a0, b"filler"), push_row(b, b"page")]))
            assert r.push_flags == [1, 1]
            fr.home = 1
            page = (await fr.call(CallBatch(take=1))).leased[0]
            link = push_row(a1, b"link", 1)
            r = await fr.call(CallBatch(acks=[(page.entry_id, page.token)], pushes=[link]))
            assert r.acked == 0 and r.deferred == 1 and r.push_flags == [0]
            assert fr.deferred_parents == 1
            assert c.zcard(p1.deferred) == 1 and int(c.get(p0.queue_count)) == 1
            # partition 0 gets room: its filler is fetched and acknowledged
            fr.home = 0
            filler = (await fr.call(CallBatch(take=1))).leased[0]
            assert filler.payload == b"filler"
            assert (await fr.call(CallBatch(acks=[(filler.entry_id, filler.token)]))).acked == 1
            # the deferred page comes back, and this time its link is taken
            fr.home = 1
            again = []
            deadline = time.monotonic() + 10
            while not again and time.monotonic() < deadline:
                again = (await fr.call(CallBatch(take=1))).leased
                await asyncio.sleep(0.1)
            assert again and again[0].payload == b"page"
            page = again[0]
            r = await fr.call(CallBatch(acks=[(page.entry_id, page.token)], pushes=[link]))
            assert r.acked == 1 and r.push_flags == [1]
        finally:
            await fr.close()
    run(main())
    assert int(c.get(p0.queue_count)) == 1
    assert c.hget(p1.stats, "deferred") == b"1" and c.hget(p1.stats, "acked") == b"1"
    assert c.hget(p0.stats, "refused") == b"1"


def test_fleet_idle_needs_every_partition_idle(redis_url):
    parts = 3
    b = hosts_in_partition(2, parts)[0]

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts,
                                 idle_timeout=0.2)
        try:
            await fr.connect()
            await fr.call(CallBatch(pushes=[push_row(b)]))
            fr.home = 0
            r = await fr.call(CallBatch(beat=True))
            assert 0 <= r.idle_ms < 200  # partition 0's own clock starts
            await asyncio.sleep(0.5)
            r = await fr.call(CallBatch(beat=True))
            assert r.idle_ms == -1  # partition 0 idle long enough, but partition 2 holds one
            fr.home = 2
            e = (await fr.call(CallBatch(take=1))).leased[0]
            await fr.call(CallBatch(acks=[(e.entry_id, e.token)]))
            fr.home = 0
            r = await fr.call(CallBatch(beat=True))
            assert r.idle_ms == -1 or r.idle_ms < 200  # partition 2 only just became idle
            await asyncio.sleep(0.5)
            r = await fr.call(CallBatch(beat=True))
            assert r.idle_ms >= 200
        finally:
            await fr.close()
    run(main())


@pytest.mark.parametrize("parts", [1])
def test_no_partitions_key_for_one_partition(redis_url, parts):
    from scrapy_fleet.frontier.partition_count import check_sync

    c = redis.Redis.from_url(redis_url)
    check_sync(c, KEYS, parts)
    assert c.keys("*") == []


def test_an_unreachable_partition_holds_its_part_and_the_others_go_on(redis_server,
                                                                      redis_url):
    """Partition 1 refuses this client (an ACL without its keys, standing for a master being
    failed over): partition 0 keeps leasing and acknowledging; a page whose link is for
    partition 1 is held, not acknowledged, and so is a push for it; once partition 1 answers,
    what was held goes through and nothing is lost."""
    parts = 2
    a0, a1 = hosts_in_partition(0, parts, 2)
    b = hosts_in_partition(1, parts)[0]
    c = redis.Redis.from_url(redis_url)
    p1 = KEYS.partition(1, parts)

    async def main():
        fr = PartitionedFrontier(url, KEYS, "w", FrontierParams(), parts)
        try:
            fr.home = 0
            r = await fr.call(CallBatch(pushes=[push_row(a0, b"page"), push_row(b, b"orphan")],
                                        take=1))
            assert r.push_flags == [1, 0] and r.refused == [] and fr.held == 1
            (page,) = r.leased
            # (a call none of whose parts gets through raises, for the pump to retry it)
            batch = CallBatch(acks=[(page.entry_id, page.token)],
                              pushes=[push_row(a1, b"local", 1), push_row(b, b"far", 1)])
            with pytest.raises(redis.ResponseError):
                await fr.call(batch)
            assert fr.held == 1
            batch.take = 1  # with a part for partition 0, the call goes through
            r = await fr.call(batch)
            assert r.acked == 0 and fr.held == 4  # the orphan, the page and its two links
            # partition 0 goes on meanwhile
            fr.home = 0
            r = await fr.call(CallBatch(pushes=[push_row(a1, b"more")], take=1))
            assert r.push_flags == [1] and r.leased
            more = r.leased[0]
            r = await fr.call(CallBatch(acks=[(more.entry_id, more.token)]))
            assert r.acked == 1 and fr.held == 4
            # partition 1 answers again: what was held goes through
            reach(p1.base)
            r = await fr.call(CallBatch(beat=True))
            assert r.acked == 1 and fr.held == 0
        finally:
            await fr.close()
    with partition_user(redis_server, "pf", KEYS.partition(0, parts).base) as (url, reach):
        run(main())
    queued1 = sorted(c.hvals(p1.data)) + [e.split(b"\t", 1)[1] for k in c.keys(
        p1.bucket_prefix.replace("{", "\\{").replace("}", "\\}") + "*")
        for e in c.lrange(k, 0, -1)]
    assert sorted(queued1) == [b"far", b"orphan"]
    p0 = KEYS.partition(0, parts)
    assert c.hget(p0.stats, "acked") == b"2"


def test_each_partition_leaves_out_the_duplicates_it_knows(redis_url):
    """FLEET_DUPEFILTER_CACHE split over the partitions: a link of a page that its partition
    already holds is left out of the next call (counted as cached), not sent again."""
    parts = 2
    a, a2 = hosts_in_partition(0, parts, 2)

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts,
                                 dupe_cache=1000)
        try:
            fr.home = 0
            link = push_row(a2, b"link", 1)
            await fr.call(CallBatch(pushes=[push_row(a, b"p1"), push_row(a, b"p2")]))
            p1, p2 = (await fr.call(CallBatch(take=2))).leased
            r = await fr.call(CallBatch(acks=[(p1.entry_id, p1.token)], pushes=[link]))
            assert r.push_flags == [1] and r.cached == 0
            r = await fr.call(CallBatch(acks=[(p2.entry_id, p2.token)], pushes=[link]))
            assert r.acked == 1 and r.push_flags == [0] and r.cached == 1
        finally:
            await fr.close()
    run(main())


def leased_count(c, keys):
    return c.zcard(keys.leases)


def test_foreign_links_wait_in_a_buffer_per_partition_with_their_pages(redis_url):
    """FLEET_PARTITION_FLUSH: a page's links for another partition are buffered (the page is
    not acknowledged meanwhile, its lease stays in its partition); the buffer goes at
    FLUSH_LINKS links, once its oldest link waited FLEET_PARTITION_FLUSH, or at close
    (flush_now); a link a partition took is not pushed again while its page waits for
    another partition's buffer."""
    from scrapy_fleet.frontier.partitions import FLUSH_LINKS

    parts = 4
    home = hosts_in_partition(3, parts)[0]
    far0 = hosts_in_partition(0, parts, 3)
    far1 = hosts_in_partition(1, parts)[0]
    c = redis.Redis.from_url(redis_url)
    p0, p1, p3 = (KEYS.partition(p, parts) for p in (0, 1, 3))

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts,
                                 flush_age=0.4)
        try:
            await fr.connect()
            await fr.call(CallBatch(pushes=[push_row(home, f"page{i}".encode()) for i in range(4)]))
            fr.home = 3
            pages = (await fr.call(CallBatch(take=4))).leased
            assert len(pages) == 4 and fr.flush_in() is None
            a, b, d, e = pages
            # page a: one link for partition 0, one for its own: both wait with the page
            r = await fr.call(CallBatch(acks=[(a.entry_id, a.token)],
                                        pushes=[push_row(far0[0], b"a0", 1),
                                                push_row(home, b"a3", 1)]))
            assert r.acked == 0 and fr.foreign_calls == 0 and fr.held == 3
            assert 0 < fr.flush_in() <= 0.4
            assert leased_count(c, p3) == 4 and not c.exists(p0.queue_count)
            # page b: FLUSH_LINKS - 1 links for partition 0 (due: 100 buffered) and one for
            # partition 1 (not due): partition 0's buffer goes, page a is acknowledged, page b
            # waits for partition 1
            links = [push_row(far0[i % 3], f"b{i}".encode(), 1) for i in range(FLUSH_LINKS - 1)]
            r = await fr.call(CallBatch(acks=[(b.entry_id, b.token)],
                                        pushes=[*links, push_row(far1, b"b1", 1)]))
            assert fr.foreign_calls == 1 and r.acked == 1 and r.pushed == FLUSH_LINKS + 1
            assert int(c.get(p0.queue_count)) == FLUSH_LINKS and not c.exists(p1.queue_count)
            assert fr.held == 2  # page b and its link for partition 1 (not its 99 others)
            # the age bound: partition 1's buffer is due after 0.4 s
            await asyncio.sleep(0.5)
            assert fr.flush_in() == 0
            r = await fr.call(CallBatch())
            assert r.acked == 1 and r.pushed == 1 and r.duplicates == 0
            assert fr.foreign_calls == 2 and fr.held == 0 and fr.flush_in() is None
            # at close: flush_now makes every buffer due at once
            r = await fr.call(CallBatch(acks=[(d.entry_id, d.token), (e.entry_id, e.token)],
                                        pushes=[push_row(far1, b"d1", 1),
                                                push_row(far0[1], b"e0", 2)]))
            assert r.acked == 0 and fr.held == 4
            fr.flush_now()
            assert fr.flush_in() == 0
            r = await fr.call(CallBatch())
            assert r.acked == 2 and r.pushed == 2 and fr.foreign_calls == 4
        finally:
            await fr.close()
    run(main())
    assert int(c.get(p0.queue_count)) == FLUSH_LINKS + 1 and int(c.get(p1.queue_count)) == 2
    assert c.hget(p3.stats, "acked") == b"4" and leased_count(c, p3) == 0
    assert c.hget(p0.stats, "duplicates") is None and c.hget(p1.stats, "duplicates") is None


def test_a_page_waiting_for_an_unreachable_partition_keeps_its_lease(redis_server, redis_url):
    """A page whose link is for a partition that cannot be reached waits here, outside the
    pump's book: the heartbeat's extends keep its lease (in its own partition) alive past
    FLEET_LEASE_TIMEOUT, so no other worker leases it meanwhile; once the partition answers,
    the page is acknowledged once, having been leased once."""
    parts = 2
    a = hosts_in_partition(0, parts)[0]
    b = hosts_in_partition(1, parts)[0]
    c = redis.Redis.from_url(redis_url)
    p0, p1 = KEYS.partition(0, parts), KEYS.partition(1, parts)
    params = FrontierParams(lease_timeout=1.0)

    async def main():
        fr = PartitionedFrontier(url, KEYS, "w", params, parts)
        other = PartitionedFrontier(redis_url, KEYS, "w2", params, parts)
        try:
            fr.home = 0
            r = await fr.call(CallBatch(pushes=[push_row(a, b"page")], take=1))
            (page,) = r.leased
            r = await fr.call(CallBatch(acks=[(page.entry_id, page.token)],
                                        pushes=[push_row(b, b"far", 1)], beat=True))
            assert r.acked == 0 and fr.held == 2
            # three lease timeouts, with a heartbeat every third of one (as the pump)
            for _ in range(9):
                await asyncio.sleep(params.lease_timeout / 3)
                r = await fr.call(CallBatch(beat=True))
                assert r.lost == [] and fr.held == 2
                other.home = 0
                r = await other.call(CallBatch(take=1))
                assert r.leased == [] and r.reclaimed == 0
            reach(p1.base)
            r = await fr.call(CallBatch(beat=True))
            assert r.acked == 1 and r.lost == [] and fr.held == 0
        finally:
            await fr.close()
            await other.close()
    with partition_user(redis_server, "pf", KEYS.partition(0, parts).base) as (url, reach):
        run(main())
    assert c.hget(p0.stats, "acked") == b"1"
    assert c.hget(p0.stats, "reclaimed") is None and leased_count(c, p0) == 0
    assert c.zcard(p1.leases) == 0 and int(c.get(p1.queue_count)) == 1


def lease_loop(fr, take, ack_each=True, calls=200):
    """Drive *fr* as the pump does: each call acknowledges (with its download notice) what
    the previous one leased and asks for *take* more, until a call leases nothing while
    nothing is held.  Returns the leases of each call, in order."""
    async def go():
        out, held = [], []
        for _ in range(calls):
            batch = CallBatch(take=take,
                              acks=[(e.entry_id, e.token) for e in held] if ack_each else [],
                              downloaded=[(e.entry_id, e.token) for e in held])
            r = await fr.call(batch)
            out.append((r.leased, r.next_ready))
            held = r.leased if ack_each else held + r.leased
            if not r.leased and not held and r.next_ready != 0.0:
                break
        return out
    return go()


def test_work_in_one_non_home_partition_is_leased_without_a_sweep(redis_url):
    """The work all in one partition of 8, not the worker's home (bench_throughput on one
    host: a P = 8 worker at a quarter of P = 1's pages/s).  The worker's lease requests that
    get nothing: the first (its home, the only one it asks while it knows nothing), and it
    is told to call again at once; after that every call leases, from that partition; the
    other partitions get one lease request each (a discovery) while the 40 pages are
    leased.  (A worker that moved its home on at each empty request made 7 empty calls in a
    row before each run of leases.)"""
    parts = 8
    host = hosts_in_partition(5, parts)[0]
    n = 40

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts)
        try:
            await fr.call(CallBatch(pushes=[push_row(host, b"p%d" % i) for i in range(n)]))
            fr.home = 6
            calls = await lease_loop(fr, 4)
            counts = fr.partition_counts()
        finally:
            await fr.close()
        return calls, counts
    calls, counts = run(main())
    leased = [e for got, _ in calls for e in got]
    assert sorted(e.payload for e in leased) == sorted(b"p%d" % i for i in range(n))
    assert {split_ref(e.entry_id)[0] for e in leased} == {5}
    empty = [i for i, (got, _) in enumerate(calls) if not got]
    # the first call (home only), and at the end, once partition 5 is drained, one to
    # ask the partitions never asked (at once), which have nothing either
    last = max(i for i, (got, _) in enumerate(calls) if got)
    assert empty == [0, last + 1, last + 2] and len(calls) == last + 3
    assert calls[0][1] == 0.0  # partition 5 holds due work: again at once
    assert calls[-1][1] != 0.0  # nothing due anywhere: the pump waits its poll interval
    # partition-level: the home's empty request, one discovery request to each other
    # partition, and the last call's requests (nothing left): at most 2 per partition
    assert counts["empty_lease_calls"] <= 2 * parts
    assert counts["lease_calls_by_partition"][5] >= n // 4


def test_a_capped_partition_is_asked_with_each_download_notice(redis_url):
    """A host capped at 2 requests in flight, its partition not the worker's home: each
    call carrying a download notice of that partition (a slot freed) asks it for leases in
    the same call, and gets one, until its queue is empty; a call that frees nothing does
    not ask it again (its hosts are at their cap: no request to it is made for nothing)."""
    parts = 8
    host = hosts_in_partition(5, parts)[0]
    n = 12
    params = FrontierParams(host_concurrency=2)

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", params, parts)
        try:
            await fr.call(CallBatch(pushes=[push_row(host, b"c%d" % i) for i in range(n)]))
            fr.home = 6
            assert (await fr.call(CallBatch(take=4))).leased == []  # the home: nothing
            held = (await fr.call(CallBatch(take=4))).leased
            assert len(held) == 2  # the cap
            before = fr.partition_counts()["lease_calls_by_partition"][5]
            r = await fr.call(CallBatch(take=2))  # nothing freed
            assert r.leased == []
            assert fr.partition_counts()["lease_calls_by_partition"][5] == before
            got = 2
            while got < n:
                done, held = held[0], held[1:]
                r = await fr.call(CallBatch(acks=[(done.entry_id, done.token)],
                                            downloaded=[(done.entry_id, done.token)],
                                            take=2))
                assert len(r.leased) == 1, got  # the freed slot, at once
                assert split_ref(r.leased[0].entry_id)[0] == 5
                held += r.leased
                got += 1
        finally:
            await fr.close()
    run(main())


def test_a_capped_partition_is_asked_with_download_notices_that_would_be_held(redis_url):
    """FLEET_PARTITION_FLUSH 0.5 s (a part for a partition the call does not reach waits for
    its next call), a host capped at 2 requests in flight, its partition not the worker's
    home, the home empty.  While that partition holds work, a call carrying one of its
    download notices asks it for leases (its held part goes with it) and gets the freed slot
    at once; a call carrying only an acknowledgement of it asks neither it nor the empty
    home (the work known is at its cap) and holds the acknowledgement for the next call
    there.  Held, the notices waited for the flush while each call asked the empty home:
    0.26 empty lease calls per page, one host, P = 8 (bench/README.md)."""
    parts, home, work = 8, 6, 5
    host = hosts_in_partition(work, parts)[0]
    n = 12
    params = FrontierParams(host_concurrency=2)

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", params, parts, flush_age=0.5)
        asked = lambda p: fr.partition_counts()["lease_calls_by_partition"][p]  # noqa: E731
        try:
            await fr.call(CallBatch(pushes=[push_row(host, b"h%d" % i) for i in range(n)]))
            fr.home = home
            assert (await fr.call(CallBatch(take=4))).leased == []  # the home: nothing
            held = (await fr.call(CallBatch(take=4))).leased  # where the push went
            assert len(held) == 2  # the cap
            got, acked, drained = 2, 0, None
            while held:
                done, held = held[0], held[1:]
                ref = [(done.entry_id, done.token)]
                before = asked(work)
                r = await fr.call(CallBatch(downloaded=ref, take=2))
                if got < n:
                    assert len(r.leased) == 1 and asked(work) == before + 1, got
                got += len(r.leased)
                if got == n and drained is None:  # (the counts while it held work)
                    drained = fr.partition_counts()
                held += r.leased
                acked += r.acked
                before = asked(work)
                r = await fr.call(CallBatch(acks=ref, take=2))
                if got < n:
                    assert r.leased == [] and r.acked == 0  # held for the next call there
                    assert asked(work) == before
                acked += r.acked
            fr.flush_now()
            acked += (await fr.call(CallBatch())).acked
            counts = fr.partition_counts()
        finally:
            await fr.close()
        return got, acked, drained, counts
    got, acked, drained, counts = run(main())
    assert got == n and acked == n
    assert counts["leased_by_partition"][work] == n
    # while partition 5 held work: the others were asked once each (never asked yet, while
    # the work was capped: a discovery) and one of them, or the home, once each 2 P lease
    # requests (not seen that long); no lease call got nothing there
    probes = 1 + drained["lease_calls"] // (2 * parts)
    calls = drained["lease_calls_by_partition"]
    assert calls[home] <= 1 + probes, drained
    assert sum(calls[p] for p in range(parts) if p not in (work, home)) <= parts - 2 + probes
    assert drained["empty_lease_calls_by_partition"][work] == 0, drained
    # the calls with only an acknowledgement (n - 3 of them by then) that asked nobody:
    # all but those discovering (two partitions each) or probing
    skipped = drained["skipped_lease_requests"]
    assert skipped >= n - 3 - (parts - 2) // 2 - probes, drained


def test_a_worker_takes_from_every_partition_with_work_home_first(redis_url):
    """Work in the home partition and in three others: while the home hands out what it is
    asked, every lease request goes to it alone (each worker prefers its own partition);
    once it comes back short, the requests are split over the three others, each of which
    hands out leases, and a call never leases more than it asked."""
    parts = 8
    home = 6
    others = [1, 3, 5]
    hosts = {p: hosts_in_partition(p, parts, 3) for p in [home, *others]}
    per = {home: 6, 1: 5, 3: 5, 5: 5}

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts)
        try:
            await fr.call(CallBatch(pushes=[
                push_row(hosts[p][i % 3], b"%d-%d" % (p, i)) for p, k in per.items()
                for i in range(k)]))
            fr.home = home
            calls = await lease_loop(fr, 3, ack_each=False)
        finally:
            await fr.close()
        return calls
    calls = run(main())
    parts_of = [[split_ref(e.entry_id)[0] for e in got] for got, _ in calls]
    assert all(len(x) <= 3 for x in parts_of)
    assert parts_of[0] == [home] * 3 and parts_of[1] == [home] * 3
    later = [p for x in parts_of[2:] for p in x]
    assert set(later) == set(others)
    assert sorted(p for x in parts_of for p in x) == sorted(
        p for p, k in per.items() for _ in range(k))


def test_leasing_elsewhere_does_not_call_the_home_for_the_monitoring_alone(redis_url):
    """The monitoring goes with a call to the home partition.  A call asking for work that
    is in another partition, with no heartbeat due, does not call the home for it alone (a
    second frontier call per pump call: twice the Redis calls of P = 1 on one host): its
    deltas are kept (``monitor_confirmed`` False: the pump sends them again); a heartbeat, or a
    call asking for no lease (the final one), calls the home with them."""
    from support import monitor_payload

    parts = 8
    host = hosts_in_partition(5, parts)[0]
    mon = monitor_payload(cs=1, counters={"pages": 1})

    async def main():
        fr = PartitionedFrontier(redis_url, KEYS, "w", FrontierParams(), parts)
        try:
            await fr.call(CallBatch(pushes=[push_row(host, b"m%d" % i) for i in range(10)]))
            fr.home = 6
            home_calls = lambda: fr.partition_counts()["calls_by_partition"][6]  # noqa: E731
            r = await fr.call(CallBatch(take=2), mon)  # the home: nothing there
            assert r.leased == [] and fr.monitor_confirmed and home_calls() == 1
            r = await fr.call(CallBatch(take=2), mon)
            assert len(r.leased) == 2 and not fr.monitor_confirmed and home_calls() == 1
            r = await fr.call(CallBatch(take=2, beat=True), mon)
            assert fr.monitor_confirmed and home_calls() == 2
            e = r.leased[0]
            r = await fr.call(CallBatch(acks=[(e.entry_id, e.token)]), mon)
            assert r.acked == 1 and fr.monitor_confirmed and home_calls() == 3
        finally:
            await fr.close()
    run(main())
    c = redis.Redis.from_url(redis_url)
    # the deltas (one batch, sent with three calls to the home) counted there once
    assert c.hget(KEYS.partition(6, parts).stats, "pages") == b"1"
    assert c.hget(KEYS.partition(5, parts).stats, "pages") is None
