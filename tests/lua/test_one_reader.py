"""One snapshot reader for every P (monitoring/merge.py ``read_merged``, issue 33): the
crawl of one partition reads as the merge of one partition, which is the crawl's own
snapshot and series as ``monitoring.snapshot`` reads them; the views' source
(``FleetSource``) reads through it at every P.  Against a real redis-server."""

from __future__ import annotations

from typing import Any

import redis
from support import push_row, server_ms

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import sampler
from scrapy_fleet.monitoring.merge import read_merged, read_merged_series
from scrapy_fleet.monitoring.snapshot import SERIES, read_series, read_snapshot
from scrapy_fleet.monitoring.source import FleetSource


def _crawl(redis_url: str, crawl: str) -> tuple[redis.Redis, CrawlKeys]:
    """A crawl with entries of 3 hosts, counters, a failure reason, a banned host and one
    sample of each tier."""
    admin = FrontierAdmin(redis_url, crawl)
    try:
        res = admin.push([push_row(h) for h in ("a.test", "a.test", "b.test", "c.test")])
        assert res.pushed == 4
    finally:
        admin.close()
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", crawl)
    client.hset(keys.stats, mapping={"pages": 7, "bans": 2, "items_scraped": 3})
    client.hset(keys.failed_by, "http/500", 2)
    client.zadd(keys.hostbans, {"b.test": 2})
    client.hset(keys.hoststats, mapping={"p|b.test": 5, "b|b.test": 2})
    sampler.sample(client, keys, 6.0, 120.0)  # (the push may have taken this step's)
    return client, keys


def _timeless(snap: dict[str, Any]) -> dict[str, Any]:
    """*snap* without what moves between two reads: its time and the server's memory (the
    session's redis-server serves other tests)."""
    return {k: v for k, v in snap.items() if k not in ("at", "redis")}


def test_the_snapshot_of_one_partition_is_the_crawls_own(redis_url):
    """``read_merged`` at P = 1 is ``read_snapshot``'s snapshot, field for field (no
    ``partitions``, ``per_partition`` or ``skew``: main merged one partition into a snapshot
    with those, and its own rates, workers and alerts)."""
    client, keys = _crawl(redis_url, "onep")
    merged = read_merged(client, keys, 1, hosts=5)
    own = read_snapshot(client, keys, hosts=5)
    assert _timeless(merged) == _timeless(own)
    assert [h["host"] for h in merged["hosts"]] == ["a.test", "b.test", "c.test"]
    assert merged["frontier"]["due"] == 4 and merged["counters"]["pages"] == 7
    assert "per_partition" not in merged


def test_the_series_of_one_partition_are_the_crawls_own(redis_url):
    """``read_merged_series`` at P = 1 is ``read_series`` of every series (each read takes
    the server's clock: compared over the steps both reads hold)."""
    client, keys = _crawl(redis_url, "ones")
    since = server_ms(client) / 1000 - 60
    names = list(SERIES)
    merged = read_merged_series(client, keys, 1, names, since_s=since)
    for name in names:
        own = read_series(client, keys, name, since_s=since)
        n = min(len(own), len(merged[name]))
        assert n >= 6 and merged[name][:n] == own[:n], name
    assert any(v == 4 for _, v in merged["depth_due"])


def test_the_views_source_reads_through_the_one_reader_at_every_p(redis_url):
    """``FleetSource`` at P = 1 gives the crawl's own snapshot; at P = 3 the merged one."""
    client, keys = _crawl(redis_url, "views")
    one = FleetSource(client, keys, hosts=5).snapshot()
    assert _timeless(one) == _timeless(read_snapshot(client, keys, hosts=5))
    three = FleetSource(client, CrawlKeys("fleet", "views3"), hosts=5, parts=3).snapshot()
    assert three["partitions"] == 3 and len(three["per_partition"]) == 3
    since = server_ms(client) / 1000 - 60
    points = FleetSource(client, keys).series(["depth_due"], since_s=since)["depth_due"]
    own = read_series(client, keys, "depth_due", since_s=since)
    n = min(len(points), len(own))
    assert n >= 6 and points[:n] == [(float(t), v if v is None else float(v))
                                     for t, v in own[:n]]
