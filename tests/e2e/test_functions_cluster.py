"""The frontier call's Functions library (lua/library.py) on a 3-master Redis Cluster: loaded
on every master by the first client that finds it missing, loaded again on a master that lost
it, and each FCALL routed by its keys without asking a node for them (COMMAND GETKEYS)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from redisdeploy import RedisClusterSet

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.client import AsyncFrontier
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.lua import library

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as deployment:
        yield deployment


def masters(cluster: RedisClusterSet) -> dict[int, tuple[int, int]]:
    """port -> (first slot, last slot) of each master."""
    out: dict[int, tuple[int, int]] = {}
    for start, end, master, *_ in cluster.node(cluster.ports[0]).execute_command(
            "CLUSTER", "SLOTS"):
        out[int(master[1])] = (int(start), int(end))
    return out


def has_library(cluster: RedisClusterSet, port: int) -> bool:
    node = cluster.node(port)
    try:
        return any(library.library()[0].encode() in lib for lib in node.function_list())
    finally:
        node.close()


def getkeys(cluster: RedisClusterSet) -> int:
    """COMMAND GETKEYS run on every node since the last CONFIG RESETSTAT."""
    total = 0
    for port in cluster.alive_ports():
        node = cluster.node(port)
        stats = node.info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
        node.close()
    return total


def test_the_library_on_every_master_and_the_calls_routed_by_their_keys(cluster):
    by_port = masters(cluster)
    for port in by_port:
        cluster.node(port).function_flush()
    crawls: dict[int, str] = {}  # a crawl per master (its hash tag's slot)
    n = 0
    while len(crawls) < len(by_port):
        crawl = f"fc{n}"
        n += 1
        slot = int(cluster.node(cluster.ports[0]).execute_command(
            "CLUSTER", "KEYSLOT", CrawlKeys("fleet", crawl).stats))
        port = next(p for p, (a, b) in by_port.items() if a <= slot <= b)
        crawls.setdefault(port, crawl)
    for port in cluster.alive_ports():
        cluster.node(port).config_resetstat()
    admins = {port: FrontierAdmin(cluster.url, crawl) for port, crawl in crawls.items()}
    first_port = next(iter(admins))
    got = admins[first_port].push([(os.urandom(12), 0, b"p", 0, "a.test")])
    assert got.pushed == 1
    assert all(has_library(cluster, port) for port in by_port)  # loaded on every master
    # a master that lost its library (restarted without persistence): loaded there again
    last_port = list(admins)[-1]
    cluster.node(last_port).function_flush()
    assert not has_library(cluster, last_port)
    for admin in admins.values():
        result = admin.push([(os.urandom(12), 0, b"q", 0, "b.test")])
        assert result.pushed == 1
    assert has_library(cluster, last_port)

    async def worker_calls() -> list[int]:
        out = []
        for crawl in crawls.values():
            frontier = AsyncFrontier(cluster.url, CrawlKeys("fleet", crawl), "w1:1:1",
                                     FrontierParams())
            try:
                out.append(len((await frontier.call(CallBatch(take=5))).leased))
            finally:
                await frontier.close()
        return out

    assert asyncio.run(worker_calls()) == [1 if port != first_port else 2
                                           for port in crawls]
    assert getkeys(cluster) == 0  # no call asked a node for its keys
    for admin in admins.values():
        admin.close()
