"""Bounded frontier: refusals, parking, deferral, the push helper's waits, memory warnings."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest
import redis
from scrapy import Request
from support import (
    EXAMPLE_PROJECT,
    TEST_PROJECT,
    read_items,
    run_scrapy,
    scrapy_command,
    setting_args,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from testsite import generate_site

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]


def admin_for(url: str, crawl: str = "bp", queue_max: int | None = 10,
              host_max: int | None = None, defer: float = 0.3) -> FrontierAdmin:
    return FrontierAdmin(url, crawl, params=FrontierParams(
        queue_max=queue_max, host_queue_max=host_max, defer_delay=defer))


def link(url: str, group: int = 0):
    host = url.split("/")[2]
    return bloom_key(url.encode()), 0, codec.encode(Request(url)), group, host


def url_of(entry) -> str:
    return codec.decode(entry.payload, None, DEFAULT_REQUEST_CLASSES).url


def test_pushes_without_parent_stop_at_the_cap(redis_url):
    admin = admin_for(redis_url, queue_max=5)
    result = admin.push([link(f"http://a.test/{i}") for i in range(8)])
    assert (result.pushed, result.refused) == (5, [5, 6, 7])
    assert admin.size() == 5
    # a refused URL was not added to the Bloom filter: it is new once there is room
    admin.call(CallBatch(take=2), worker="w")  # leased entries still count
    assert admin.push([link("http://a.test/7")]).refused == [0]
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    admin.call(CallBatch(acks=[(lease.entry_id, lease.token)]), worker="w")
    again = admin.push([link("http://a.test/7")])
    assert (again.pushed, again.refused) == (1, [])


def test_links_that_fit_are_pushed_with_the_acknowledgement(redis_url):
    admin = admin_for(redis_url, queue_max=10)
    admin.push([link("http://a.test/")])
    parent = admin.call(CallBatch(take=1), worker="w").leased[0]
    links = [link(f"http://a.test/{i}", group=1) for i in range(4)]
    result = admin.call(CallBatch(acks=[(parent.entry_id, parent.token)], pushes=links),
                        worker="w")
    assert (result.acked, result.pushed, result.parked) == (1, 4, 0)
    assert admin.size() == 4


def test_leftover_links_park_the_parent_until_there_is_room(redis_url):
    admin = admin_for(redis_url, queue_max=4)
    admin.push([link("http://a.test/"), link("http://b.test/x"), link("http://b.test/y")])
    parent = admin.call(CallBatch(take=1), worker="w").leased[0]
    assert url_of(parent) == "http://a.test/"
    links = [link(f"http://a.test/{i}", group=1) for i in range(5)]
    result = admin.call(CallBatch(acks=[(parent.entry_id, parent.token)], pushes=links),
                        worker="w")
    # size 3 with the parent leased: room 1, +1 for the parent's own slot = 2 links
    assert (result.acked, result.pushed, result.parked) == (0, 2, 1)
    assert result.push_flags == [1, 1, 0, 0, 0]
    status = admin.status()
    assert (status["size"], status["parked"]) == (4, 1)
    # parked compactly: one list record, no hash field or host count of its own any more
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    assert client.hget(keys.data, parent.entry_id) is None
    assert client.exists(*keys.layout1_keys()) == 0  # nor a per-entry host field
    assert int(client.hget(keys.hostq, "a.test")) == 2  # a/0 and a/1
    # the first slot freed goes to the parked parent, which keeps its entry id
    first = admin.call(CallBatch(take=1), worker="w").leased[0]
    assert url_of(first) == "http://b.test/x"
    res = admin.call(CallBatch(acks=[(first.entry_id, first.token)]), worker="w")
    assert (res.resumed, res.size) == (1, 4)
    assert admin.status()["parked"] == 0
    again = admin.call(CallBatch(take=1), worker="w").leased[0]
    assert (again.entry_id, url_of(again)) == (parent.entry_id, "http://a.test/")
    # fetched again, it finds the same links: two are known, one more fits, it parks again
    result = admin.call(CallBatch(acks=[(again.entry_id, again.token)], pushes=links),
                        worker="w")
    assert (result.acked, result.pushed, result.duplicates, result.parked) == (0, 1, 2, 1)
    # drain to the end, re-fetching the parent whenever it comes back
    fetched = {"http://a.test/": 2, "http://b.test/x": 1}
    for _ in range(50):
        res = admin.call(CallBatch(take=1), worker="w")
        assert res.size <= 4
        if not res.leased:
            break
        e = res.leased[0]
        url = url_of(e)
        fetched[url] = fetched.get(url, 0) + 1
        pushes = links if url == "http://a.test/" else []
        res = admin.call(CallBatch(acks=[(e.entry_id, e.token)], pushes=pushes), worker="w")
        assert res.size <= 4
    assert set(fetched) == {"http://a.test/", "http://b.test/x", "http://b.test/y",
                            *(f"http://a.test/{i}" for i in range(5))}
    assert all(n == 1 for url, n in fetched.items() if url != "http://a.test/")
    # 3 new links to push after the first fetch, at least one per fetch
    assert 2 <= fetched["http://a.test/"] <= 4
    status = admin.status()
    assert (status["size"], status["parked"], status["counters"]["pushed"]) == (0, 0, 8)
    assert client.hlen(keys.hostq) == 0 and client.hlen(keys.data) == 0


def test_a_corrupt_parked_record_is_dead_lettered(redis_url):
    admin = admin_for(redis_url, queue_max=4)
    client = redis.Redis.from_url(redis_url)
    client.rpush(admin.keys.parked, b"\xc1 not msgpack")
    res = admin.call(CallBatch(take=1), worker="w")
    assert (res.dead_lettered, res.leased) == (1, [])
    dead = list(admin.dead_letters())
    assert [d["reason"] for d in dead] == ["corrupt parked record"]
    assert admin.status()["parked"] == 0


def test_links_of_a_full_host_take_the_parent_s_own_place(redis_url):
    """A per-host bound on a one-host site: each page may put one link in its own place."""
    admin = admin_for(redis_url, queue_max=None, host_max=2)
    admin.push([link("http://h.test/0"), link("http://h.test/1")])
    assert admin.push([link("http://h.test/x")]).refused == [0]
    e = admin.call(CallBatch(take=1), worker="w").leased[0]
    res = admin.call(CallBatch(acks=[(e.entry_id, e.token)],
                               pushes=[link(f"http://h.test/{i}", group=1)
                                       for i in (2, 3, 4)]), worker="w")
    # h.test has 2 entries, the parent's place takes one link; the parent parks, the host
    # stays at its bound
    assert (res.pushed, res.parked, res.deferred) == (1, 1, 0)
    client = redis.Redis.from_url(redis_url)
    assert int(client.hget(admin.keys.hostq, "h.test")) == 2
    # a link to the full host is not pushed: its parent is deferred, not parked
    admin.push([link("http://o.test/")])
    held = admin.call(CallBatch(take=5), worker="w").leased
    o = next(x for x in held if url_of(x) == "http://o.test/")
    res = admin.call(CallBatch(acks=[(o.entry_id, o.token)],
                               pushes=[link("http://h.test/5", group=1)]), worker="w")
    assert (res.deferred, res.parked) == (1, 0)
    assert admin.status()["parked"] == 1
    # a leased h.test entry is done: its place goes to the parked parent, back in the queue
    first = next(x for x in held if url_of(x).startswith("http://h.test/"))
    res = admin.call(CallBatch(acks=[(first.entry_id, first.token)]), worker="w")
    assert (res.acked, res.resumed) == (1, 1)
    assert admin.status()["parked"] == 0
    assert int(client.hget(admin.keys.hostq, "h.test")) == 2


def test_parent_is_deferred_when_no_link_host_has_room(redis_url):
    admin = admin_for(redis_url, queue_max=None, host_max=2, defer=0.3)
    admin.push([link("http://full.test/1"), link("http://full.test/2"),
                link("http://other.test/")])
    assert admin.push([link("http://full.test/3")]).refused == [0]  # per-host bound
    parent = admin.call(CallBatch(take=3), worker="w").leased
    p = next(e for e in parent if url_of(e) == "http://other.test/")
    res = admin.call(CallBatch(acks=[(p.entry_id, p.token)],
                               pushes=[link("http://full.test/4", group=1)]), worker="w")
    assert (res.acked, res.deferred, res.pushed) == (0, 1, 0)
    assert admin.status()["deferred"] == 1
    time.sleep(0.4)
    back = admin.call(CallBatch(take=1), worker="w")
    assert [url_of(e) for e in back.leased] == ["http://other.test/"]


def test_a_bounded_crawl_of_a_random_site_fetches_every_page(redis_url):
    """Drive the frontier like 3 workers would, on a 400-page random graph, cap 20."""
    rng = random.Random(7)
    pages = 400
    graph = {n: rng.sample(range(pages), 6) for n in range(pages)}
    for n in range(1, pages):  # make every page reachable from page 0
        graph[rng.randrange(n)].append(n)
    cap = 20
    admin = admin_for(redis_url, queue_max=cap)
    admin.push([link("http://g.test/0")])
    fetched: dict[str, int] = {}
    peak = 0
    held: list = []
    for _ in range(100_000):
        res = admin.call(CallBatch(take=3 - len(held)), worker="w")
        held += res.leased
        peak = max(peak, res.size)
        if not held:
            assert res.size == 0 and admin.status()["parked"] == 0
            break
        e = held.pop(rng.randrange(len(held)))  # finish them in any order
        url = url_of(e)
        fetched[url] = fetched.get(url, 0) + 1
        n = int(url.rsplit("/", 1)[1])
        links = [link(f"http://g.test/{m}", group=1) for m in graph[n]]
        res = admin.call(CallBatch(acks=[(e.entry_id, e.token)], pushes=links), worker="w")
        peak = max(peak, res.size)
    assert set(fetched) == {f"http://g.test/{n}" for n in range(pages)}
    assert peak <= cap
    # every fetch completes its page or discovers a new one: at most 2 fetches per page
    assert sum(fetched.values()) <= 2 * pages


def test_push_helper_no_wait_exits_3_and_pushes_nothing_past_the_cap(redis_url, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"http://a.test/{i}\n" for i in range(30)))
    result = subprocess.run([*CLI, "--redis", redis_url, "--queue-max", "12", "push", "nw",
                             "-f", str(urls), "--no-wait"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 3
    assert "pushed 12, duplicates 0, rejected 0" in result.stdout
    assert "not pushed from line 13 on" in result.stderr
    assert FrontierAdmin(redis_url, "nw").size() == 12


def test_push_helper_waits_for_the_low_watermark_then_finishes(redis_url, tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"http://a.test/{i}\n" for i in range(60)))
    admin = admin_for(redis_url, crawl="wait", queue_max=20)
    drained = []

    def drain() -> None:  # a slow consumer, acknowledging 5 entries every 0.2 s
        deadline = time.monotonic() + 50
        while len(drained) < 60 and time.monotonic() < deadline:
            res = admin.call(CallBatch(take=5), worker="drain")
            for e in res.leased:
                admin.call(CallBatch(acks=[(e.entry_id, e.token)]), worker="drain")
                drained.append(url_of(e))
            time.sleep(0.2)

    proc = subprocess.Popen([*CLI, "--redis", redis_url, "--queue-max", "20",
                             "--low-watermark", "0.5", "push", "wait", "-f", str(urls)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: admin.size() >= 20, 30, "a full frontier", 0.1)
    time.sleep(0.5)
    assert proc.poll() is None  # blocked on the full frontier
    assert admin.size() == 20
    thread = threading.Thread(target=drain)
    thread.start()
    out, err = proc.communicate(timeout=60)
    thread.join()
    assert proc.returncode == 0, err
    assert "pushed 60, duplicates 0, rejected 0" in out
    assert "frontier full (20 entries): waiting for room" in err
    assert sorted(drained) == sorted(f"http://a.test/{i}" for i in range(60))


def test_console_push_uses_the_bound_the_workers_stored(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.hset("fleet:{stored}:config", mapping={"queue_max": 3, "low_watermark": 0.5})
    result = subprocess.run([*CLI, "--redis", redis_url, "push", "stored", "--no-wait",
                             *(f"http://a.test/{i}" for i in range(5))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "pushed 3," in result.stdout
    assert FrontierAdmin(redis_url, "stored").size() == 3


def test_push_helper_timeout_exits_3(redis_url):
    admin_for(redis_url, crawl="to", queue_max=1).push([link("http://a.test/x")])
    result = subprocess.run([*CLI, "--redis", redis_url, "--queue-max", "1", "push", "to",
                             "http://a.test/y", "--timeout", "1"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3
    assert "pushed 0," in result.stdout


def test_oom_makes_the_push_helper_wait_then_finish(redis_server, tmp_path):
    client = redis_server.client()
    client.flushall()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 200_000)
    client.config_set("maxmemory-policy", "noeviction")
    try:
        urls = tmp_path / "urls.txt"
        urls.write_text("".join(f"http://a.test/{i}/{'x' * 300}\n" for i in range(3000)))
        errors_before = int(client.info("stats").get("total_error_replies", 0))
        proc = subprocess.Popen([*CLI, "--redis", redis_server.url, "--queue-max", "0", "push",
                                 "oom", "-f", str(urls)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if int(client.info("stats").get("total_error_replies", 0)) > errors_before:
                break  # Redis has refused a push with OOM
            time.sleep(0.1)
        time.sleep(1)
        assert proc.poll() is None, proc.communicate()  # waiting on OOM, not crashed
        client.config_set("maxmemory", 0)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        # one line per 10 s of waiting, saying how to stop waiting
        assert err.count("Redis is out of memory (OOM") == 1, err
        assert "raise maxmemory, or stop waiting with --timeout S or --no-wait" in err
        assert "pushed 3000, duplicates 0, rejected 0" in out
    finally:
        client.config_set("maxmemory", 0)
        client.flushall()


class SizeSampler(threading.Thread):
    """Samples the frontier's size every 20 ms while a crawl runs."""

    def __init__(self, url: str, crawl: str) -> None:
        super().__init__(daemon=True)
        self.admin = FrontierAdmin(url, crawl)
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.admin.size())
            time.sleep(0.02)


@pytest.mark.slow
def test_bounded_crawl_fetches_every_page_within_the_cap(redis_url, site_factory, worker_env,
                                                         tmp_path):
    paths = generate_site(tmp_path / "www", 1500, 8, seed=11)
    site = site_factory(tmp_path / "www")
    site.expected_paths = paths
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site.url + "site/", "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    sampler = SizeSampler(redis_url, "docs")
    sampler.start()
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"w-{n}.log" for n in range(3)]
    # idle 1 s: fleet-wide, parked links included (lua/step_idle.lua)
    procs = [start_worker(EXAMPLE_PROJECT, "docs", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": outs[n],
        "FLEET_QUEUE_MAX": 60}, worker_env, logs[n]) for n in range(3)]
    try:
        codes = wait_all(procs, 400)
    finally:
        sampler.stop.set()
        sampler.join()
    assert codes == [0, 0, 0], tail(logs[0])
    urls = {i["url"] for i in read_items(outs)}
    assert urls == site.expected_urls  # every page, although links had to wait
    assert len(sampler.samples) > 50
    assert max(sampler.samples) <= 60
    status = FrontierAdmin(redis_url, "docs").status()
    assert (status["size"], status["parked"], status["dead"]) == (0, 0, 0)
    assert status["counters"]["parked"] > 0  # the bound was really hit


@pytest.mark.slow
def test_start_requests_pause_while_the_frontier_is_full(redis_url, site_factory, worker_env,
                                                         tmp_path):
    paths = generate_site(tmp_path / "www", 400, 2, seed=2)
    site = site_factory(tmp_path / "www")
    sampler = SizeSampler(redis_url, "many_starts")
    sampler.start()
    out = tmp_path / "out.jsonl"
    log = tmp_path / "w.log"
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_JSONL_PATH": out,
                "FLEET_QUEUE_MAX": 50, "CONCURRENT_REQUESTS": 4}
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            scrapy_command("crawl", "many_starts", "-a", f"base={site.url}", "-a", "n=400",
                           *setting_args(settings)),
            cwd=TEST_PROJECT, env=worker_env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        assert wait_all([proc], 300) == [0], tail(log)
    finally:
        sampler.stop.set()
        sampler.join()
    assert len({i["url"] for i in read_items([out])}) == 400
    assert max(sampler.samples) <= 50
    text = tail(log, 200000)
    assert "start requests paused" in text
    assert "'fleet/backpressure/start_paused'" in text
    assert len(paths) == 401


def test_a_worker_joining_a_long_idle_crawl_still_reads_and_crawls_its_start_requests(
        redis_url, site_factory, worker_env, tmp_path):
    """The crawl was idle long ago (idle_since far in the past): the worker's first frontier
    call reports the fleet idle, before its start requests are read.  It must not stop
    leasing for good: its start requests fill the frontier, and it crawls them all."""
    generate_site(tmp_path / "www", 60, 1, seed=4)
    site = site_factory(tmp_path / "www")
    client = redis.Redis.from_url(redis_url)
    keys = FrontierAdmin(redis_url, "many_starts").keys
    seconds, micros = client.time()
    client.set(keys.idle_since, seconds * 1000 + micros // 1000 - 60_000)
    out = tmp_path / "out.jsonl"
    proc = start_worker(TEST_PROJECT, "many_starts", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "FLEET_QUEUE_MAX": 20,
        "FLEET_JSONL_PATH": out}, worker_env, tmp_path / "w.log",
        spider_args={"base": site.url, "n": 60})
    assert wait_all([proc], 120) == [0], tail(tmp_path / "w.log")
    assert {i["url"] for i in read_items([out])} == {
        f"{site.url}site/p/{i}.html" for i in range(60)}
