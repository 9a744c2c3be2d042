"""A partitioned worker (P = 4) whose call failed without a reply sends it again as it was,
each partition's part and each lean push with its op id (frontier/partitions.py,
frontier/sent.py), against a real redis-server behind a TCP proxy of the test's
(support.ReplyEater) that drops one partition's reply, or every reply.

Before, a failed partition's part was rebuilt with a new op id: if it had run, its
acknowledgements came back lost (``fleet/frontier/lease_lost/outage``) and the leases it
granted waited for FLEET_LEASE_TIMEOUT; a lean push that had run was run again, its links
counted as duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from support import ReplyEater, hosts_in_partition

from scrapy_fleet import codec
from scrapy_fleet.errors import RedisUnavailableError
from scrapy_fleet.frontier.partitions import FLUSH_LINKS, PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.frontier.routing import split_ref
from scrapy_fleet.frontier.scheduler import FleetScheduler
from scrapy_fleet.keys.crawl import CrawlKeys

PARTS = 4
CRAWL = "resendp"
KEYS = CrawlKeys("fleet", CRAWL)
PAGES = 3  # responses counted by the worker before the failed call (its counter deltas)


class _Spider(Spider):
    name = CRAWL


def _pump(redis_url: str) -> tuple[Any, Any, Any]:
    """(crawler, pump, book) of a P = 4 scheduler with no crawl running, driven by hand."""
    crawler = get_crawler(_Spider, settings_dict={
        "FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": CRAWL, "FLEET_PARTITIONS": PARTS,
        "FLEET_REDIS_RETRIES": 1, "CONCURRENT_REQUESTS": 16, "FLEET_PREFETCH": 16,
        "DUPEFILTER_CLASS": "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"})
    sched = FleetScheduler.from_crawler(crawler)
    crawler.stats.open_spider()
    crawler.engine = SimpleNamespace(_slot=None)  # no crawl running: nothing to wake
    sched.book.spider = _Spider()
    return crawler, sched.pump, sched.book


def _entry(url: str, group: int = 0) -> tuple[Any, ...]:
    return (b"", 0, codec.encode(Request(url)), group, url.split("/")[2])


@contextlib.asynccontextmanager
async def _through(redis_url: str, only: bytes | None, pump: Any
                   ) -> AsyncIterator[tuple[ReplyEater, PartitionedFrontier]]:
    """The pump's frontier through a :class:`ReplyEater` (eating what names *only*, or
    anything) in front of *redis_url*; closed after."""
    proxy = ReplyEater(int(redis_url.rsplit(":", 1)[1].split("/")[0]), only)
    await proxy.start()
    fr = PartitionedFrontier(proxy.url, KEYS, "w", pump.config.frontier_params(), PARTS,
                             timeout=2, retries=1)
    pump.frontier = fr
    try:
        await fr.connect()
        yield proxy, fr
    finally:
        await proxy.close()
        await fr.close()


async def _lease_all(fr: PartitionedFrontier, pump: Any, book: Any, urls: list[str]
                     ) -> list[Any]:
    """Push *urls* and lease them all through the pump; the requests taken."""
    await fr.call(CallBatch(pushes=[_entry(u) for u in urls]))
    for _ in range(4 * PARTS):
        if len(book.prefetch) == len(urls):
            break
        await pump.call()
    requests = [book.take() for _ in urls]
    assert all(r is not None for r in requests)
    return requests


def _stat(c: redis.Redis, p: int, name: str) -> int:
    return int(c.hget(KEYS.partition(p, PARTS).stats, name) or 0)


def _leases(c: redis.Redis, p: int) -> set[str]:
    return {f"{p}:{m.decode()}" for m in c.zrange(KEYS.partition(p, PARTS).leases, 0, -1)}


def _lost_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]


def test_a_partition_part_that_ran_without_a_reply_is_sent_again_with_its_op_id(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Partition 1's reply is dropped (its call ran: pages acknowledged, two more leased to
    a worker that never saw them), then it is unreachable through the retries; partition 0
    goes on.  The next call sends partition 1's part again as it was: its cached reply
    gives the worker its leases, its acknowledgements count once, nothing is lost."""
    crawler, pump, book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    h0 = hosts_in_partition(0, PARTS, 2)
    h1 = hosts_in_partition(1, PARTS, 6)
    urls = [f"http://{h}/page" for h in h0 + h1[:2]]  # 2 pages in each of partitions 0, 1
    tag1 = KEYS.partition(1, PARTS).base.encode()

    async def main() -> None:
        async with _through(redis_url, tag1, pump) as (proxy, fr):
            requests = await _lease_all(fr, pump, book, urls)
            await fr.call(CallBatch(pushes=[_entry(f"http://{h}/more") for h in h1[2:]]))
            for r in requests:
                book.finished(r)  # acknowledged at the next call, which leases more
            crawler.stats.set_value("downloader/response_status_count/200", PAGES)
            fr.home = 1  # (the lease request goes to partition 1 first)
            leased1 = _leases(c, 1)
            proxy.mode = "eat"
            result = await pump.call()  # partition 0's part went through
            assert proxy.eaten == 1 and result is not None
            assert (result.acked, result.lost) == (2, [])
            # partition 1's part ran: its pages acknowledged, more leased, unseen
            assert _stat(c, 1, "acked") == 2 and _stat(c, 0, "acked") == 2
            granted = _leases(c, 1)
            assert granted and not granted & leased1
            assert not {lease.entry_id for _, lease in book.prefetch} & granted
            op = fr.fronts[1].last_op  # (its reply is cached under its op id)
            assert op is not None and c.exists(KEYS.partition(1, PARTS).op(op))
            proxy.mode = "pass"
            result = await pump.call()  # partition 1's part again: its cached reply
            assert result is not None and (result.acked, result.lost) == (2, [])
            assert granted <= {lease.entry_id for _, lease in book.prefetch}
            assert _stat(c, 1, "leased") == 2 + len(granted)  # (once: not run again)

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet"):
        asyncio.run(main())
    assert _stat(c, 1, "acked") == 2 and _stat(c, 0, "acked") == 2  # (each once)
    stats = crawler.stats
    assert stats.get_value("fleet/frontier/acked") == 4
    # every lease granted reached the worker, once
    assert stats.get_value("fleet/frontier/leased") == sum(
        _stat(c, p, "leased") for p in range(PARTS)) == len(book.prefetch) + 4
    assert stats.get_value("fleet/frontier/lease_lost") is None  # (before: 2, "outage")
    assert not _lost_lines(caplog)
    # the counter deltas went with the home's part, sent again once: counted once
    assert sum(_stat(c, p, "pages") for p in range(PARTS)) == PAGES


def test_a_call_none_of_whose_parts_answered_is_sent_again_as_it_was(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every reply dropped (the first one, then Redis gone): the call raises, the pump sends
    its batch again with the frontier's last_op, and every partition's part goes again as
    it was: the parts that ran reply their cached replies."""
    crawler, pump, book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    hosts = [h for p in range(PARTS) for h in hosts_in_partition(p, PARTS, 2)]
    urls = [f"http://{h}/page" for h in hosts]

    async def main() -> None:
        async with _through(redis_url, None, pump) as (proxy, fr):
            requests = await _lease_all(fr, pump, book, urls)
            await fr.call(CallBatch(pushes=[_entry(f"http://{h}/more") for h in hosts]))
            for r in requests:
                book.finished(r)
            crawler.stats.set_value("downloader/response_status_count/200", PAGES)
            proxy.mode = "eat"
            with pytest.raises(RedisUnavailableError):
                await pump.call()
            assert proxy.eaten == 1 and fr.last_op is not None
            ran = sum(_stat(c, p, "acked") for p in range(PARTS))
            granted = set().union(*(_leases(c, p) for p in range(PARTS)))
            assert ran >= 2  # (at least the part whose reply was eaten ran)
            proxy.mode = "pass"
            result = await pump.call()  # (the pump's failed call, sent again)
            assert result is not None and result.lost == []
            assert fr.last_op is None and not book.done
            assert sum(_stat(c, p, "acked") for p in range(PARTS)) == len(urls)
            held = {lease.entry_id for _, lease in book.prefetch}
            assert granted <= held == set().union(*(_leases(c, p) for p in range(PARTS)))

    with caplog.at_level(logging.WARNING, logger="scrapy_fleet"):
        asyncio.run(main())
    stats = crawler.stats
    assert stats.get_value("fleet/frontier/acked") == len(urls)
    assert stats.get_value("fleet/frontier/leased") == sum(
        _stat(c, p, "leased") for p in range(PARTS))
    assert stats.get_value("fleet/frontier/lease_lost") is None
    assert not _lost_lines(caplog)
    assert sum(_stat(c, p, "acked") for p in range(PARTS)) == len(urls)
    assert sum(_stat(c, p, "pages") for p in range(PARTS)) == PAGES


def test_a_lean_push_that_ran_without_a_reply_is_sent_again_with_its_op_id(
        redis_url: str) -> None:
    """A page of partition 0 with a link for partition 2: the lean push into partition 2
    runs but its reply is dropped, then partition 2 is unreachable.  The page waits; the
    next call sends the lean push again as it was (same op id, same argument): its cached
    reply, so the link is pushed once and not counted a duplicate, and the page is
    acknowledged once.  (Before, the lean push ran again: the Bloom filter found its links,
    counted as duplicates, and a link without a fingerprint was queued twice.)"""
    crawler, pump, book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    (h0,) = hosts_in_partition(0, PARTS)
    (h2,) = hosts_in_partition(2, PARTS)
    tag2 = KEYS.partition(2, PARTS).base.encode()

    async def main() -> None:
        async with _through(redis_url, tag2, pump) as (proxy, fr):
            fr.home = 0
            (request,) = await _lease_all(fr, pump, book, [f"http://{h0}/page"])
            lease = book.inflight[id(request)][1]
            book.buffer(Request(f"http://{h2}/a"), os.urandom(12), 0, 0, lease)
            book.buffer(Request(f"http://{h2}/b", dont_filter=True), b"", 0, 0, lease)
            book.finished(request)
            proxy.mode = "eat"
            result = await pump.call()
            assert proxy.eaten == 1 and result is not None and result.acked == 0
            assert _stat(c, 2, "pushed") == 2  # (it ran)
            proxy.mode = "pass"
            result = await pump.call()
            assert result is not None and (result.acked, result.lost) == (1, [])
            assert result.pushed == 2 and result.duplicates == 0
            assert not fr.waiting_work

    asyncio.run(main())
    assert _stat(c, 2, "pushed") == 2 and _stat(c, 2, "duplicates") == 0
    assert int(c.hget(KEYS.partition(2, PARTS).hostq, h2) or 0) == 2  # entries (not 3)
    assert _stat(c, 0, "acked") == 1
    assert crawler.stats.get_value("fleet/frontier/pushed") == 2
    assert crawler.stats.get_value("fleet/dupefilter/filtered") is None


def test_of_two_lean_pushes_the_one_whose_reply_came_is_not_sent_again(
        redis_url: str) -> None:
    """A page of partition 0 with FLUSH_LINKS + 50 links for partition 2: two lean pushes,
    one after the other.  The first's reply comes; the second runs but its reply is dropped
    (and, running, it deleted the first's reply cache: the chain of evidence keeps only the
    last).  The next call takes the first's reply again from the worker, without sending
    it, and sends the second again with its op id: every link queued once, none counted a
    duplicate, the `dont_filter` link of the first push queued once."""
    crawler, pump, book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    (h0,) = hosts_in_partition(0, PARTS)
    (h2,) = hosts_in_partition(2, PARTS)
    tag2 = KEYS.partition(2, PARTS).base.encode()
    n = FLUSH_LINKS + 50

    async def main() -> None:
        async with _through(redis_url, tag2, pump) as (proxy, fr):
            fr.home = 0
            (request,) = await _lease_all(fr, pump, book, [f"http://{h0}/page"])
            lease = book.inflight[id(request)][1]
            book.buffer(Request(f"http://{h2}/again", dont_filter=True), b"", 0, 0, lease)
            for i in range(n - 1):
                book.buffer(Request(f"http://{h2}/{i}"), os.urandom(12), 0, 0, lease)
            book.finished(request)
            proxy.mode, proxy.skip = "eat", 1
            sent = fr.lean_dests[2].sent
            result = await pump.call()
            assert proxy.eaten == 1 and result is not None and result.acked == 0
            assert _stat(c, 2, "pushed") == n and fr.lean_dests[2].sent == sent + 2
            proxy.mode = "pass"
            result = await pump.call()
            assert result is not None and (result.acked, result.lost) == (1, [])
            assert result.pushed == n and result.duplicates == 0
            assert fr.lean_dests[2].sent == sent + 3  # (the second only)
            assert not fr.waiting_work

    asyncio.run(main())
    assert _stat(c, 2, "pushed") == n and _stat(c, 2, "duplicates") == 0
    assert int(c.hget(KEYS.partition(2, PARTS).hostq, h2) or 0) == n
    assert _stat(c, 0, "acked") == 1
    assert crawler.stats.get_value("fleet/frontier/pushed") == n


def test_a_call_only_to_an_unreachable_partition_does_not_stop_the_others(
        redis_url: str) -> None:
    """A call whose only part (partition 0's acknowledgement) gets no reply, while the home
    (partition 1) answers: the client calls the home with nothing to do, finds it up and does
    not raise (raising made the pump send that batch again and again, taking no new work:
    a worker stalled for as long as one partition's slot was half-moved).  The part is kept
    as sent; the next calls lease from partition 1; once partition 0 answers, the part goes
    again as it was and the page is acknowledged once."""
    _crawler, pump, _book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    (h0,) = hosts_in_partition(0, PARTS)
    (h1,) = hosts_in_partition(1, PARTS)
    tag0 = KEYS.partition(0, PARTS).base.encode()

    async def main() -> None:
        async with _through(redis_url, tag0, pump) as (proxy, fr):
            fr.home = 0
            await fr.call(CallBatch(pushes=[_entry(f"http://{h0}/page")]))
            (page,) = (await fr.call(CallBatch(take=1))).leased
            fr.home = 1
            proxy.mode = "down"
            r = await fr.call(CallBatch(acks=[(page.entry_id, page.token)]))
            assert r.acked == 0 and fr.waiting_work and fr.last_op is None
            await fr.call(CallBatch(pushes=[_entry(f"http://{h1}/other")]))
            r = await fr.call(CallBatch(take=1))
            assert [split_ref(e.entry_id)[0] for e in r.leased] == [1]
            proxy.mode = "pass"
            acked, lost = 0, []
            for _ in range(100):  # (the kept part goes after its back-off: 0.1 s doubling)
                r = await fr.call(CallBatch(beat=True))
                acked, lost = acked + r.acked, lost + r.lost
                if not fr.waiting_work:
                    break
                await asyncio.sleep(0.05)
            assert acked == 1 and lost == [] and not fr.waiting_work

    asyncio.run(main())
    assert _stat(c, 0, "acked") == 1 and _stat(c, 1, "leased") == 1


def test_the_final_call_releases_the_leases_of_a_part_sent_again(redis_url: str) -> None:
    """At close, partition 1's part that failed without a reply goes again first (its
    acknowledgements confirmed) and the leases its cached reply names are released with the
    final call: nothing is left leased, in any partition."""
    crawler, pump, book = _pump(redis_url)
    c = redis.Redis.from_url(redis_url)
    h1 = hosts_in_partition(1, PARTS, 4)
    h0 = hosts_in_partition(0, PARTS, 1)
    tag1 = KEYS.partition(1, PARTS).base.encode()

    async def main() -> int:
        async with _through(redis_url, tag1, pump) as (proxy, fr):
            requests = await _lease_all(fr, pump, book,
                                        [f"http://{h}/page" for h in h0 + h1[:2]])
            await fr.call(CallBatch(pushes=[_entry(f"http://{h}/more") for h in h1[2:]]))
            for r in requests:
                book.finished(r)
            fr.home = 1
            proxy.mode = "eat"
            await pump.call()
            assert proxy.eaten == 1 and _stat(c, 1, "acked") == 2
            granted = len(_leases(c, 1))
            assert granted and not book.prefetch
            proxy.mode = "pass"
            await pump.close("finished")
            return granted

    granted = asyncio.run(main())
    assert sum(len(_leases(c, p)) for p in range(PARTS)) == 0
    assert _stat(c, 1, "acked") == 2 and _stat(c, 1, "released") == granted
    assert _stat(c, 0, "acked") == 1
    assert crawler.stats.get_value("fleet/frontier/lease_lost") is None


def test_a_push_batch_sent_again_takes_the_replies_of_the_partitions_it_reached(
        redis_server: Any, redis_url: str) -> None:
    """The push command's batch over two partitions, the second refusing it (an ACL without
    its keys, standing for a partition out of memory, which push_lines waits out and pushes
    the batch again): the batch pushed again takes the first partition's reply instead of
    running there twice (its fingerprinted line would count as a duplicate, its line
    without a fingerprint be queued twice)."""
    from scrapy_fleet import acl
    from scrapy_fleet.commands.partitioned import PartitionedPush
    from scrapy_fleet.frontier.admin import FrontierAdmin

    keys = CrawlKeys("fleet", "pushp")
    (h0,) = hosts_in_partition(0, 2)
    (h1,) = hosts_in_partition(1, 2)
    c = redis_server.client()
    rule = acl.acl_rule("worker", crawl_id="pushp")
    c.execute_command("ACL", "SETUSER", "half", "reset", "on", ">pw", *rule.split(),
                      f"~{keys.partition(0, 2).base}:*")
    admin = FrontierAdmin(f"redis://half:pw@127.0.0.1:{redis_server.port}/0", "pushp")
    try:
        pusher = PartitionedPush(admin, 2)
        rows = [(os.urandom(12), 0, b"a", 0, h0), (b"", 0, b"b", 0, h0),
                (os.urandom(12), 0, b"c", 0, h1)]
        with pytest.raises(redis.ResponseError):
            pusher.push(rows)
        assert _count(c, keys, 0, "pushed") == 2  # (partition 0 went through)
        c.execute_command("ACL", "SETUSER", "half", f"~{keys.partition(1, 2).base}:*")
        result = pusher.push(rows)
    finally:
        c.execute_command("ACL", "DELUSER", "half")
        admin.close()
    assert (result.pushed, result.duplicates, result.push_flags) == (3, 0, [1, 1, 1])
    assert _count(c, keys, 0, "pushed") == 2 and _count(c, keys, 0, "duplicates") == 0
    assert int(c.hget(keys.partition(0, 2).hostq, h0)) == 2  # (not 3)
    assert _count(c, keys, 1, "pushed") == 1


def _count(c: redis.Redis, keys: CrawlKeys, p: int, name: str) -> int:
    return int(c.hget(keys.partition(p, 2).stats, name) or 0)
