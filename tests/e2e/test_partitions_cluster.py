"""A partitioned crawl on a 3-master Redis Cluster (issue 21): the partitions spread over
the masters by slot, real workers crawl every page, the commands read every master."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from redisdeploy import RedisClusterSet
from support import TEST_PROJECT, read_items, run_scrapy, start_worker, tail, wait_all

from scrapy_fleet.keys import CrawlKeys
from testsite import generate_site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as deployment:
        yield deployment


def run_crawl(cluster, site_factory, worker_env, tmp_path, hosts: int, pages: int,
              workers: int, parts: int, crawl: str) -> None:
    binds = [f"127.0.0.{10 + i}" for i in range(hosts)]
    generate_site(tmp_path / "www", pages, 1, seed=5)
    site = site_factory(tmp_path / "www", binds=binds)
    urls = [f"{base}site/p/{i}.html" for base in site.urls for i in range(pages)]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    common = ["-s", f"FLEET_REDIS_URL={cluster.url}", "-s", f"FLEET_PARTITIONS={parts}",
              "-s", f"FLEET_CRAWL_ID={crawl}"]
    res = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), *common],
                     worker_env)
    assert res.returncode == 0, res.stderr
    assert f"pushed {len(urls)}, duplicates 0" in res.stdout

    keys = CrawlKeys("fleet", crawl)
    masters = {cluster.master_port_of(k.stats) for k in keys.all_partitions(parts)}
    assert len(masters) == 3  # the crawl's keys are on every master
    res = run_scrapy(TEST_PROJECT, ["fleet", "shards", "fetch", *common], worker_env)
    assert res.returncode == 0, res.stderr
    for port in masters:
        assert f"127.0.0.1:{port}: {parts // 3} partition(s)" in res.stdout, res.stdout

    outs = [tmp_path / f"out-{i}.jsonl" for i in range(workers)]
    logs = [tmp_path / f"w-{i}.log" for i in range(workers)]
    settings = {"FLEET_REDIS_URL": cluster.url, "FLEET_IDLE_TIMEOUT": 2,
                "FLEET_PARTITIONS": parts, "FLEET_CRAWL_ID": crawl}
    procs = [start_worker(TEST_PROJECT, "fetch", {**settings, "FLEET_JSONL_PATH": outs[i]},
                          worker_env, logs[i]) for i in range(workers)]
    assert wait_all(procs, 600) == [0] * workers, tail(logs[0])
    assert sorted(item["url"] for item in read_items(outs)) == sorted(urls)

    res = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", "--json", *common],
                     worker_env)
    status = json.loads(res.stdout)
    assert status["counters"]["acked"] == len(urls) and status["queued"] == 0
    assert {row["node"] for row in status["per_partition"]} == {
        f"127.0.0.1:{port}" for port in masters}


def test_partitioned_crawl_on_three_masters(cluster, site_factory, worker_env, tmp_path):
    run_crawl(cluster, site_factory, worker_env, tmp_path, hosts=6, pages=20, workers=2,
              parts=6, crawl="small")


@pytest.mark.skipif(not os.environ.get("FLEET_TEST_FULL"),
                    reason="the issue's full run (24 hosts x 100 pages): FLEET_TEST_FULL=1")
def test_issue_run_four_workers_twelve_partitions(cluster, site_factory, worker_env,
                                                  tmp_path):
    run_crawl(cluster, site_factory, worker_env, tmp_path, hosts=24, pages=100, workers=4,
              parts=12, crawl="issue")
