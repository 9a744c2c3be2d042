"""monitoring/merge.py's reader against a real redis-server: a partitioned crawl's snapshot
sums a host's counters over the partitions its workers recorded them in."""

from __future__ import annotations

import redis
from support import server_ms, wait_server_past

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
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


def test_read_merged_shows_a_hosts_adaptive_controller_under_the_crawls_defaults(redis_url):
    """The controller lives in the host's partition, the per-host defaults (its ceiling) in
    the crawl's control config: the merged row holds both (issue 35, item 6)."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "adapt")
    parts = keys.all_partitions(3)
    home = partition_of("h.test", 3)
    client.hset(parts[home].hostq, "h.test", 5)
    # lua/adaptive.lua's state: r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n
    client.hset(parts[home].adaptive, "h.test", "5|0|0|0|1764581940000|3|429|0|10|0|2")
    client.hset(keys.config, mapping={"host_interval_ms": 50, "host_interval_is_rate": 1,
                                      "host_burst": 1, "host_concurrency": 0})
    row = read_merged(client, keys, 3)["hosts"][0]
    assert (row["host"], row["adaptive_rate"], row["ceiling"], row["capacity"],
            row["last_decrease"], row["last_decrease_at"], row["decreases"]) == \
        ("h.test", 5.0, 20.0, 10.0, "429", 1764581940.0, 2)


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


def _sample(client, keys, t_s, pages, bans=0):
    from scrapy_fleet.monitoring import series

    step, points = series.TIERS["10s"]
    key = keys.series("10s")
    if not client.exists(key):
        client.set(key, b"\0" * series.tier_bytes("10s"))
    t_ms = int(t_s * 1000)
    values = [t_ms, 0, 0, 0, 0, 0, pages, 0, bans, 0]
    client.setrange(key, (t_ms // (step * 1000)) % points * series.SLOT_BYTES,
                    series._SLOT.pack(*values))


def test_the_monitors_block_rate_series_is_the_crawls(redis_url):
    """``top``/``monitor`` of a partitioned crawl (FleetSource, P = 2): two partitions with 1
    ban in 10 pages each over one 10 s step read a block rate of 0.1 (each partition's series
    summed read 0.2); the first step has no rate."""
    from scrapy_fleet.monitoring.source import FleetSource

    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "blockseries")
    parts = keys.all_partitions(2)
    base = (server_ms(client) // 10_000) * 10 - 20  # (a step start 20-30 s ago)
    for k, offset in ((parts[0], 1), (parts[1], 2)):
        _sample(client, k, base + offset, 0)
        _sample(client, k, base + 10 + offset, 10, bans=1)
    points = dict(FleetSource(client, keys, parts=2).series(["block_rate"])["block_rate"])
    assert (points[float(base)], points[float(base + 10)]) == (None, 0.1)


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


def _sample_1m(client, keys, t_s, due=0, dead=0):
    """One 1 min sample of *keys* at *t_s* (what lua/monitoring.lua writes), *due* queued
    entries and *dead* dead letters then."""
    from scrapy_fleet.monitoring import series

    step, points = series.TIERS["1m"]
    key = keys.series("1m")
    if not client.exists(key):
        client.set(key, b"\0" * series.tier_bytes("1m"))
    t_ms = int(t_s * 1000)
    values = [t_ms, due, 0, 0, 0, dead, 0, 0, 0, 1]
    client.setrange(key, (t_ms // (step * 1000)) % points * series.SLOT_BYTES,
                    series._SLOT.pack(*values))


def test_depth_growing_is_the_crawls_depth_summed_over_the_partitions(redis_url):
    """Over the last 10 min the crawl's depth grew at every 1 min sample (0 to 10), half of
    it in partition 0 and half in partition 1, each growing every other minute, sampled at
    other seconds of each minute: one ``depth_growing`` alert with the crawl's figures (no
    partition grew at every sample on its own: there was none)."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "depth")
    parts = keys.all_partitions(4)
    now = server_ms(client) / 1000
    if now % 60 > 59:  # (both of this minute's samples in the past)
        wait_server_past(client, (now // 60 + 1) * 60_000)
        now = server_ms(client) / 1000
    base = (now // 60) * 60 - 600  # (the start of the minute 10 min ago)
    for i in range(11):
        t = base + 60 * i + (now % 60) / 2
        _sample_1m(client, parts[0], t, due=(i + 1) // 2)
        _sample_1m(client, parts[1], t + (now % 60) / 3, due=i // 2)
    client.set(parts[0].queue_count, 5)  # (the depth now; the queue itself is not read)
    client.set(parts[1].queue_count, 5)
    alerts = [a for a in read_merged(client, keys, 4)["alerts"] if a["id"] == "depth_growing"]
    assert [a["what"] for a in alerts] == [
        "the frontier grew from 0 to 10 requests in the last 10 min: the fleet falls behind"]


def test_dead_letters_and_failed_items_alerts_count_every_partition(redis_url):
    """2 new dead letters in partition 0 and 1 in partition 2 over the last 10 min; failed
    items kept: 1 in partition 1, 2 in partition 3.  One alert each, with the crawl's
    figures (each partition listed its own: two alerts each, none with the total)."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "deadfail")
    parts = keys.all_partitions(4)
    now = float(client.time()[0])
    for p, new in ((0, 2), (2, 1)):
        _sample_1m(client, parts[p], now - 300, dead=0)
        _sample_1m(client, parts[p], now - 30, dead=new)
        client.hset(parts[p].dead, mapping={f"e{i}": b"x" for i in range(new)})
    client.hset(parts[1].failed_by, "item/TypeError", 1)
    client.hset(parts[3].failed_by, "item/TypeError", 2)
    alerts = read_merged(client, keys, 4)["alerts"]
    assert sorted((a["id"], a["what"]) for a in alerts) == [
        ("dead_letters_growing", "3 new dead letter(s) in the last 10 min (3 in all)"),
        ("items_failed", "3 request(s) failed because an item pipeline could not write one "
                         "of their items (it raised)")]
