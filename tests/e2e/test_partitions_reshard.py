"""A partition moved to another master during a crawl (issue 21, docs/partitions.md "moving
partitions"): its one slot migrated by hand (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE a
few keys at a time, SETSLOT NODE), as ``redis-cli --cluster reshard`` does, while real workers
crawl.  Calls meeting the half-moved slot get ASK or TRYAGAIN and are sent again by redis-py
as they were (the same op id: a replay, never a second run); nothing is lost or done twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redisdeploy import RedisClusterSet
from support import (
    TEST_PROJECT,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.redis_client import make_client
from testsite import generate_site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as deployment:
        yield deployment


def masters(cluster: RedisClusterSet) -> list[int]:
    return [p for p in cluster.alive_ports()
            if cluster.node(p, 2).info("replication")["role"] == "master"]


class SlotMove:
    """Moving *slot* from the master on *src* to the one on *dst* by hand, in steps the test
    drives (as ``redis-cli --cluster reshard`` does, all at once): :meth:`begin` (SETSLOT
    IMPORTING / MIGRATING), :meth:`migrate` (MIGRATE *batch* keys at a time), :meth:`finish`
    (the rest, then SETSLOT NODE on every master)."""

    def __init__(self, cluster: RedisClusterSet, slot: int, src: int, dst: int,
                 batch: int = 4) -> None:
        self.cluster, self.slot, self.src, self.dst, self.batch = cluster, slot, src, dst, batch
        self.moved = 0
        self.src_node, self.dst_node = cluster.node(src, 10), cluster.node(dst, 10)
        self.dst_id = self.dst_node.execute_command("CLUSTER MYID").decode()

    def begin(self) -> None:
        src_id = self.src_node.execute_command("CLUSTER MYID").decode()
        self.dst_node.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", src_id)
        self.src_node.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.dst_id)

    def migrate(self, batches: int | None = None) -> int:
        """MIGRATE up to *batches* batches of keys (None: until none is left); the keys left."""
        while batches is None or batches > 0:
            keys = self.src_node.execute_command("CLUSTER GETKEYSINSLOT", self.slot, self.batch)
            if not keys:
                break
            self.src_node.execute_command("MIGRATE", "127.0.0.1", self.dst, "", 0, 5000,
                                          "KEYS", *keys)
            self.moved += len(keys)
            batches = None if batches is None else batches - 1
        return int(self.src_node.execute_command("CLUSTER COUNTKEYSINSLOT", self.slot))

    def finish(self) -> None:
        self.migrate()
        for port in masters(self.cluster):
            self.cluster.node(port, 10).execute_command("CLUSTER SETSLOT", self.slot, "NODE",
                                                        self.dst_id)


def redirects(cluster: RedisClusterSet, ports: list[int],
              names: tuple[str, ...] = ("ASK", "TRYAGAIN")) -> int:
    """How many replies of *names* (ASK, TRYAGAIN, MOVED) the nodes on *ports* have sent
    (INFO errorstats)."""
    errors = [cluster.node(port, 5).info("errorstats") for port in ports]
    return sum(e.get(f"errorstat_{name}", {}).get("count", 0) for e in errors
               for name in names)


def test_a_partition_moved_during_a_crawl_loses_nothing(cluster, site_factory, worker_env,
                                                        tmp_path, request):
    parts, hosts, pages = 3, 6, 30
    binds = [f"127.0.0.{10 + i}" for i in range(hosts)]
    generate_site(tmp_path / "www", pages, 1, seed=5)
    site = site_factory(tmp_path / "www", binds=binds, behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 0.2, "host": None}]})
    urls = [f"{base}site/p/{i}.html" for base in site.urls for i in range(pages)]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    common = ["-s", f"FLEET_REDIS_URL={cluster.url}", "-s", f"FLEET_PARTITIONS={parts}",
              "-s", "FLEET_CRAWL_ID=moved"]
    res = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), *common],
                     worker_env)
    assert res.returncode == 0, res.stderr
    keys = CrawlKeys("fleet", "moved")
    part = keys.partition(0, parts)
    client = make_client(cluster.url, 10.0)
    slot = client.keyslot(part.stats)
    src = cluster.master_port_of(part.stats)
    dst = next(p for p in masters(cluster) if p != src)

    outs = [tmp_path / f"out-{i}.jsonl" for i in range(2)]
    logs = [tmp_path / f"w-{i}.log" for i in range(2)]
    settings = {"FLEET_REDIS_URL": cluster.url, "FLEET_IDLE_TIMEOUT": 2,
                "FLEET_PARTITIONS": parts, "FLEET_CRAWL_ID": "moved",
                "CONCURRENT_REQUESTS": 4}
    procs = [start_worker(TEST_PROJECT, "fetch", {**settings, "FLEET_JSONL_PATH": outs[i]},
                          worker_env, logs[i]) for i in range(2)]
    request.addfinalizer(lambda: [p.kill() for p in procs if p.poll() is None])  # (failed)

    def acked(skip: int | None = None) -> int:
        return sum(int(client.hget(k.stats, "acked") or 0) for k in keys.all_partitions(parts)
                   if k.part != skip)

    # the steps of the move are driven at counted points, never timed: it begins once the
    # workers acknowledged 10 pages, and the slot stays half-moved until the workers have
    # met it (a redirect counted by the nodes) and acknowledged more pages meanwhile (in the
    # other partitions: the test reads nothing of the moving one then, so that every
    # redirect counted is a worker's)
    wait_until(lambda: acked() >= 10, 120, "10 acknowledgements", interval=0.05)
    before = acked(skip=0)
    assert acked() < len(urls), tail(logs[0])
    move = SlotMove(cluster, slot, src, dst)
    met = redirects(cluster, [src, dst])
    move.begin()
    assert move.migrate(batches=3) > 0  # half-moved: some keys on each side
    wait_until(lambda: redirects(cluster, [src, dst]) > met, 240,
               "a worker's call redirected (ASK or TRYAGAIN) by the half-moved slot")
    during = wait_until(lambda: (n := acked(skip=0)) > before and n, 240,
                        "an acknowledgement while the slot is half-moved")
    move.finish()
    assert move.moved > 10
    assert cluster.master_port_of(part.stats) == dst
    assert wait_all(procs, 300) == [0, 0], tail(logs[0]) + tail(logs[1])
    # the workers went on while the slot moved, and every page was fetched once
    assert during > before
    got = [item["url"] for item in read_items(outs)]
    assert sorted(got) == sorted(urls)
    assert acked() == len(urls)
    stats = [client.hgetall(k.stats) for k in keys.all_partitions(parts)]
    assert all(int(s.get(b"stale_acks", 0)) == 0 for s in stats)
    # the partition's keys all live on their new master now
    assert client.execute_command("CLUSTER COUNTKEYSINSLOT", slot,
                                  target_nodes=client.get_node("127.0.0.1", dst)) > 0
    assert cluster.node(src, 5).execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
