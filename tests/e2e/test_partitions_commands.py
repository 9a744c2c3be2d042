"""Commands on a partitioned crawl (issue 21): push batched per partition, status (totals, a
row per partition, skew), shards, purge of every partition; a crawl worked by real workers."""

from __future__ import annotations

import json

import pytest
import redis
from support import TEST_PROJECT, read_items, run_scrapy, start_worker, tail, wait_all
from test_monitoring_live import Monitor
from test_status_schema import check, documented

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of

pytestmark = pytest.mark.slow

BINDS = [f"127.0.0.{i}" for i in range(10, 16)]


def fleet(action, *args, redis_url, env, parts=4):
    return run_scrapy(TEST_PROJECT, ["fleet", action, "fetch", *args, "-s",
                                     f"FLEET_REDIS_URL={redis_url}", "-s",
                                     f"FLEET_PARTITIONS={parts}"], env)


def test_push_status_crawl_shards_purge(redis_url, site_factory, worker_env, tmp_path):
    from testsite import generate_site

    generate_site(tmp_path / "www", 20, 1, seed=2)
    site = site_factory(tmp_path / "www", binds=BINDS)
    urls = [f"{base}site/p/{i}.html" for base in site.urls for i in range(20)]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    res = fleet("push", "-f", str(listing), redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    assert "pushed 120, duplicates 0" in res.stdout
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "fetch")
    assert client.get(keys.partitions) == b"4"
    expected = [0] * 4
    for addr in BINDS:
        expected[partition_of(addr, 4)] += 20
    queued = [int(client.get(k.queue_count) or 0) for k in keys.all_partitions(4)]
    assert queued == expected
    # pushing again: every line is a duplicate, found in its partition's filter
    res = fleet("push", "-f", str(listing), redis_url=redis_url, env=worker_env)
    assert "pushed 0, duplicates 120" in res.stdout, res.stdout + res.stderr

    res = fleet("status", "--json", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["partitions"] == 4 and status["frontier"]["due"] == 120
    assert [row["queued"] for row in status["per_partition"]] == expected
    assert status["skew"] == round(max(expected) / 30, 2)
    text = fleet("status", redis_url=redis_url, env=worker_env).stdout
    assert "4 partitions" in text and "skew:" in text

    res = fleet("shards", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("partition ") == 4 and "local: 4 partition(s)" in res.stdout

    # a command of another P is refused in one line
    res = fleet("status", redis_url=redis_url, env=worker_env, parts=2)
    assert res.returncode != 0
    assert "FLEET_PARTITIONS=2 does not match crawl 'fetch', created with " \
           "FLEET_PARTITIONS=4" in res.stderr

    outs = [tmp_path / f"out-{i}.jsonl" for i in range(3)]
    logs = [tmp_path / f"w-{i}.log" for i in range(3)]
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_PARTITIONS": 4}
    procs = [start_worker(TEST_PROJECT, "fetch", {**settings, "FLEET_JSONL_PATH": outs[i]},
                          worker_env, logs[i]) for i in range(3)]
    assert wait_all(procs, 180) == [0, 0, 0], tail(logs[0])
    items = read_items(outs)
    assert sorted(item["url"] for item in items) == sorted(urls)

    status = json.loads(fleet("status", "--json", redis_url=redis_url, env=worker_env).stdout)
    assert status["counters"]["requests"]["acked"] == 120
    assert status["frontier"]["due"] == 0 and status["schema"] == 2
    assert [row["acked"] for row in status["per_partition"]] == expected
    # the schema-2 snapshot (docs/monitoring.md), merged, with the partitioned fields
    rows = documented()
    seen = check(status, rows, hosts=False, partitioned=True)
    assert {p for p, (_, _, where) in rows.items() if where == "partitioned"} <= seen
    assert status["counters"]["pages"] == 120 and status["frontier"]["seen"] == 120
    # the 3 workers stopped normally: each left every partition (they were listed as dead)
    assert status["workers"] == [] and status["idle_seconds"] is not None

    # top and monitor read the same merged snapshot; /metrics has a gauge per partition
    res = fleet("top", "--once", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    assert "120" in res.stdout and "crawl" in res.stdout.lower(), res.stdout
    monitor = Monitor(redis_url, "fetch", worker_env)
    try:
        metrics = monitor.metrics()
    finally:
        assert monitor.stop() == 0
    assert metrics[("scrapy_fleet_partitions", ())] == 4
    assert metrics[("scrapy_fleet_pages_total", ())] == 120
    nodes = {dict(labels)["node"] for name, labels in metrics
             if name == "scrapy_fleet_partition_requests"}
    assert nodes == {"local"}
    for p in range(4):
        assert metrics[("scrapy_fleet_partition_requests",
                        (("node", "local"), ("partition", str(p)), ("state", "queued")))] == 0

    res = fleet("purge", "--yes", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    assert client.keys("fleet:{fetch*") == []


def test_failed_retry_and_dead_over_partitions(redis_url, site_factory, worker_env, tmp_path):
    """Pages that fail for good are recorded in their host's partition; `failed` lists them
    all (ids <p>:<id>), `retry --all` puts each back into its own partition, and a second
    crawl fetches them."""
    from testsite import generate_site

    generate_site(tmp_path / "www", 5, 1, seed=2)
    binds = BINDS[:4]
    site = site_factory(tmp_path / "www", binds=binds, behaviour={
        "failures": [{"prefix": "/site/p/1.html", "status": 500, "host": None}]})
    urls = [f"{base}site/p/{i}.html" for base in site.urls for i in range(5)]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    assert fleet("push", "-f", str(listing), redis_url=redis_url,
                 env=worker_env).returncode == 0
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_PARTITIONS": 4,
                "RETRY_TIMES": 0}

    def crawl(tag):
        out, log = tmp_path / f"out-{tag}.jsonl", tmp_path / f"w-{tag}.log"
        proc = start_worker(TEST_PROJECT, "fetch", {**settings, "FLEET_JSONL_PATH": out},
                            worker_env, log)
        assert wait_all([proc], 180) == [0], tail(log)
        return [item["url"] for item in read_items([out])]

    failing = sorted(f"{base}site/p/1.html" for base in site.urls)
    assert sorted(crawl("a")) == sorted(set(urls) - set(failing))
    res = fleet("failed", "--json", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert sorted(row["url"] for row in rows) == failing
    assert {row["id"].split(":")[0] for row in rows} == {
        str(partition_of(addr, 4)) for addr in binds}
    assert fleet("dead", redis_url=redis_url, env=worker_env).stdout.endswith(
        "0 dead letter(s) shown (4 partitions)\n")
    site.configure({})
    res = fleet("retry", "--all", redis_url=redis_url, env=worker_env)
    assert res.returncode == 0, res.stderr
    assert "retried 4 failed request(s)" in res.stdout
    assert sorted(crawl("b")) == failing
    assert json.loads(fleet("failed", "--json", redis_url=redis_url,
                            env=worker_env).stdout) == []
