"""monitoring/merge.py's reader against a real redis-server: a partitioned crawl's snapshot
sums a host's counters over the partitions its workers recorded them in."""

from __future__ import annotations

import redis

from scrapy_fleet.keys import CrawlKeys, partition_of
from scrapy_fleet.monitoring.merge import read_merged


def test_read_merged_sums_a_hosts_counters_over_the_partitions(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "hosts")
    parts = keys.all_partitions(3)
    home = partition_of("h.test", 3)
    client.hset(parts[home].hostq, "h.test", 5)
    for p, (pages, bans) in enumerate([(4, 1), (6, 0), (10, 3)]):
        client.hset(parts[p].hoststats, mapping={"p|h.test": pages, "b|h.test": bans})
    out = read_merged(client, keys, 3)
    assert [(h["host"], h["queued"], h["pages"], h["bans"], h["block_rate"])
            for h in out["hosts"]] == [("h.test", 5, 20, 4, 0.2)]
