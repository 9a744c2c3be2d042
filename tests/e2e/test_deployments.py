"""Crawls on real Redis deployments: Cluster (3 masters + 3 replicas), Sentinel (a master, a
replica, 3 sentinels), TLS with a CA made here, an ACL user with the documented rule.

For each: a 3-worker crawl of a generated site itemises every page (at-least-once: repeats
are counted and bounded).  For the failovers, the master that holds the crawl's keys is
SIGKILLed mid-crawl; its replica takes over and the crawl still itemises every page.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redisdeploy import RedisClusterSet, SentinelSet, TlsFiles, TlsRedis
from support import (
    EXAMPLE_PROJECT,
    TEST_PROJECT,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
)

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSet]:
    with RedisClusterSet(tmp_path_factory.mktemp("cluster")) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles
              ) -> Iterator[TlsRedis]:
    with TlsRedis(tmp_path_factory.mktemp("tlsredis"), tls_files) as server:
        yield server


def _site(tmp_path: Path, site_factory: Callable[..., Any], pages: int, delay: float) -> Any:
    paths = generate_site(tmp_path / "www", pages, 5, seed=7)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": delay}]})
    site.expected_paths = paths
    site.start_path = "/site/"
    return site


def push(url: str, start_url: str, env: dict[str, str], crawl: str = "docs",
         wait_replicas: int = 0) -> None:
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", start_url, "-s",
                                          f"FLEET_REDIS_URL={url}", "-s",
                                          f"FLEET_CRAWL_ID={crawl}", "-s",
                                          f"FLEET_REDIS_WAIT_REPLICAS={wait_replicas}"], env)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "pushed 1," in result.stdout, result.stdout
    assert "warning" not in result.stderr, result.stderr


def crawl(tmp_path: Path, url: str, env: dict[str, str], workers: int = 3,
          crawl_id: str = "docs", extra: dict[str, Any] | None = None,
          during: Callable[[list[Path]], None] | None = None, timeout: float = 80.0,
          ) -> tuple[list[dict[str, Any]], list[Path]]:
    """Run *workers* workers to the end; *during(item files)* runs while they crawl.
    Returns (every item, the worker logs); every worker must exit 0."""
    outs = [tmp_path / f"{crawl_id}-out-{n}.jsonl" for n in range(workers)]
    logs = [tmp_path / f"{crawl_id}-worker-{n}.log" for n in range(workers)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(workers):
            # idle 1 s (fleet-wide: nothing queued, leased or deferred); the failovers give
            # their own window
            settings: dict[str, Any] = {"FLEET_REDIS_URL": url, "FLEET_IDLE_TIMEOUT": 1,
                                        "FLEET_JSONL_PATH": outs[n],
                                        "FLEET_CRAWL_ID": crawl_id}
            settings.update(extra or {})
            procs.append(start_worker(EXAMPLE_PROJECT, "docs", settings, env, logs[n]))
        if during is not None:
            during(outs)
        codes = wait_all(procs, timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for n, code in enumerate(codes):
        assert code == 0, f"worker {n} exited {code}:\n{tail(logs[n])}"
    return read_items(outs), logs


def wait_items(outs: list[Path], count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(read_items(outs, growing=True)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} items after {timeout} s"
        time.sleep(0.05)


def repeats(items: list[dict[str, Any]]) -> int:
    return sum(n - 1 for n in collections.Counter(i["url"] for i in items).values())


def drained(url: str, crawl_id: str = "docs") -> dict[str, Any]:
    admin = FrontierAdmin(url, crawl_id)
    try:
        status = admin.status()
    finally:
        admin.close()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    return status


# -- Redis Cluster ------------------------------------------------------------------------------


def test_two_crawls_on_a_cluster_each_itemise_every_page(cluster, site_factory, worker_env,
                                                         tmp_path):
    site = _site(tmp_path, site_factory, pages=40, delay=0.0)
    url = cluster.one_node_url  # any one node: the client discovers the others
    # two crawls whose hash tags live on different masters: keys spread over the nodes
    first, second = "docs", next(
        f"docs-{n}" for n in range(100)
        if cluster.master_port_of(CrawlKeys("fleet", f"docs-{n}").stats)
        != cluster.master_port_of(CrawlKeys("fleet", "docs").stats))
    for crawl_id in (first, second):
        push(url, site.start_url, worker_env, crawl_id)
    for crawl_id in (first, second):
        if crawl_id == second:  # what promoted replicas and restarted nodes look like:
            for port in cluster.alive_ports():  # no scripts; NOSCRIPT makes redis-py load them
                redis.Redis(port=port).script_flush()
        items, _ = crawl(tmp_path, url, worker_env, workers=2, crawl_id=crawl_id)
        urls = [i["url"] for i in items]
        assert set(urls) == site.expected_urls
        assert repeats(items) == 0  # no failure, no repeat
        status = drained(url, crawl_id)
        assert status["counters"]["acked"] == status["counters"]["pushed"]
    # each crawl's keys are on its own master only
    for crawl_id in (first, second):
        holder = cluster.master_port_of(CrawlKeys("fleet", crawl_id).stats)
        for port in cluster.alive_ports():
            client = redis.Redis(port=port)
            role = client.info("replication")["role"]
            found = list(client.scan_iter(match=CrawlKeys("fleet", crawl_id).pattern))
            if role == "master":
                assert bool(found) == (port == holder), (crawl_id, port)
    # status and purge target the crawl's node
    scrapy_status = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "-s",
                                                 f"FLEET_REDIS_URL={url}", "-s",
                                                 f"FLEET_CRAWL_ID={second}"], worker_env)
    assert scrapy_status.returncode == 0, scrapy_status.stderr
    assert "due 0" in scrapy_status.stdout
    dead = run_scrapy(EXAMPLE_PROJECT, ["fleet", "dead", "docs", "-s",
                                        f"FLEET_REDIS_URL={url}", "-s",
                                        f"FLEET_CRAWL_ID={second}"], worker_env)
    assert dead.returncode == 0 and "0 dead letter(s) shown" in dead.stdout, dead.stderr
    purged = run_scrapy(EXAMPLE_PROJECT, ["fleet", "purge", "docs", "--yes", "-s",
                                          f"FLEET_REDIS_URL={url}", "-s",
                                          f"FLEET_CRAWL_ID={second}"], worker_env)
    assert purged.returncode == 0, purged.stderr
    admin = FrontierAdmin(url, second)
    assert admin.crawl_keys() == []
    admin.close()
    assert FrontierAdmin(url, first).crawl_keys()  # the other crawl is untouched


@pytest.mark.parametrize("lag", [0.0, 1.0], ids=["replica-in-sync", "replica-lagging"])
def test_cluster_master_failover_mid_crawl_itemises_every_page(cluster, site_factory,
                                                               worker_env, tmp_path, lag):
    """*lag*: the replica is cut off that many seconds before the master is killed, so that
    it misses the master's last writes (leases, acknowledgements, pushes of links) and is
    promoted with the crawl as it was *lag* seconds earlier: what asynchronous replication
    loses in a failover, made large enough to count."""
    site = _site(tmp_path, site_factory, pages=80, delay=0.3)
    crawl_id = f"failover-{int(lag * 10)}"
    push(cluster.url, site.start_url, worker_env, crawl_id)
    key = CrawlKeys("fleet", crawl_id).stats
    killed: dict[str, Any] = {}

    def kill_master(outs: list[Path]) -> None:
        wait_items(outs, 15)
        killed["old"] = cluster.master_port_of(key)
        replica = cluster.procs[cluster.replica_of(killed["old"])]
        if lag:
            # freeze the replica, then cut its link: what the master writes from now on
            # reaches no replica (on loopback a frozen replica would still get it all, in
            # its socket buffer), so it dies with the master
            os.kill(replica.pid, signal.SIGSTOP)
            redis.Redis(port=killed["old"]).client_kill_filter(_type="slave")
            time.sleep(lag)
        killed["items_before"] = len(read_items(outs, growing=True))
        cluster.kill(killed["old"])
        if lag:
            os.kill(replica.pid, signal.SIGCONT)
        killed["new"] = cluster.wait_failover(killed["old"], key)

    items, logs = crawl(tmp_path, cluster.url, worker_env, crawl_id=crawl_id,
                        extra={"FLEET_LEASE_TIMEOUT": 5, "CONCURRENT_REQUESTS": 2,
                               "FLEET_IDLE_TIMEOUT": 6},
                        during=kill_master)
    assert killed["new"] != killed["old"]
    assert killed["items_before"] < len(site.expected_urls)  # killed mid-crawl
    urls = [i["url"] for i in items]
    assert set(urls) == site.expected_urls  # every page, despite the failover
    # at-least-once: repeats come from writes the old master acknowledged but had not yet
    # sent to its replica (leases, acknowledgements), bounded by what the 3 workers held
    # (CONCURRENT_REQUESTS + FLEET_PREFETCH each) plus what they leased during the lag
    lost = sum(int(m) for log in logs for m in re.findall(
        r"'fleet/frontier/lease_lost': (\d+)", tail(log, 200000)))
    print(f"cluster failover (lag {lag} s): {len(set(urls))} pages, {repeats(items)} repeats, "
          f"{lost} leases lost, {killed['items_before']} items before the kill")
    assert repeats(items) <= 3 * (2 + 16) + killed["items_before"]
    drained(cluster.url, crawl_id)
    # the outage was seen, and logged once (outage.py)
    assert any("(logged once per outage)" in tail(log, 200000) for log in logs)


# -- Sentinel -----------------------------------------------------------------------------------


@pytest.mark.parametrize("lag", [0.0, 1.0], ids=["replica-in-sync", "replica-lagging"])
def test_sentinel_failover_mid_crawl_itemises_every_page(site_factory, worker_env, tmp_path,
                                                         lag):
    """Real sentinels promote the replica after the master is SIGKILLed mid-crawl (*lag*: as
    in the cluster test, the replica is cut off that many seconds before)."""
    site = _site(tmp_path, site_factory, pages=80, delay=0.3)
    with SentinelSet(tmp_path / "sentinel", replicas=1) as sentinel:
        push(sentinel.url, site.start_url, worker_env, wait_replicas=1)
        killed: dict[str, int] = {}

        def kill_master(outs: list[Path]) -> None:
            wait_items(outs, 15)
            killed["old"] = sentinel.current_master_port()
            replica = sentinel.procs[sentinel.replica_ports[0]]
            if lag:
                os.kill(replica.pid, signal.SIGSTOP)
                redis.Redis(port=killed["old"]).client_kill_filter(_type="slave")
                time.sleep(lag)
            killed["items_before"] = len(read_items(outs, growing=True))
            sentinel.kill(killed["old"])
            if lag:
                os.kill(replica.pid, signal.SIGCONT)
            killed["new"] = sentinel.wait_failover(killed["old"])

        items, logs = crawl(tmp_path, sentinel.url, worker_env,
                            extra={"FLEET_LEASE_TIMEOUT": 5, "CONCURRENT_REQUESTS": 2,
                                   "FLEET_IDLE_TIMEOUT": 6},
                            during=kill_master)
        assert killed["new"] in sentinel.replica_ports
        assert killed["items_before"] < len(site.expected_urls)  # killed mid-crawl
        urls = [i["url"] for i in items]
        assert set(urls) == site.expected_urls
        lost = sum(int(m) for log in logs for m in re.findall(
            r"'fleet/frontier/lease_lost': (\d+)", tail(log, 200000)))
        print(f"sentinel failover (lag {lag} s): {len(set(urls))} pages, {repeats(items)} "
              f"repeats, {lost} leases lost, {killed['items_before']} items before the kill")
        assert repeats(items) <= 3 * (2 + 16) + killed["items_before"]
        drained(sentinel.url)


def test_wait_replicas_reports_a_push_no_replica_has(tmp_path):
    """FLEET_REDIS_WAIT_REPLICAS: WAIT after a push, on the connection that pushed.  With the
    replica frozen (SIGSTOP) the push is reported unreplicated; a WAIT sent on another
    connection (no writes of its own) would return at once and report nothing."""
    with SentinelSet(tmp_path / "sentinel", replicas=1) as sentinel:
        admin = FrontierAdmin(sentinel.url, "waits", wait_replicas=1, timeout=2.0)
        admin.push([(b"a" * 12, 0, b"x", 0, "h")])
        assert admin.unreplicated == 0
        replica = redis.Redis(port=sentinel.replica_ports[0])
        assert replica.get(CrawlKeys("fleet", "waits").queue_count) == b"1"  # there already
        os.kill(sentinel.procs[sentinel.replica_ports[0]].pid, signal.SIGSTOP)
        try:
            # it waited for the replica: its connection was seen blocked in WAIT (CLIENT
            # LIST: cmd=wait, flag b) while the push was under way, by another connection
            master = redis.Redis(port=sentinel.master_port)
            pusher = threading.Thread(target=admin.push, args=([(b"b" * 12, 0, b"y", 0, "h")],))
            pusher.start()
            blocked = []
            while pusher.is_alive() and not blocked:
                blocked = [c for c in master.client_list()
                           if c["cmd"] == "wait" and "b" in c["flags"]]
                time.sleep(0.01)
            pusher.join()
            master.close()
            assert admin.unreplicated == 1
            assert len(blocked) == 1, "the push did not wait for the replica"
        finally:
            os.kill(sentinel.procs[sentinel.replica_ports[0]].pid, signal.SIGCONT)
        admin.push([(b"c" * 12, 0, b"z", 0, "h")])
        assert admin.unreplicated == 1
        assert admin.status()["queued"] == 3
        admin.close()


def test_a_worker_reports_start_requests_no_replica_has(site_server, worker_env, tmp_path):
    with SentinelSet(tmp_path / "sentinel", replicas=1) as sentinel:
        replica = sentinel.procs[sentinel.replica_ports[0]]
        logs = []
        for frozen in (False, True):
            log = tmp_path / f"starts-{frozen}.log"
            logs.append(log)
            if frozen:
                os.kill(replica.pid, signal.SIGSTOP)
            try:
                proc = start_worker(TEST_PROJECT, "starts", {
                    "FLEET_REDIS_URL": sentinel.url, "FLEET_IDLE_TIMEOUT": 1,
                    "FLEET_REDIS_WAIT_REPLICAS": 1, "FLEET_CRAWL_ID": f"starts-{frozen}",
                    "FLEET_JSONL_PATH": tmp_path / f"starts-{frozen}.jsonl"},
                    worker_env, log, spider_args={"start": site_server.start_url})
                assert wait_all([proc], 60) == [0], tail(log)
            finally:
                if frozen:
                    os.kill(replica.pid, signal.SIGCONT)
            items = read_items([tmp_path / f"starts-{frozen}.jsonl"])
            assert [i["url"] for i in items] == [site_server.start_url]
        healthy, stalled = (tail(log, 100000) for log in logs)
        assert "not acknowledged by FLEET_REDIS_WAIT_REPLICAS=1" not in healthy
        assert "'fleet/redis/unreplicated'" not in healthy
        assert "not acknowledged by FLEET_REDIS_WAIT_REPLICAS=1" in stalled, stalled
        assert "'fleet/redis/unreplicated': 1" in stalled, stalled


# -- TLS ----------------------------------------------------------------------------------------


def test_crawl_over_tls_with_a_client_certificate(tls_redis, site_factory, worker_env,
                                                  tmp_path):
    site = _site(tmp_path, site_factory, pages=30, delay=0.0)
    url = tls_redis.url()
    push(url, site.start_url, worker_env)
    items, logs = crawl(tmp_path, url, worker_env, workers=2)
    assert {i["url"] for i in items} == site.expected_urls
    assert repeats(items) == 0
    drained(url)
    for log in logs:
        assert "verification is off" not in tail(log, 200000)


def test_crawl_on_a_tls_cluster(tls_files, site_factory, worker_env, tmp_path):
    """``rediss+cluster://``: clients, cluster bus and replication over TLS."""
    site = _site(tmp_path, site_factory, pages=30, delay=0.0)
    with RedisClusterSet(tmp_path / "tlscluster", tls=tls_files) as cluster:
        assert cluster.url.startswith("rediss+cluster://")
        push(cluster.url, site.start_url, worker_env)
        items, _ = crawl(tmp_path, cluster.url, worker_env, workers=2)
        assert {i["url"] for i in items} == site.expected_urls
        assert repeats(items) == 0
        drained(cluster.url)
        # plain connections are refused: the nodes speak TLS only
        with pytest.raises(redis.ConnectionError):
            redis.Redis(port=cluster.ports[0], socket_timeout=2).ping()


def _start_only(tmp_path: Path, url: str, env: dict[str, str], name: str) -> tuple[int, str]:
    """Start one worker on an empty frontier and let it stop; (exit code, log)."""
    log = tmp_path / f"{name}.log"
    proc = start_worker(EXAMPLE_PROJECT, "docs", {"FLEET_REDIS_URL": url,
                                                  "FLEET_IDLE_TIMEOUT": 1}, env, log)
    code = wait_all([proc], 60)[0]
    return code, tail(log, 100000)


def test_a_wrong_ca_is_one_clear_error_at_start(tls_redis, tls_files, worker_env, tmp_path):
    code, text = _start_only(tmp_path, tls_redis.url(ca=tls_files.other_ca), worker_env,
                             "wrong-ca")
    assert code == 1
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "TLS certificate that cannot be verified" in errors[0]
    assert "ssl_ca_certs" in errors[0]
    assert "Traceback" not in text
    # no CA given: the system's CAs do not know the test CA either; never unverified
    code, text = _start_only(tmp_path, tls_redis.url(client=True).split("?")[0] + "?" +
                             tls_redis.url().split("?", 1)[1].replace(
                                 f"ssl_ca_certs={tls_files.ca}&", ""), worker_env, "no-ca")
    assert code == 1 and "cannot be verified" in text, text
    # the command line tools say the same in one line
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "-s",
                                          f"FLEET_REDIS_URL={tls_redis.url(ca=tls_files.other_ca)}"],
                        worker_env)
    assert result.returncode == 2
    assert "cannot be verified" in result.stderr and "Traceback" not in result.stderr


def test_unverified_tls_only_when_asked_and_with_a_warning(tls_redis, tls_files, worker_env,
                                                          tmp_path):
    url = tls_redis.url(ca=tls_files.other_ca, ssl_cert_reqs="none", ssl_check_hostname="false")
    code, text = _start_only(tmp_path, url, worker_env, "unverified")
    assert code == 0, text
    warnings = [line for line in text.splitlines() if "verification is off" in line]
    assert len(warnings) == 1 and " WARNING: " in warnings[0], text
    # a TLS option on a plain URL, or a CA file that does not exist: one error, at start
    plain = f"redis://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_files.ca}"
    for n, (bad, fragment) in enumerate(((plain, "rediss://"),
                          (tls_redis.url(ca=tmp_path / "missing.crt"), "no such file"))):
        code, text = _start_only(tmp_path, bad, worker_env, f"bad-{n}")
        assert code == 1
        errors = [line for line in text.splitlines() if " ERROR: " in line]
        assert len(errors) == 1 and fragment in errors[0], text
