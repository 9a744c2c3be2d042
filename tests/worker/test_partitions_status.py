"""What ``status`` says of a partitioned crawl (FLEET_PARTITIONS = 4), driven through the
worker's own PartitionedFrontier against a real Redis server and read with the merged
snapshot (monitoring/merge.py): a worker's last acknowledgement wherever it landed, and the
crawl-wide alerts evaluated once on the partitions' summed counts."""

from __future__ import annotations

import asyncio

import redis
from support import hosts_in_partition, monitor_payload, push_row, server_ms, wait_server_past

from scrapy_fleet.commands.partitioned import PartitionedPush
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.partitions import PartitionedFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring.alerts import AlertConfig
from scrapy_fleet.monitoring.merge import read_merged

PARTS = 4


def _push(redis_url: str, crawl: str, hosts: list[str]) -> None:
    """Push one request per host as ``scrapy fleet push`` does (no worker: lean calls)."""
    admin = FrontierAdmin(redis_url, crawl)
    try:
        res = PartitionedPush(admin, PARTS).push([push_row(h) for h in hosts])
        assert res.pushed == len(hosts)
    finally:
        admin.close()


def _as_worker(redis_url: str, keys: CrawlKeys, steps) -> None:
    """Run ``await steps(fr)``, *fr* the connected PartitionedFrontier of worker "w" of a
    crawl in PARTS partitions (closed after)."""
    async def main():
        fr = PartitionedFrontier(redis_url, keys, "w", FrontierParams(), PARTS)
        try:
            await fr.connect()
            await steps(fr)
        finally:
            await fr.close()
    asyncio.run(main())


def test_a_workers_last_ack_is_its_latest_in_any_partition(redis_url):
    """The fresh user's trial: worker w's heartbeat (2 leases held) goes with its calls to
    its home partition 0, its acknowledgements land in partition 2, where its pages came
    from.  Its row's ``last_ack`` is partition 2's (the latest), and the worker holding
    leases is not ``stalled`` for want of acknowledgements in its home (it was: the row was
    the home's record, whose last acknowledgement was its first call)."""
    keys = CrawlKeys("fleet", "lastack")
    host = hosts_in_partition(2, PARTS)[0]
    client = redis.Redis.from_url(redis_url)
    cfg = AlertConfig(stall_after=2.0)

    async def steps(fr):
        fr.home = 0
        await fr.call(CallBatch(beat=True), monitor_payload(leases=2, state="fetching"))
        first = server_ms(client)
        await fr.call(CallBatch(pushes=[push_row(host, b"a"), push_row(host, b"b")]))
        fr.home = 2
        got = (await fr.call(CallBatch(take=2))).leased
        assert len(got) == 2
        fr.home = 0
        wait_server_past(client, first + 3000)
        # (leasing elsewhere, no heartbeat due: the call reaches partition 2 alone)
        r = await fr.call(CallBatch(acks=[(e.entry_id, e.token) for e in got]))
        assert r.acked == 2
    _as_worker(redis_url, keys, steps)
    home_la = int(client.hget(keys.partition(0, PARTS).worker_info("w"), "la"))
    ack_la = int(client.hget(keys.partition(2, PARTS).worker_info("w"), "la"))
    assert ack_la > home_la + 3000 - 1
    snap = read_merged(client, keys, PARTS, alerts_config=cfg)
    (row,) = snap["workers"]
    assert (row["state"], row["leases"]) == ("fetching", 2)  # the home's record
    assert row["last_ack"] == round(ack_la / 1000, 3)
    assert row["health"] == "alive"
    assert snap["last_ack_at"] == ack_la / 1000
    assert [a["id"] for a in snap["alerts"] if a["id"].startswith("worker_")] == []


def test_no_worker_counts_the_requests_of_every_partition(redis_url):
    """No worker; one request due in partition 1, one in partition 2: one ``no_worker``
    alert saying 2 wait (each partition's said 1 and the two, alike, were listed once)."""
    crawl = "noworker"
    hosts = [hosts_in_partition(1, PARTS)[0], hosts_in_partition(2, PARTS)[0]]
    _push(redis_url, crawl, hosts)
    client = redis.Redis.from_url(redis_url)
    snap = read_merged(client, CrawlKeys("fleet", crawl), PARTS)
    assert [(a["id"], a["what"]) for a in snap["alerts"]] == [
        ("no_worker", "no worker is alive while 2 request(s) wait (2 due, 0 leased)")]


def test_a_worker_alive_in_its_home_partition_is_alive_for_the_crawl(redis_url):
    """Worker w calls only its home partition 0 (heartbeats, as while its home has work);
    a request waits in partition 3, which no worker called yet: no ``no_worker`` alert (a
    worker is alive; it reaches partition 3 with its next discovery)."""
    crawl = "alivehome"
    keys = CrawlKeys("fleet", crawl)
    _push(redis_url, crawl, [hosts_in_partition(3, PARTS)[0]])

    async def steps(fr):
        fr.home = 0
        await fr.call(CallBatch(beat=True), monitor_payload())
    _as_worker(redis_url, keys, steps)
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(keys.partition(3, PARTS).workers) == 0
    snap = read_merged(client, keys, PARTS)
    assert snap["workers_alive"] == 1 and snap["frontier"]["due"] == 1
    assert [a["id"] for a in snap["alerts"]] == []


def test_fleet_stalled_is_the_crawls_not_one_partitions(redis_url):
    """Worker w called partition 1 (a request waits there, its host held back) at t0, and
    acknowledges pages in partition 0 at t0 + 3 s; stall_after 2 s.  The crawl acknowledged a
    request just now: no ``fleet_stalled`` (partition 1's own evaluation said so, for the
    crawl).  Then nothing is acknowledged for 3 s more: one alert, counting the requests due
    or leased in every partition (2: one due in partition 1, one leased in partition 0)."""
    crawl = "stalled"
    keys = CrawlKeys("fleet", crawl)
    h0, h1 = hosts_in_partition(0, PARTS)[0], hosts_in_partition(1, PARTS)[0]
    _push(redis_url, crawl, [h1])
    client = redis.Redis.from_url(redis_url)
    cfg = AlertConfig(stall_after=2.0)

    async def steps(fr):
        fr.home = 1
        await fr.call(CallBatch(beat=True), monitor_payload())  # (leases nothing)
        t0 = server_ms(client)
        fr.home = 0
        await fr.call(CallBatch(pushes=[push_row(h0, b"a"), push_row(h0, b"b")]))
        got = (await fr.call(CallBatch(take=1))).leased
        wait_server_past(client, t0 + 3000)
        r = await fr.call(CallBatch(acks=[(got[0].entry_id, got[0].token)], take=1),
                          monitor_payload(leases=1, state="fetching"))
        assert r.acked == 1 and len(r.leased) == 1
        fresh = read_merged(client, keys, PARTS, alerts_config=cfg)
        assert [a["id"] for a in fresh["alerts"]] == []
        wait_server_past(client, server_ms(client) + 3000)
        # (a heartbeat: the worker is still at work, its lease extended)
        await fr.call(CallBatch(beat=True), monitor_payload(leases=1, state="fetching"))
    _as_worker(redis_url, keys, steps)
    snap = read_merged(client, keys, PARTS, alerts_config=cfg)
    stalled = [a for a in snap["alerts"] if a["id"] == "fleet_stalled"]
    assert len(stalled) == 1
    assert stalled[0]["what"].startswith(
        "1 worker(s) alive and 2 request(s) due or leased, but no request acknowledged for ")
