"""Budgets with real workers (issue 34): a crawl page budget given as Scrapy's
CLOSESPIDER_PAGECOUNT holds fleet-wide, and a host budget holds exactly at the site; every
worker closes with the budget's reason."""

from __future__ import annotations

import collections
import json

import pytest
from support import (
    TEST_PROJECT,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
    worker_stats,
)

from testsite import generate_site

pytestmark = pytest.mark.slow

BINDS = [f"127.0.0.{i}" for i in range(20, 23)]


def push_urls(tmp_path, urls, redis_url, env):
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    res = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), "-s",
                                    f"FLEET_REDIS_URL={redis_url}"], env)
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"pushed {len(urls)}," in res.stdout


def run_workers(tmp_path, redis_url, env, settings, n=3, timeout=180.0):
    tmp_path.mkdir(exist_ok=True)
    logs = [tmp_path / f"worker-{i}.log" for i in range(n)]
    procs = [start_worker(TEST_PROJECT, "fetch", {"FLEET_REDIS_URL": redis_url, **settings},
                          env, log) for log in logs]
    codes = wait_all(procs, timeout)  # no FLEET_IDLE_TIMEOUT: only the budget closes them
    for log, code in zip(logs, codes, strict=True):
        assert code == 0, tail(log)
    return logs


def page_requests(site):
    return [r for r in site.requests() if r["path"].startswith("/site/p/")]


def test_closespider_pagecount_is_the_fleet_s_budget(redis_url, site_factory, worker_env,
                                                     tmp_path):
    generate_site(tmp_path / "www", 150, 1, seed=4)
    site = site_factory(tmp_path / "www", behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 0.05}]})
    push_urls(tmp_path, [f"{site.url}site/p/{i}.html" for i in range(150)], redis_url,
              worker_env)
    logs = run_workers(tmp_path, redis_url, worker_env, {"CLOSESPIDER_PAGECOUNT": 60})
    assert len(page_requests(site)) == 60  # exactly: the site has 150
    assert collections.Counter(r["path"] for r in page_requests(site)).most_common(1)[0][1] == 1
    for log in logs:
        text = tail(log, 200_000)
        assert "Closing spider (budget_pages)" in text
        assert "CLOSESPIDER_PAGECOUNT=60 is the crawl's budget, fleet-wide" in text
        assert worker_stats(log).get("fleet/budget/closed/budget_pages") == 1
    res = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", "--json", "-s",
                                    f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert res.returncode == 0, res.stderr
    budget = json.loads(res.stdout)["budget"]
    assert (budget["pages"], budget["charged"], budget["left"]) == (60, 60, 0)


def test_a_host_budget_holds_exactly_at_the_site(redis_url, site_factory, worker_env,
                                                 tmp_path):
    generate_site(tmp_path / "www", 200, 1, seed=5)
    site = site_factory(tmp_path / "www", binds=BINDS)
    big, *others = site.urls
    urls = [f"{big}site/p/{i}.html" for i in range(200)]
    urls += [f"{base}site/p/{i}.html" for base in others for i in range(30)]
    push_urls(tmp_path, urls, redis_url, worker_env)
    overrides = json.dumps({BINDS[0]: {"budget_pages": 20}})
    logs = run_workers(tmp_path, redis_url, worker_env, {"FLEET_HOST_OVERRIDES": overrides})
    per_host = collections.Counter(r["addr"] for r in page_requests(site))
    assert per_host == {BINDS[0]: 20, BINDS[1]: 30, BINDS[2]: 30}
    for log in logs:
        assert "Closing spider (budget_hosts)" in tail(log, 200_000)
    res = run_scrapy(TEST_PROJECT, ["fleet", "status", "fetch", "--json", "-s",
                                    f"FLEET_REDIS_URL={redis_url}"], worker_env)
    status = json.loads(res.stdout)
    assert status["budget"]["hosts_out"] == 1
    assert status["frontier"]["due"] == 180  # kept, visible
    # raising the host's budget revives it: 5 more pages, exactly
    res = fleet(["budget", "fetch", "--host", BINDS[0], "--pages", "25"], redis_url, worker_env)
    assert res.returncode == 0, res.stderr
    assert f"{BINDS[0]}" in res.stdout and "20/25 pages" in res.stdout
    run_workers(tmp_path / "again", redis_url, worker_env, {"FLEET_HOST_OVERRIDES": overrides},
                n=1)
    per_host = collections.Counter(r["addr"] for r in page_requests(site))
    assert per_host == {BINDS[0]: 25, BINDS[1]: 30, BINDS[2]: 30}


def fleet(args, redis_url, env):
    return run_scrapy(TEST_PROJECT, ["fleet", *args, "-s", f"FLEET_REDIS_URL={redis_url}"], env)


def test_the_budget_command_refuses_bad_input_in_one_line(redis_url, worker_env, tmp_path):
    res = fleet(["budget", "fetch", "--pages", "5"], redis_url, worker_env)
    assert res.returncode == 4, res.stderr  # Redis has no record of the crawl: nothing set
    push_urls(tmp_path, ["http://127.0.0.1:9/site/p/1.html"], redis_url, worker_env)
    for bad in (["--pages", "0"], ["--pages", "x"], ["--pages", "2.5"], ["--seconds", "-1"],
                ["--host", "a.example", "--seconds", "3"]):
        res = fleet(["budget", "fetch", *bad], redis_url, worker_env)
        assert res.returncode == 2, (bad, res.stdout, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: ")
    res = fleet(["budget", "fetch", "--pages", "7", "--json"], redis_url, worker_env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["pages"] == 7


def test_closespider_itemcount_is_counted_fleet_wide(redis_url, site_factory, worker_env,
                                                    tmp_path):
    generate_site(tmp_path / "www", 150, 1, seed=6)
    site = site_factory(tmp_path / "www", behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 0.05}]})
    push_urls(tmp_path, [f"{site.url}site/p/{i}.html" for i in range(150)], redis_url,
              worker_env)
    outs = [tmp_path / f"items-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"w-{n}.log" for n in range(3)]
    procs = [start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "CLOSESPIDER_ITEMCOUNT": 30, "FLEET_PREFETCH": 4,
        "CONCURRENT_REQUESTS": 4, "FLEET_JSONL_PATH": out}, worker_env, log)
        for out, log in zip(outs, logs, strict=True)]
    for log, code in zip(logs, wait_all(procs, 180), strict=True):
        assert code == 0, tail(log)
        assert "Closing spider (budget_items)" in tail(log, 200_000)
    items = read_items(outs)
    # at least the budget; over it at most what was in flight: each worker's prefetch and
    # downloads, plus what was leased before the last items were reported
    print(f"items {len(items)} for CLOSESPIDER_ITEMCOUNT=30, pages {len(page_requests(site))}")
    assert 30 <= len(items) == len(page_requests(site)) <= 30 + 3 * (4 + 4) + 3 * 8


#: ten hosts over the three partitions of FLEET_PARTITIONS=3 (4, 5 and 1 of them)
TEN = [f"127.0.0.{i}" for i in range(40, 50)]


def test_a_crawl_page_budget_holds_exactly_over_three_partitions(redis_url, site_factory,
                                                                 worker_env, tmp_path):
    """Issue 34 item 3 at P = 3: partitions reserve chunks of the crawl's 100 pages
    (frontier/budgetchunks.py); 400 queued pages over 10 hosts give exactly 100 page requests
    at the site, each fetched once, and every worker closes with budget_pages."""
    generate_site(tmp_path / "www", 40, 1, seed=8)
    site = site_factory(tmp_path / "www", binds=TEN, behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 0.05}]})
    urls = [f"{base}site/p/{i}.html" for base in site.urls for i in range(40)]
    listing = tmp_path / "urls.txt"
    listing.write_text("\n".join(urls) + "\n")
    res = fleet(["push", "fetch", "-f", str(listing), "-s", "FLEET_PARTITIONS=3"], redis_url,
                worker_env)
    assert res.returncode == 0, res.stderr + res.stdout
    logs = run_workers(tmp_path, redis_url, worker_env,
                       {"CLOSESPIDER_PAGECOUNT": 100, "FLEET_PARTITIONS": 3})
    pages = page_requests(site)
    assert len(pages) == 100  # exactly: the site has 400
    assert collections.Counter((r["addr"], r["path"]) for r in pages).most_common(1)[0][1] == 1
    assert len({r["addr"] for r in pages}) > 3  # (served from every partition's hosts)
    for log in logs:
        text = tail(log, 200_000)
        assert "Closing spider (budget_pages)" in text
        assert worker_stats(log).get("fleet/budget/closed/budget_pages") == 1
    res = fleet(["status", "fetch", "--json", "-s", "FLEET_PARTITIONS=3"], redis_url,
                worker_env)
    assert res.returncode == 0, res.stderr
    budget = json.loads(res.stdout)["budget"]
    assert (budget["pages"], budget["charged"], budget["left"]) == (100, 100, 0)
    # raised by the command (at the home): one worker fetches exactly 10 more
    res = fleet(["budget", "fetch", "--pages", "110", "-s", "FLEET_PARTITIONS=3"], redis_url,
                worker_env)
    assert res.returncode == 0, res.stderr
    assert "pages 110, charged 100, left 10" in res.stdout
    res = fleet(["budget", "fetch", "--seconds", "30", "-s", "FLEET_PARTITIONS=3"], redis_url,
                worker_env)
    assert res.returncode == 2 and "FLEET_PARTITIONS = 1" in res.stderr
    logs = run_workers(tmp_path / "again", redis_url, worker_env,
                       {"CLOSESPIDER_PAGECOUNT": 100, "FLEET_PARTITIONS": 3}, n=1)
    assert len(page_requests(site)) == 110
    assert "Closing spider (budget_pages)" in tail(logs[0], 200_000)


def test_at_p_3_the_command_s_page_budget_needs_workers_with_one(redis_url, worker_env,
                                                                 tmp_path):
    """A partitioned crawl whose workers run without FLEET_BUDGET_PAGES does not lease in
    chunks: ``budget --pages`` would change nothing, so it is refused in one line."""
    listing = tmp_path / "urls.txt"
    listing.write_text("http://127.0.0.1:9/site/p/1.html\n")
    part = ["-s", "FLEET_PARTITIONS=3"]
    assert fleet(["push", "fetch", "-f", str(listing), *part], redis_url,
                 worker_env).returncode == 0
    res = fleet(["budget", "fetch", "--pages", "5", *part], redis_url, worker_env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "FLEET_BUDGET_PAGES" in res.stderr
