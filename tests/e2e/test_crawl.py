"""Real multi-process crawls: 3 ``scrapy crawl`` workers, a real Redis, a local site.

Each worker is a separate ``scrapy crawl`` process started exactly as the README says; a
crash is a SIGKILL (no cleanup).  Items come from the durable JSON-lines sink.
"""

from __future__ import annotations

import collections
import subprocess
import time
from pathlib import Path

import pytest
from support import (
    TEST_PROJECT,
    kill_worker,
    read_items,
    run_scrapy,
    running,
    scrapy_command,
    setting_args,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"

pytestmark = pytest.mark.slow


def push(project: Path, spider: str, url: str, redis_url: str, env: dict[str, str]) -> str:
    result = run_scrapy(project, ["fleet", "push", spider, url, "-s",
                                  f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "pushed 1," in result.stdout
    return result.stdout


def run_fleet(tmp_path: Path, redis_url: str, env: dict[str, str], workers: int = 3,
              extra: dict[str, object] | None = None, kill_after_items: int | None = None,
              timeout: float = 240.0, project: Path = EXAMPLE, spider: str = "docs"):
    """Start *workers* workers; optionally SIGKILL worker 0 once it wrote that many items.

    Returns (exit codes, item files, logs, killed?)."""
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(workers)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(workers)]
    procs = []
    for n in range(workers):
        # idle 1 s: idleness is fleet-wide (nothing queued, leased or deferred: a killed
        # worker's leases keep the others open until they expire), and no test here asserts
        # a late worker's share
        settings: dict[str, object] = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1,
                                       "FLEET_JSONL_PATH": outs[n]}
        settings.update(extra or {})
        procs.append(start_worker(project, spider, settings, env, logs[n]))
    killed = False
    if kill_after_items is not None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and procs[0].poll() is None:
            if len(read_items([outs[0]], growing=True)) >= kill_after_items:
                kill_worker(procs[0])
                killed = True
                break
            time.sleep(0.05)
        assert killed, "worker 0 finished before it could be killed:\n" + tail(logs[0])
        codes = [-9, *wait_all(procs[1:], timeout)]
    else:
        codes = wait_all(procs, timeout)
    for n, code in enumerate(codes):
        if not (killed and n == 0):
            assert code == 0, f"worker {n} exited {code}:\n{tail(logs[n])}"
    return codes, outs, logs, killed


def assert_frontier_drained(redis_url: str, crawl_id: str) -> dict:
    status = FrontierAdmin(redis_url, crawl_id).status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0), status
    return status


def test_three_workers_crawl_each_page_once(redis_url, site_server, worker_env, tmp_path):
    push(EXAMPLE, "docs", site_server.start_url, redis_url, worker_env)
    _, outs, logs, _ = run_fleet(tmp_path, redis_url, worker_env)
    items = read_items(outs)
    urls = [item["url"] for item in items]
    assert collections.Counter(urls).most_common(1)[0][1] == 1  # no page twice
    assert set(urls) == site_server.expected_urls
    per_worker = [len(read_items([o])) for o in outs]
    assert sum(per_worker) == len(site_server.expected_urls)
    item = next(i for i in items if i["url"] == site_server.start_url)
    assert set(item) == {"url", "title", "headings", "word_count", "fetched_at"}
    assert item["title"] and item["word_count"] > 0
    status = assert_frontier_drained(redis_url, "docs")
    # every entry was acknowledged once (pages + the non-HTML file + the 404 link)
    assert status["counters"]["acked"] == status["counters"]["pushed"] == \
        len(site_server.expected_urls) + 2
    for log in logs:
        assert "Closing spider (finished)" in tail(log, 20000)


def _slow_site(tmp_path: Path, site_factory, pages: int = 150):
    paths = generate_site(tmp_path / "www", pages, 6, seed=3)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.15}]})
    site.expected_paths = paths
    site.start_path = "/site/"
    return site


def test_sigkilled_worker_loses_no_page(redis_url, site_factory, worker_env, tmp_path):
    site = _slow_site(tmp_path, site_factory)
    push(EXAMPLE, "docs", site.start_url, redis_url, worker_env)
    extra = {"FLEET_LEASE_TIMEOUT": 5, "CONCURRENT_REQUESTS": 4}
    _, outs, _, killed = run_fleet(tmp_path, redis_url, worker_env, extra=extra,
                                   kill_after_items=8)
    assert killed
    urls = [item["url"] for item in read_items(outs)]
    assert set(urls) == site.expected_urls  # every page despite the crash
    repeats = sum(n - 1 for n in collections.Counter(urls).values())
    # only requests leased by the killed worker (in flight + prefetch) may come twice
    assert repeats <= 4 + 16
    status = assert_frontier_drained(redis_url, "docs")
    assert status["counters"].get("reclaimed", 0) >= 1  # its leases expired and came back


def test_main_job_on_the_python_docs_mirror(redis_url, pydocs_site, worker_env, tmp_path):
    push(EXAMPLE, "docs", pydocs_site.start_url, redis_url, worker_env)
    _, outs, _, _ = run_fleet(tmp_path, redis_url, worker_env)
    urls = [item["url"] for item in read_items(outs)]
    assert len(urls) == 516
    assert len(set(urls)) == 516  # each exactly once
    assert all(u.startswith(pydocs_site.start_url) for u in urls)
    assert pydocs_site.url.rstrip("/") + "/3/library/os.html" in urls
    assert_frontier_drained(redis_url, "docs")


def test_main_job_on_the_mirror_survives_a_sigkill(redis_url, pydocs_site, worker_env,
                                                   tmp_path):
    push(EXAMPLE, "docs", pydocs_site.start_url, redis_url, worker_env)
    # the lease timeout must outlast the longest stall of a busy worker's event loop
    # (parsing the largest pages on a loaded 2-core machine), or live leases expire too
    _, outs, _, killed = run_fleet(tmp_path, redis_url, worker_env,
                                   extra={"FLEET_LEASE_TIMEOUT": 15}, kill_after_items=40)
    assert killed
    urls = [item["url"] for item in read_items(outs)]
    assert len(set(urls)) == 516
    # at most what the killed worker held: CONCURRENT_REQUESTS (16) + FLEET_PREFETCH (16)
    assert len(urls) - 516 <= 16 + 16
    assert_frontier_drained(redis_url, "docs")


def test_long_request_keeps_the_fleet_open_and_its_lease_alive(redis_url, site_factory,
                                                               worker_env, tmp_path):
    paths = generate_site(tmp_path / "www", 3, 1, seed=1)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/0.html", "seconds": 9.0}]})
    site.expected_paths = paths
    push(EXAMPLE, "docs", site.url + "site/p/0.html", redis_url, worker_env)
    # lease timeout 4 s < 9 s response: only heartbeats keep the lease; idle timeout 1 s:
    # the other worker, with nothing to do, must still wait for the slow request (the one
    # slow page: its links, each 9 s too, made a 27 s chain of them)
    extra = {"FLEET_LEASE_TIMEOUT": 4, "FLEET_IDLE_TIMEOUT": 1}
    started = time.time()
    _, outs, logs, _ = run_fleet(tmp_path, redis_url, worker_env, workers=2, extra=extra)
    ended = time.time()
    first_hit = [r for r in site.requests() if r["path"] == "/site/p/0.html"]
    assert len(first_hit) == 1  # fetched once: the lease was extended, not re-delivered
    assert ended - started >= 9.0
    items = read_items(outs)
    assert site.url + "site/p/0.html" in {i["url"] for i in items}
    for log in logs:
        assert "Closing spider (finished)" in tail(log, 20000)


def test_worker_started_on_an_empty_frontier_picks_up_pushed_work(redis_url, site_server,
                                                                  worker_env, tmp_path):
    out = tmp_path / "out.jsonl"
    log = tmp_path / "w.log"
    proc = start_worker(EXAMPLE, "docs", {"FLEET_REDIS_URL": redis_url,
                                          "FLEET_JSONL_PATH": out}, worker_env, log)
    try:
        wait_until(lambda: "joined crawl" in tail(log), 60, "the worker to join", 0.1,
                   explain=lambda: tail(log))
        time.sleep(1.0)  # let it poll the empty frontier
        push(EXAMPLE, "docs", site_server.start_url, redis_url, worker_env)
        # (FLEET_IDLE_TIMEOUT=None: it keeps waiting, running)
        wait_until(lambda: running(proc, log=log) and len(read_items([out], growing=True))
                   >= len(site_server.expected_urls), 60, "every page", 0.1,
                   explain=lambda: tail(log))
    finally:
        proc.terminate()
        proc.wait(30)
    assert {i["url"] for i in read_items([out])} == site_server.expected_urls


def test_unencodable_requests_are_dropped_with_a_clear_error(redis_url, site_server,
                                                             worker_env, tmp_path):
    push(TEST_PROJECT, "codec_trouble", site_server.start_url, redis_url, worker_env)
    _, outs, logs, _ = run_fleet(tmp_path, redis_url, worker_env, workers=1,
                                 project=TEST_PROJECT, spider="codec_trouble")
    urls = {i["url"] for i in read_items(outs)}
    assert urls == {site_server.start_url, site_server.start_url + "p/4.html"}
    log = tail(logs[0], 50000)
    assert log.count("cannot store request") == 3
    assert "cannot store request 'http://127.0.0.1:" in log
    assert "p/1.html' in the frontier: Function <function CodecTroubleSpider.parse.<locals>" \
        ".<lambda>" in log
    assert "meta['sel'] (type parsel.selector.Selector)" in log
    assert "meta['lock'] (type _thread.lock)" in log
    assert "'fleet/codec/encode_error': 3" in log


def test_corrupt_entry_goes_to_dead_letters_and_the_crawl_goes_on(redis_url, site_server,
                                                                  worker_env, tmp_path):
    # entries whose bytes are not a valid request: pushed raw, as a bug or a foreign writer
    # could leave them (the script stores any payload)
    admin = FrontierAdmin(redis_url, "docs")
    raw = admin.push([(b"", 100, b"\x01\xc1garbage", 0, "127.0.0.1"),
                      (b"", 100, b"\x09future format", 0, "127.0.0.1")])
    assert raw.pushed == 2
    push(EXAMPLE, "docs", site_server.start_url, redis_url, worker_env)
    _, outs, _, _ = run_fleet(tmp_path, redis_url, worker_env, workers=1)
    assert {i["url"] for i in read_items(outs)} == site_server.expected_urls
    letters = sorted((d["entry_id"], d["reason"]) for d in admin.dead_letters())
    assert [entry_id for entry_id, _ in letters] == ["000000000000001", "000000000000002"]
    assert "corrupt entry" in letters[0][1]
    assert "unknown format version 9" in letters[1][1]


def test_ack_waits_for_the_item_pipelines(redis_url, site_server, worker_env, tmp_path):
    push(TEST_PROJECT, "ack_probe", site_server.start_url, redis_url, worker_env)
    _, outs, _, _ = run_fleet(tmp_path, redis_url, worker_env, workers=1,
                              project=TEST_PROJECT, spider="ack_probe")
    items = read_items(outs)
    assert len(items) == 1
    # while the item was in the pipeline its request was still leased, not acknowledged
    assert (items[0]["leased_in_pipeline"], items[0]["acked_in_pipeline"]) == (1, 0)
    status = assert_frontier_drained(redis_url, "ack_probe")
    assert status["counters"]["acked"] == 1


def test_start_urls_are_consumed_by_one_worker_only(redis_url, site_server, worker_env,
                                                    tmp_path):
    outs = [tmp_path / f"s-{n}.jsonl" for n in range(2)]
    start = site_server.url + "site/p/1.html"
    procs = []
    for n in range(2):
        settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2,
                    "FLEET_JSONL_PATH": outs[n]}
        with open(tmp_path / f"s-{n}.log", "ab") as log:
            procs.append(subprocess.Popen(
                scrapy_command("crawl", "starts", "-a", f"start={start}",
                               *setting_args(settings)),
                cwd=TEST_PROJECT, env=worker_env, stdout=log, stderr=subprocess.STDOUT))
    assert wait_all(procs, 120) == [0, 0]
    # Scrapy's start requests are dont_filter=True: without the fleet's "once" rule each
    # worker would fetch the start URL
    assert [i["url"] for i in read_items(outs)] == [start]
    logs = [tail(tmp_path / f"s-{n}.log", 20000) for n in range(2)]
    assert sum("this worker skips them" in log for log in logs) == 1
