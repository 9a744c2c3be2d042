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


def test_host_ban_alerts_are_evaluated_on_the_counters_summed_over_the_partitions(redis_url):
    """a.test: 10 pages and 2-3 bans in each of three partitions (its workers' homes), under
    the 20 pages an alert needs in each, 7 of 30 (23 %) in all: one alert, with the sum.
    b.test: 5 bans of 20 pages (25 %) in one partition, none of 60 in another (6 % in all):
    no alert."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "bans")
    parts = keys.all_partitions(3)
    client.hset(parts[partition_of("a.test", 3)].hostq, "a.test", 1)
    for p, bans in enumerate([2, 2, 3]):
        client.hset(parts[p].hoststats, mapping={"p|a.test": 10, "b|a.test": bans,
                                                 "f|a.test": 1000 * (p + 1)})
        client.zadd(parts[p].hostbans, {"a.test": bans})
    client.hset(parts[0].hoststats, mapping={"p|b.test": 20, "b|b.test": 5})
    client.zadd(parts[0].hostbans, {"b.test": 5})
    client.hset(parts[1].hoststats, mapping={"p|b.test": 60})
    alerts = [a for a in read_merged(client, keys, 3)["alerts"] if a["id"] == "host_blocked"]
    assert [(a["where"], a["what"], a["since"]) for a in alerts] == [
        ("host a.test, crawl bans",
         "7 of 30 responses from a.test were bans (block rate 23%, threshold 20%)", 1.0)]


def _sample(client, keys, t_s, pages):
    from scrapy_fleet.monitoring import series

    step, points = series.TIERS["10s"]
    key = keys.series("10s")
    if not client.exists(key):
        client.set(key, b"\0" * series.tier_bytes("10s"))
    t_ms = int(t_s * 1000)
    values = [t_ms, 0, 0, 0, 0, 0, pages, 0, 0, 0]
    client.setrange(key, (t_ms // (step * 1000)) % points * series.SLOT_BYTES,
                    series._SLOT.pack(*values))


def test_merged_rates_take_every_partition_over_one_window_of_a_minute(redis_url):
    """Partition 0 was last sampled 100 s ago, partition 1 400 s ago (a crawl nobody calls
    now: no worker, no monitor sampling), partition 2 is fetching (sampled 130, 65 and 5 s
    ago: 0, 0, 120 pages; 120 now).  The rates are over one window of 60 s (docs/monitoring.md):
    partition 2's 110 pages in the last minute, interpolated between its samples; before, the
    window read 400 s and each partition's rate was over its own."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "rates")
    parts = keys.all_partitions(3)
    now = float(client.time()[0])
    for k, points, pages in ((parts[0], [(now - 100, 50)], 50),
                             (parts[1], [(now - 400, 30)], 30),
                             (parts[2], [(now - 130, 0), (now - 65, 0), (now - 5, 120)], 120)):
        for t, n in points:
            _sample(client, k, t, n)
        client.hset(k.stats, "pages", pages)
    rates = read_merged(client, keys, 3)["rates"]
    assert rates["window_s"] == 60.0
    assert abs(rates["pages_per_min"] - 110 * 60 / rates["window_s"]) < 3
