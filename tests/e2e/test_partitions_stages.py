"""Fetch and parse stages (FLEET_ROLE, docs/stages.md) on a partitioned crawl
(FLEET_PARTITIONS > 1, docs/partitions.md): the stored responses live in the partition of
the pseudo-host ``~parse``, the requests in their hosts' partitions.

Real workers, a real Redis server, a generated site on several loopback hosts.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from support import TEST_PROJECT, read_items, run_scrapy, start_site, start_worker, tail, wait_all

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import STAGE_HOST, CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from testsite import generate_site

PARTS = 4


def worker(tmp_path: Path, name: str, redis_url: str, env: dict[str, str],
           **settings: Any) -> tuple[Any, Path, Path]:
    out, log = tmp_path / f"out-{name}.jsonl", tmp_path / f"{name}.log"
    base = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 4, "FLEET_JSONL_PATH": out,
            "FLEET_LEASE_TIMEOUT": 3, "FLEET_PARTITIONS": PARTS}
    base.update(settings)
    return start_worker(TEST_PROJECT, "staged", base, env, log, {"burn": 0}), out, log


def push(tmp_path: Path, redis_url: str, env: dict[str, str]) -> None:
    """``scrapy fleet push`` of tmp_path/urls.txt into the crawl, P = PARTS."""
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "staged", "-f", str(tmp_path / "urls.txt"),
                                       "-s", f"FLEET_REDIS_URL={redis_url}",
                                       "-s", f"FLEET_PARTITIONS={PARTS}"], env)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr


@pytest.mark.slow
def test_fetch_and_parse_workers_on_a_partitioned_crawl(tmp_path: Path, redis_url: str,
                                                        worker_env: dict[str, str]) -> None:
    """Two fetch workers and a parse worker, P = 4, pages on three hosts (partitions apart
    from the stored responses'): every page fetched once and itemised once, from its stored
    response, and the response queue empty at the end."""
    paths = generate_site(tmp_path / "www", 40, 4, seed=5)
    site = start_site(tmp_path / "www", tmp_path / "site.log",
                      binds=[f"127.0.0.{20 + i}" for i in range(3)])
    expected = {base.rstrip("/") + p for base in site.urls for p in paths} | {
        base + "site/files/notes.txt" for base in site.urls}
    (tmp_path / "urls.txt").write_text("".join(f"{base}site/\n" for base in site.urls))
    keys = CrawlKeys("fleet", "staged")
    try:
        push(tmp_path, redis_url, worker_env)
        procs = [worker(tmp_path, f"fetch-{n}", redis_url, worker_env, FLEET_ROLE="fetch")
                 for n in range(2)]
        procs.append(worker(tmp_path, "parse-0", redis_url, worker_env, FLEET_ROLE="parse"))
        codes = wait_all([p for p, _, _ in procs], 240)
        assert codes == [0, 0, 0], "".join(tail(log) for _, _, log in procs)
    finally:
        site.stop()
    items = read_items([o for _, o, _ in procs])
    urls = collections.Counter(i["url"] for i in items)
    assert set(urls) == expected and max(urls.values()) == 1, urls.most_common(3)
    assert all(i["stored"] for i in items)
    assert {i["pid"] for i in items} == {procs[2][0].pid}  # parsed by the parse worker only
    # every page fetched once (and each host's link to a missing page, a 404 without item)
    fetched = collections.Counter(f"http://{r['host']}{r['path']}" for r in site.requests())
    missing = {base + "site/p/missing.html" for base in site.urls}
    assert set(fetched) == expected | missing and max(fetched.values()) == 1, fetched
    client = FrontierAdmin(redis_url, "staged").client
    stage = keys.partition(partition_of(STAGE_HOST, PARTS), PARTS)
    assert int(client.hget(stage.hostq, STAGE_HOST) or 0) == 0
    assert client.hget(stage.stats, "response_queue_bytes") in (b"0", None)


@pytest.mark.slow
def test_the_response_queue_bound_holds_when_stored_responses_go_to_another_partition(
        tmp_path: Path, redis_url: str, worker_env: dict[str, str]) -> None:
    """A fetch worker whose pages are all in other partitions than the stored responses'
    (pushed there by lean calls) still stops leasing at FLEET_RESPONSE_QUEUE_MAX."""
    stage_p = partition_of(STAGE_HOST, PARTS)
    binds = [a for a in (f"127.0.0.{i}" for i in range(20, 40))
             if partition_of(a, PARTS) != stage_p][:3]
    paths = generate_site(tmp_path / "www", 20, 4, seed=5)
    site = start_site(tmp_path / "www", tmp_path / "site.log", binds=binds)
    expected = {base.rstrip("/") + p for base in site.urls for p in paths}
    (tmp_path / "urls.txt").write_text("\n".join(sorted(expected)) + "\n")
    keys = CrawlKeys("fleet", "staged")
    stage = keys.partition(stage_p, PARTS)
    client = FrontierAdmin(redis_url, "staged").client
    started: list[subprocess.Popen[bytes]] = []  # (killed if the test fails: no orphan)
    try:
        push(tmp_path, redis_url, worker_env)
        fetch, _, flog = worker(tmp_path, "fetch-0", redis_url, worker_env, FLEET_ROLE="fetch",
                                FLEET_RESPONSE_QUEUE_MAX=5, CONCURRENT_REQUESTS=2)
        started.append(fetch)
        # the most stored responses seen, read all along: until the queue is full, then 3 s
        # more (it must stop leasing: the queue stays bounded)
        stored, full_at = 0, None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (full_at is None or time.monotonic() < full_at + 3):
            stored = max(stored, int(client.hget(stage.hostq, STAGE_HOST) or 0))
            if stored >= 5 and full_at is None:
                full_at = time.monotonic()
            time.sleep(0.01)
        # the bound: the worker leases only while it sees fewer than 5 (at most 4, its own
        # stored responses waiting for their lean push included); the call that takes its
        # last leases also acknowledges the pages done since the one before (at most the 3
        # leases it held), and it holds 3 leases at most (CONCURRENT_REQUESTS 2 and a
        # quarter more, pushed requests in the start hook included: they were not, and the
        # worker held 6 and stored 12)
        assert 5 <= stored <= 4 + 3 + 3, (stored, tail(flog))
        procs = [(fetch, tmp_path / "out-fetch-0.jsonl", flog),
                 worker(tmp_path, "parse-0", redis_url, worker_env, FLEET_ROLE="parse")]
        started.append(procs[1][0])
        assert wait_all([p for p, _, _ in procs], 180) == [0, 0], tail(procs[1][2])
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        site.stop()
    items = read_items([tmp_path / "out-parse-0.jsonl"])
    # (the pages link to a text file too, found by the parse worker)
    assert {i["url"] for i in items} == expected | {base + "site/files/notes.txt"
                                                    for base in site.urls}
    assert int(client.hget(stage.hostq, STAGE_HOST) or 0) == 0
    assert client.hget(stage.stats, "response_queue_bytes") in (b"0", None)


def held_by(client: Any, keys: CrawlKeys, worker_id: str) -> int:
    """Leases *worker_id* holds in every partition (the lease hash: ``token|score|host\t
    worker``, ``!worker`` once its download is over)."""
    return sum(v.rsplit(b"\t", 1)[-1].lstrip(b"!") == worker_id.encode()
               for k in keys.all_partitions(PARTS) for v in client.hvals(k.lease))


@pytest.mark.slow
def test_a_fetch_worker_stalled_past_its_leases_gets_no_page_parsed_twice(
        tmp_path: Path, redis_url: str, worker_env: dict[str, str]) -> None:
    """A fetch worker stopped (SIGSTOP) for longer than FLEET_LEASE_TIMEOUT while stored
    responses wait in its buffer for their partition (FLEET_PARTITION_FLUSH = 2 s): its
    pages are fetched again by the other fetch worker; once it goes on (SIGCONT), its stored
    responses reach their partition and its acknowledgements are refused, and the responses
    of its requests in flight come in after it learned their leases were lost.  Every page
    is itemised once, by the parse worker (it was 74 items for 66 pages): a page's first
    stored response is kept, a later one of the same entry dropped (counted
    ``stored_again``), and a response whose lease was lost neither stored nor parsed by the
    fetch worker (it was, with the spider's callback, when the worker had leased the same
    entry again)."""
    stage_p = partition_of(STAGE_HOST, PARTS)
    binds = [a for a in (f"127.0.0.{i}" for i in range(20, 40))
             if partition_of(a, PARTS) != stage_p][:3]
    paths = generate_site(tmp_path / "www", 30, 4, seed=5)
    site = start_site(tmp_path / "www", tmp_path / "site.log", binds=binds)
    site.configure({"delays": [{"prefix": "/site/p/", "seconds": 0.1, "host": None}]})
    expected = {base.rstrip("/") + p for base in site.urls for p in paths} | {
        base + "site/files/notes.txt" for base in site.urls}
    (tmp_path / "urls.txt").write_text("".join(f"{base}site/\n" for base in site.urls))
    keys = CrawlKeys("fleet", "staged")
    started: list[subprocess.Popen[bytes]] = []  # (killed if the test fails: no orphan)
    try:
        push(tmp_path, redis_url, worker_env)
        procs = [worker(tmp_path, f"fetch-{n}", redis_url, worker_env, FLEET_ROLE="fetch",
                        FLEET_PARTITION_FLUSH=2, FLEET_LEASE_TIMEOUT=2,
                        FLEET_WORKER_ID=f"fetch-{n}")
                 for n in range(2)]
        procs.append(worker(tmp_path, "parse-0", redis_url, worker_env, FLEET_ROLE="parse"))
        started.extend(p for p, _, _ in procs)
        stalled = procs[0][0]
        client = FrontierAdmin(redis_url, "staged").client
        deadline = time.monotonic() + 60
        while held_by(client, keys, "fetch-0") < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        # (pages in flight, or fetched with their stored responses waiting in its buffer)
        stalled.send_signal(signal.SIGSTOP)
        time.sleep(4)
        stalled.send_signal(signal.SIGCONT)
        codes = wait_all([p for p, _, _ in procs], 240)
        assert codes == [0, 0, 0], "".join(tail(log) for _, _, log in procs)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
        site.stop()
    items = read_items([o for _, o, _ in procs])
    urls = collections.Counter(i["url"] for i in items)
    stage = keys.partition(stage_p, PARTS)
    assert set(urls) == expected and max(urls.values()) == 1, urls.most_common(3)
    # (and none by a fetch worker: a response whose lease it lost meanwhile is dropped)
    assert all(i["stored"] for i in items) and {i["pid"] for i in items} == {procs[2][0].pid}
    assert int(client.hget(stage.hostq, STAGE_HOST) or 0) == 0
    assert client.hget(stage.stats, "response_queue_bytes") in (b"0", None)
    # pages fetched twice (the stalled worker's leases lost), their second response dropped
    fetched = collections.Counter(f"http://{r['host']}{r['path']}" for r in site.requests())
    again = sum(n - 1 for n in fetched.values())
    assert int(client.hget(stage.stats, "stored_again") or 0) <= again
    # the stall was felt: pages fetched twice, or (the stall guard, frontier/liveness.py) the
    # stalled worker held back or dropped the requests whose leases it lost, unsent
    stalled_log = procs[0][2].read_text(encoding="utf-8", errors="replace")
    assert again >= 1 or "fleet/frontier/revalidated" in stalled_log, tail(procs[0][2])
