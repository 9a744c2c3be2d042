"""docs/scrapy-compat.md, row by row: what Scrapy's per-process settings, components, commands
and signals do on a fleet, shown by real multi-worker crawls against a local site.

Two crawls, each run once for the module and read by several tests (one row or a few each):

* ``compat``: 2 workers of tests/project's ``compat`` spider (start_urls, custom_settings'
  DEPTH_LIMIT, redirect chains, a URL answering 500, cookies, spider_idle with
  DontCloseSpider and ``engine.crawl()``), with the settings that stay per worker by design
  (telnet, HTTP cache, JOBDIR, feeds, periodic stats) or are warned about (DOWNLOAD_SLOTS,
  CONCURRENT_REQUESTS_PER_IP, JOBDIR, FEEDS);
* ``budgets``: 3 workers of the example ``docs`` spider, two with CLOSESPIDER_PAGECOUNT and
  AutoThrottle (counted and run per worker today: issues 34 and 35), one with a
  MEMUSAGE_LIMIT_MB it exceeds at once.

Assertions are on counts and states (the site's request log, the items, the workers' logs
and stats, the crawl's state in Redis), never on elapsed times.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import redis
from support import (
    EXAMPLE_PROJECT,
    TEST_PROJECT,
    RedisServer,
    SiteProcess,
    isolated_env,
    read_items,
    run_scrapy,
    start_site,
    start_worker,
    tail,
    wait_all,
    wait_until,
    worker_stats,
)

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

pytestmark = pytest.mark.slow

DEPTH_LIMIT = 2  # the compat spider's custom_settings
RETRY_TIMES = 2
REDIRECT_MAX_TIMES = 2
DOWNLOAD_DELAY = 0.05


@dataclass
class Crawl:
    site: SiteProcess
    redis_url: str
    outs: list[Path]
    logs: list[Path]
    codes: list[int]
    tmp: Path
    env: dict[str, str]

    def log(self, n: int) -> str:
        return self.logs[n].read_text(encoding="utf-8", errors="replace")

    def paths(self) -> collections.Counter[str]:
        return collections.Counter(r["path"] for r in self.site.requests())


def _fresh_redis(redis_server: RedisServer) -> str:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.restart()
    client = redis_server.client()
    client.flushall()
    client.close()
    return redis_server.url


def _start(project: Path, spider: str, settings: list[dict[str, Any]], crawl_tmp: Path,
           redis_url: str, env: dict[str, str], spider_args: dict[str, Any] | None = None,
           ) -> tuple[list[Path], list[Path], list[int]]:
    outs = [crawl_tmp / f"out-{n}.jsonl" for n in range(len(settings))]
    logs = [crawl_tmp / f"worker-{n}.log" for n in range(len(settings))]
    procs = [start_worker(project, spider, {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": out,
        **extra}, env, log, spider_args) for out, log, extra in zip(outs, logs, settings,
                                                                     strict=True)]
    return outs, logs, wait_all(procs, 240)


@pytest.fixture(scope="module")
def compat(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory,
           ) -> Iterator[Crawl]:
    tmp = tmp_path_factory.mktemp("compat")
    generate_site(tmp / "www", 40, 3, seed=5)
    site = start_site(tmp / "www", tmp / "requests.jsonl",
                      behaviour={"failures": [{"prefix": "/fail/", "status": 500}]})
    redis_url = _fresh_redis(redis_server)
    env = isolated_env(tmp)

    def worker(n: int) -> dict[str, Any]:
        return {"RETRY_TIMES": RETRY_TIMES, "REDIRECT_MAX_TIMES": REDIRECT_MAX_TIMES,
                "TELNETCONSOLE_ENABLED": True, "LOGSTATS_INTERVAL": 1,
                "DOWNLOAD_DELAY": DOWNLOAD_DELAY,
                "HTTPCACHE_ENABLED": True, "HTTPCACHE_DIR": tmp / f"cache-{n}",
                "HTTPCACHE_IGNORE_HTTP_CODES": "500",
                "JOBDIR": tmp / f"job-{n}",
                "FEEDS": json.dumps({str(tmp / f"feed-{n}.jsonl"): {"format": "jsonlines"}}),
                "DOWNLOAD_SLOTS": json.dumps({"127.0.0.1": {"concurrency": 8}}),
                "CONCURRENT_REQUESTS_PER_IP": 8}

    try:
        outs, logs, codes = _start(TEST_PROJECT, "compat", [worker(0), worker(1)], tmp,
                                   redis_url, env, {"base": site.url})
        yield Crawl(site, redis_url, outs, logs, codes, tmp, env)
    finally:
        site.stop()


def _depths(root: Path, base: str) -> dict[str, int]:
    """Each page of the generated site under /site/ -> its link depth from /site/ (BFS over
    the HTML files, as Scrapy's DepthMiddleware counts)."""
    start = base + "site/"
    depth = {start: 0}
    frontier = [start]
    while frontier:
        url = frontier.pop(0)
        path = root / url[len(base):]
        path = path / "index.html" if url.endswith("/") else path
        if not path.suffix == ".html" or not path.is_file():
            continue
        for href in re.findall(r'href="([^"]+)"', path.read_text(encoding="utf-8")):
            link = urljoin(url, href).split("#")[0]
            if link.startswith(start) and link not in depth:
                depth[link] = depth[url] + 1
                frontier.append(link)
    return depth


def test_compat_workers_finish(compat):
    for n, code in enumerate(compat.codes):
        assert code == 0, tail(compat.logs[n])
        assert "Spider closed (finished)" in compat.log(n), tail(compat.logs[n])


def test_start_urls_and_depth_limit_from_custom_settings_hold_fleet_wide(compat):
    paths = compat.paths()
    items = read_items(compat.outs)
    # start_urls: read by one worker (FLEET_START_REQUESTS="once"), so the start page is
    # fetched once as a start request (depth 0); the links back to it are links (as in
    # Scrapy: a start request is dont_filter and does not enter the filter)
    assert [i["depth"] for i in items if i["url"] == compat.site.url + "site/"].count(0) == 1
    assert max(n for p, n in paths.items() if p.startswith("/site/p/")) == 1  # no page twice
    depths = _depths(compat.site.root, compat.site.url)
    within = {url for url, d in depths.items() if d <= DEPTH_LIMIT
              and not url.endswith((".txt", "missing.html"))}
    deeper = {url for url, d in depths.items() if d > DEPTH_LIMIT}
    assert deeper, "the site must be deeper than DEPTH_LIMIT for this test to mean anything"
    site_items = {i["url"] for i in items if i["url"].startswith(compat.site.url + "site/")}
    assert within <= site_items
    assert not deeper & site_items
    assert max(i["depth"] for i in items) == DEPTH_LIMIT


def test_retry_times_counts_across_workers(compat):
    # one URL always answering 500: RETRY_TIMES retries for the fleet, not per worker
    assert compat.paths()["/fail/always"] == RETRY_TIMES + 1
    failed = run_scrapy(TEST_PROJECT, ["fleet", "failed", "compat", "--json", "-s",
                                       f"FLEET_REDIS_URL={compat.redis_url}"], compat.env)
    records = [r for r in json.loads(failed.stdout) if r["reason"] == "http/500"]
    assert [(r["url"], r["attempts"]) for r in records] == \
        [(compat.site.url + "fail/always", RETRY_TIMES + 1)], failed.stdout


def test_redirect_max_times_counts_across_workers(compat):
    paths = compat.paths()
    # 2 redirects: followed to the end, the hop count carried in meta
    assert [paths[p] for p in ("/_hops/1/outside/", "/_hops/0/outside/", "/outside/")] \
        == [1, 1, 1]
    outside = [i for i in read_items(compat.outs) if i["url"] == compat.site.url + "outside/"]
    assert [i["redirect_times"] for i in outside] == [REDIRECT_MAX_TIMES]
    # 3 redirects: the third is refused, whichever worker fetched each hop
    assert [paths[p] for p in ("/_hops/2/nowhere.html", "/_hops/1/nowhere.html",
                               "/_hops/0/nowhere.html", "/nowhere.html")] == [1, 1, 1, 0]


def test_referer_and_request_cookies_travel_with_the_request(compat):
    children = [i for i in read_items(compat.outs) if i["parent"]]
    assert len(children) > 10
    assert all(i["referer"] == i["parent"] for i in children)
    # (the worker's jar may add the same cookie stored for another path of the site: Scrapy's
    # cookie rules, and a jar per worker today, issue 32)
    assert all("fleet=compat" in i["cookie"].split("; ") for i in children)


def test_spider_idle_and_engine_crawl_schedule_into_the_fleet(compat):
    # each worker's spider_idle handler scheduled the same request with engine.crawl() and
    # raised DontCloseSpider: it went through the shared filter and was fetched once
    assert compat.paths()["/site/p/idle.html"] == 1
    for n in range(2):
        assert "Closing spider (finished)" in compat.log(n)


def test_per_worker_components_keep_their_own_state(compat):
    ports = set()
    stats = [worker_stats(log) for log in compat.logs]
    fetched = sum(compat.paths().values())
    for n in range(2):
        log = compat.log(n)
        ports |= set(re.findall(r"Telnet console listening on 127\.0\.0\.1:(\d+)", log))
        assert "Crawled " in log  # LogStats: this worker's pages
        assert (compat.tmp / f"job-{n}" / "spider.state").is_file()  # its own spider.state
        assert (compat.tmp / f"cache-{n}").is_dir()
    assert len(ports) == 2  # a console each
    # Scrapy's remote control (Scrapy >= 2.16): an HTTP server and job file per worker
    remote = {p for n in range(2) for p in re.findall(
        r"Remote control HTTP server listening on port (\d+)", compat.log(n))}
    assert len(remote) in (0, 2)
    # each worker's stats count its own downloads, their sum the fleet's; each worker's HTTP
    # cache answers only what that worker stored
    assert sum(s.get("downloader/response_count", 0) - s.get("httpcache/hit", 0)
               for s in stats) == fetched
    assert sum(s.get("httpcache/miss", 0) for s in stats) == fetched
    # STATS_CLASS: each worker's own; the fleet's exact counters are in Redis (status)
    acked = FrontierAdmin(compat.redis_url, "compat").status()["counters"]["acked"]
    assert sum(s.get("fleet/frontier/acked", 0) for s in stats) == acked > 0
    feed_items = read_items([compat.tmp / f"feed-{n}.jsonl" for n in range(2)])
    assert sorted(i["url"] for i in feed_items) == \
        sorted(i["url"] for i in read_items(compat.outs))


def test_download_delay_is_translated_to_the_fleet_wide_interval(compat):
    # DOWNLOAD_DELAY becomes FLEET_HOST_DELAY, kept by the fleet for all workers together;
    # each worker's own Scrapy delay (and its RANDOMIZE_DOWNLOAD_DELAY jitter) is 0
    for n in range(2):
        assert f"one request every {DOWNLOAD_DELAY:.3f} s" in compat.log(n)
    times = sorted(r["t"] for r in compat.site.requests())
    # on the site's clock, any 1 s holds at most 1 / delay requests (+ 1: a request may leave
    # its worker late after its turn), as from one Scrapy process; two workers each keeping
    # their own delay would send twice that
    busiest = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
    assert busiest <= round(1 / DOWNLOAD_DELAY) + 1, busiest


def test_per_worker_settings_are_warned_about_once_each(compat):
    for n in range(2):
        log = compat.log(n)
        for fragment in ("DOWNLOAD_SLOTS (127.0.0.1) sets a concurrency",
                         "CONCURRENT_REQUESTS_PER_IP=8 caps each worker",
                         "JOBDIR is not needed by a fleet worker",
                         f"FEEDS ({compat.tmp / f'feed-{n}.jsonl'}): each worker"):
            assert log.count(fragment) == 1, (fragment, tail(compat.logs[n]))
        assert "CLOSESPIDER" not in log and "AUTOTHROTTLE" not in log


# -- CLOSESPIDER_*, AutoThrottle, MEMUSAGE_* -----------------------------------------------


@pytest.fixture(scope="module")
def budgets(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[Crawl]:
    tmp = tmp_path_factory.mktemp("budgets")
    generate_site(tmp / "www", 60, 5, seed=7)
    site = start_site(tmp / "www", tmp / "requests.jsonl",
                      behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.2}]})
    redis_url = _fresh_redis(redis_server)
    env = isolated_env(tmp)
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site.url + "site/", "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], env)
    assert pushed.returncode == 0, pushed.stderr
    limited = {"CLOSESPIDER_PAGECOUNT": 5, "AUTOTHROTTLE_ENABLED": True,
               "AUTOTHROTTLE_START_DELAY": 0.01, "AUTOTHROTTLE_MAX_DELAY": 0.1,
               "CONCURRENT_REQUESTS": 2}
    try:
        outs, logs, codes = _start(
            EXAMPLE_PROJECT, "docs",
            # worker 0: the fleet's adaptive politeness (the default) takes AutoThrottle's
            # place; worker 1 keeps Scrapy's per-process AutoThrottle, and is warned
            [limited, {**limited, "FLEET_ADAPTIVE": False},
             {"MEMUSAGE_LIMIT_MB": 1, "CONCURRENT_REQUESTS": 2}],
            tmp, redis_url, env)
        yield Crawl(site, redis_url, outs, logs, codes, tmp, env)
    finally:
        site.stop()


def test_closespider_pagecount_is_the_fleet_s_budget(budgets):
    """Issue 34: CLOSESPIDER_PAGECOUNT is the crawl's page budget (FLEET_BUDGET_PAGES), charged
    at lease time fleet-wide; Scrapy's CloseSpider no longer closes each worker at its own 5.
    (Worker 2 runs without the setting: its own leases are not charged, docs/control.md.)"""
    client = redis.Redis.from_url(budgets.redis_url)
    assert int(client.hget(CrawlKeys("fleet", "docs").budget, "charged")) == 5
    for n in range(2):
        log = budgets.log(n)
        assert "Closing spider (budget_pages)" in log, tail(budgets.logs[n])
        assert "closespider_pagecount" not in log
        assert log.count("CLOSESPIDER_PAGECOUNT=5 is the crawl's budget, fleet-wide "
                         "(FLEET_BUDGET_PAGES=5)") == 1
        assert "is counted by each worker" not in log
    # nothing lost: what is not fetched stays queued
    status = FrontierAdmin(budgets.redis_url, "docs").status()
    assert status["leased"] == 0 and status["queued"] > 0, status


def test_autothrottle_is_translated_or_runs_in_each_worker_and_is_warned(budgets):
    """With FLEET_ADAPTIVE (the default) AutoThrottle is turned off with one INFO line and its
    target carried over (the fleet's one controller per host, issue 35); with FLEET_ADAPTIVE
    = False it runs in each worker, with one warning."""
    translated, own = budgets.log(0), budgets.log(1)
    assert "scrapy.extensions.throttle.AutoThrottle" not in translated
    assert translated.count("AutoThrottle is per process: turned off") == 1
    assert "AUTOTHROTTLE_ENABLED: each worker runs its own AutoThrottle" not in translated
    assert "scrapy.extensions.throttle.AutoThrottle" in own  # enabled in this worker
    assert own.count("AUTOTHROTTLE_ENABLED: each worker runs its own AutoThrottle") == 1
    assert "AUTOTHROTTLE_ENABLED" not in budgets.log(2)


def test_memusage_limit_closes_only_its_worker(budgets):
    log = budgets.log(2)
    assert "Closing spider (memusage_exceeded)" in log, tail(budgets.logs[2])
    for n in range(2):
        assert "memusage_exceeded" not in budgets.log(n)


# -- commands ------------------------------------------------------------------------------


def test_one_process_commands_leave_the_fleet_alone(redis_url, site_server, worker_env):
    """shell, parse, fetch, check and bench in a fleet project run as plain Scrapy: their
    requests never reach the crawl's frontier (parse's used to be recorded there as failed,
    and the command waited for work forever)."""
    page = site_server.start_url
    fleet = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    runs = {
        "parse": (["parse", "--spider", "docs", page, *fleet], "'url': '" + page),
        "shell": (["shell", page, "-c", "response.status", *fleet], "200"),
        "fetch": (["fetch", "--nolog", page, *fleet], "<title>site index</title>"),
        "check": (["check", "docs", *fleet], "Ran 0 contracts"),
        "bench": (["bench", "-s", "CLOSESPIDER_TIMEOUT=1", *fleet], "closespider_timeout"),
    }
    for name, (args, expected) in runs.items():
        result = run_scrapy(EXAMPLE_PROJECT, args, worker_env, timeout=90)
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{name}: {output[-3000:]}"
        assert expected in output, f"{name}: {output[-3000:]}"
        if name not in ("fetch", "check"):  # (their logging is off)
            assert f"scrapy {name} runs as plain Scrapy" in output, f"{name}: {output[-3000:]}"
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0  # no crawl key was written
    finally:
        client.close()


def test_a_spider_idle_handler_without_an_idle_timeout_is_warned(redis_url, worker_env,
                                                                  tmp_path):
    """FLEET_IDLE_TIMEOUT=None (the default): the fleet never sends spider_idle, so the
    compat spider's handler would never run; each worker says so at start-up."""
    logs = [tmp_path / f"idle-{n}.log" for n in range(2)]
    procs = [start_worker(TEST_PROJECT, "compat", {
        "FLEET_REDIS_URL": redis_url, "FLEET_START_REQUESTS": "never"}, worker_env, log,
        {"base": "http://127.0.0.1:9/"}) for log in logs]
    try:
        for log in logs:
            wait_until(lambda log=log: "joined crawl" in tail(log), 60, "the worker's start")
            assert tail(log, 20000).count("a spider_idle handler is connected, but a fleet "
                                          "worker sends spider_idle only") == 1, tail(log)
    finally:
        for proc in procs:
            proc.terminate()
        wait_all(procs, 60)
