"""``crawls``, ``url``, ``hosts``, ``urls`` and ``host drop`` (commands/lookup.py,
commands/host.py) on a 3-master Redis Cluster: ``crawls`` scans every master, and the
partitions of a P = 3 crawl, one a master, are each read where they live."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from redisdeploy import RedisClusterSet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as deployment:
        yield deployment


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis", url,
                           *args], capture_output=True, text=True, timeout=120)


def test_the_reads_and_the_drop_on_a_cluster(cluster):
    url = cluster.url
    hosts = [f"h{i}.test" for i in range(6)]
    urls = [f"http://{h}/{n}" for h in hosts for n in range(5)]
    for crawl, parts in (("one", "1"), ("three", "3")):
        pushed = cli(url, "--partitions", parts, "push", crawl, *urls)
        assert pushed.returncode == 0, pushed.stderr
    listed = cli(url, "crawls", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["crawl"]: r for r in json.loads(listed.stdout)}
    assert rows == {"one": {"crawl": "one", "partitions": 1, "pushed": 30, "queued": 30},
                    "three": {"crawl": "three", "partitions": 3, "pushed": 30, "queued": 30}}
    where = cli(url, "url", "three", urls[7], "http://h0.test/none", "--json")
    assert where.returncode == 0, where.stderr
    assert [r["state"] for r in json.loads(where.stdout)] == ["queued", "never_seen"]
    listing = cli(url, "hosts", "three", "--json")
    assert {r["host"]: r["queued"] for r in json.loads(listing.stdout)["hosts"]} == \
        dict.fromkeys(hosts, 5)
    page = cli(url, "urls", "three", "--host", "h2.test", "--json")
    assert [r["url"] for r in json.loads(page.stdout)["urls"]] == urls[10:15]
    dropped = cli(url, "host", "drop", "three", "h2.test", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    listing = cli(url, "hosts", "three", "--json")
    assert json.loads(listing.stdout)["total"]["queued"] == 25
