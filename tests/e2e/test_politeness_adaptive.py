"""Adaptive politeness with real workers (issue 35): a site of limited capacity (a token
bucket in the test site) that answers 429 without Retry-After above it.  Counts and states
from the site's own log and from Redis; the timed figures are in bench/bench_adaptive.py."""

from __future__ import annotations

import itertools

import pytest
from support import TEST_PROJECT, kill_worker, run_scrapy, start_worker, wait_until
from test_politeness import hits, push_urls, run_workers

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.fleet import learned_capacity_key
from testsite import generate_site

pytestmark = pytest.mark.slow

CEILING = 8.0  # FLEET_HOST_RATE
CAPACITY = 2.0  # what the site can serve, requests/s
PAGES = 40


@pytest.fixture
def limited_site(tmp_path, site_factory):
    generate_site(tmp_path / "www", PAGES, 2, seed=4)
    return lambda status=429: site_factory(tmp_path / "www", binds=("127.0.0.2",), behaviour={
        "capacity": [{"prefix": "/site/p/", "phases": [[1e9, CAPACITY]], "status": status,
                      "host": "127.0.0.2"}]})


def _crawl(redis_url, site, worker_env, tmp_path, adaptive: bool, rate: float | None = CEILING):
    push_urls([f"{site.urls[0]}site/p/{i}.html" for i in range(PAGES)], redis_url, worker_env,
              tmp_path)
    run_workers(4, redis_url, worker_env, tmp_path,
                {"FLEET_HOST_RATE": rate, "FLEET_ADAPTIVE": adaptive, "RETRY_TIMES": 50,
                 "FLEET_BACKOFF_BASE": 0.5, "FLEET_BACKOFF_MAX": 4}, timeout=300)
    log = [r for r in site.requests() if r["path"].startswith("/site/p/")]
    ok = {r["path"] for r in log if r["status"] == 200}
    refused = sum(1 for r in log if r["status"] != 200)
    admin = FrontierAdmin(redis_url, "fetch")
    stats = {k.decode(): int(v) for k, v in admin.client.hgetall(admin.keys.stats).items()
             if v.isdigit()}
    state = admin.client.hget(admin.keys.adaptive, "127.0.0.2")
    return ok, refused, stats, state


@pytest.mark.parametrize("status", [429, 503])
def test_four_workers_slow_down_to_the_sites_capacity_as_one(redis_url, limited_site,
                                                             worker_env, tmp_path, status):
    site = limited_site(status)
    ok, refused, stats, state = _crawl(redis_url, site, worker_env, tmp_path, adaptive=True)
    assert len(ok) == PAGES  # nothing lost: every refused request was fetched again
    assert state is not None, (refused, stats)
    fields = state.decode().split("|")
    rate, why, decreases = float(fields[0]), fields[6], int(fields[10])
    # the fleet's one controller came down to the site's capacity, not 4 times over it
    assert rate <= CEILING * 0.5 and why == str(status), (state, refused, stats)
    assert decreases == stats["adaptive_decreases"] >= 2
    # one decrease per overload event: each refused answer either decreased the rate or was
    # of a request leased before the last decrease (the latency rule may decrease too, when
    # a loaded machine stretches the answers' latency)
    overload_decreases = decreases - stats.get("adaptive_latency_decreases", 0)
    assert overload_decreases + stats.get("adaptive_inflight", 0) == refused, stats
    # of the fetches, few were refused (5 of 45 in a typical run; the baseline below, more
    # than half): at the ceiling (4 x capacity) three in four would be
    assert refused <= 0.25 * PAGES, (refused, stats)
    assert len(hits(site, "127.0.0.2")) == PAGES + refused


def test_without_the_controller_the_same_site_refuses_more(redis_url, limited_site,
                                                           worker_env, tmp_path):
    """The baseline of the test above (FLEET_ADAPTIVE = False: holds and back-off only)."""
    site = limited_site()
    ok, refused, stats, state = _crawl(redis_url, site, worker_env, tmp_path, adaptive=False)
    assert len(ok) == PAGES and state is None and "adaptive_decreases" not in stats
    assert refused > 0.5 * PAGES, refused


def test_a_host_without_a_configured_rate_is_held_not_adapted(redis_url, limited_site,
                                                            worker_env, tmp_path):
    """No FLEET_HOST_RATE or delay (only the concurrency cap): no ceiling to adapt under, so
    the controller keeps no state and the site's 429s hold the host, as without the
    controller (docs/politeness.md; adapting such hosts under their concurrency sent hosts
    with a 503 now and then to the slowest rate for good), and every page is fetched."""
    site = limited_site()
    ok, refused, stats, state = _crawl(redis_url, site, worker_env, tmp_path, adaptive=True,
                                       rate=None)
    assert len(ok) == PAGES and refused > 0, (refused, stats)
    assert state is None and "adaptive_decreases" not in stats, (state, stats)


def test_a_long_crawl_delay_is_not_capped(redis_url, tmp_path, site_factory, worker_env):
    """Crawl-delay is a floor with no 60-s cap by default (FLEET_MAX_CRAWL_DELAY None): a
    host asking for 120 s gets 120 s between two requests, fleet-wide."""
    generate_site(tmp_path / "www", 4, 2, seed=4)
    site = site_factory(tmp_path / "www", binds=("127.0.0.2",), behaviour={
        "robots": {"127.0.0.2": "User-agent: *\nCrawl-delay: 120\n"}})
    push_urls([f"{site.urls[0]}site/p/{i}.html" for i in range(3)], redis_url, worker_env,
              tmp_path)
    proc = start_worker(TEST_PROJECT, "fetch", {"FLEET_REDIS_URL": redis_url,
                                                "ROBOTSTXT_OBEY": True}, worker_env,
                        tmp_path / "w.log")
    try:
        admin = FrontierAdmin(redis_url, "fetch")
        stored = wait_until(lambda: admin.client.hget(admin.keys.crawldelay, "127.0.0.2"), 60,
                            "the host's Crawl-delay stored")
        assert int(stored) == 120_000
        # the scout's turn is one Crawl-delay after robots.txt, the next one more: nothing of
        # the host's pages goes out while the test looks (the next turn is minutes away)
        tat = int(admin.client.hget(admin.keys.tat, "127.0.0.2"))
        assert tat - admin.server_ms() > 100_000
        assert len(hits(site, "127.0.0.2")) <= 1
    finally:
        kill_worker(proc)


def test_a_crawl_delay_is_a_floor_under_the_controller_and_costs_other_hosts_nothing(
        redis_url, tmp_path, site_factory, worker_env):
    """Issue 35's "Crawl-delay host beside the others", bounded: with FLEET_ADAPTIVE on (the
    default) a host asking Crawl-delay: 5 gets no two requests closer than 5 s (robots.txt
    counts as its first), fleet-wide with 4 workers under a ceiling of 10 req/s, while the
    other host is crawled at its own rate meanwhile, nothing refused or lowered."""
    generate_site(tmp_path / "www", 40, 2, seed=4)
    site = site_factory(tmp_path / "www", binds=("127.0.0.2", "127.0.0.3"), behaviour={
        "robots": {"127.0.0.2": "User-agent: *\nCrawl-delay: 5\n"}})
    slow, other = site.urls[0], site.urls[1]
    push_urls([f"{slow}site/p/{i}.html" for i in range(4)]
              + [f"{other}site/p/{i}.html" for i in range(40)], redis_url, worker_env, tmp_path)
    run_workers(4, redis_url, worker_env, tmp_path,
                {"ROBOTSTXT_OBEY": True, "FLEET_HOST_RATE": 10, "FLEET_ADAPTIVE": True},
                timeout=300)
    admin = FrontierAdmin(redis_url, "fetch")
    assert admin.client.hget(admin.keys.crawldelay, "127.0.0.2") == b"5000"
    slow_log = sorted((r["t"], r["path"]) for r in site.requests() if r["addr"] == "127.0.0.2")
    assert [p for _, p in slow_log] == ["/robots.txt"] + [f"/site/p/{i}.html" for i in
                                                          range(4)], slow_log
    # turns 5 s apart by Redis's clock, never caught up (a delay is a minimum gap); at the
    # site a request that left its worker late may arrive a little closer to the next one
    # (tens of ms; 0.5 s allowed): a rate's catch-up would give 2.5 s, no floor 0.1 s
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(slow_log)]
    assert min(gaps) >= 4.5 and (slow_log[-1][0] - slow_log[0][0]) >= 4 * 5 - 0.5, gaps
    fast = hits(site, "127.0.0.3")
    assert len(fast) == 40  # each page once: nothing refused, nothing lost
    # the other host did not wait for the slow one: all of its 40 pages (4 s at its rate)
    # were fetched before the slow host's third page (15 s after its robots.txt) ...
    assert fast[-1] < slow_log[3][0], (fast[-1], slow_log)
    # ... under its own ceiling, and its controller saw no overload to lower it for
    assert max(sum(1 for t in fast if s <= t < s + 1.0) for s in fast) <= 11
    stats = {k.decode(): int(v) for k, v in admin.client.hgetall(admin.keys.stats).items()
             if v.isdigit()}
    assert stats.get("adaptive_decreases", 0) == stats.get("adaptive_latency_decreases", 0), \
        stats


def test_the_learned_capacity_outlives_the_crawl(redis_url, limited_site, worker_env, tmp_path):
    """Crawl A learns the host's capacity; it is kept fleet-wide (FLEET_ADAPTIVE_MEMORY, 7
    days), so crawl B of the same host, with none of A's keys left, starts there instead of
    at the ceiling."""
    site = limited_site()
    ok, refused, _, state = _crawl(redis_url, site, worker_env, tmp_path, adaptive=True)
    assert len(ok) == PAGES and state is not None and refused > 0
    client = FrontierAdmin(redis_url, "fetch").client
    memory = learned_capacity_key("fleet", "127.0.0.2")
    kept = client.get(memory)
    assert kept is not None, "no learned capacity kept"
    capacity = float(kept.decode().split("|")[0])
    assert 0 < capacity < CEILING, kept
    assert 6 * 86400_000 < client.pttl(memory) <= 7 * 86400_000
    # the crawl is gone (as after `reset`); the fleet-wide memory stays
    doomed = list(client.scan_iter(match="fleet:{fetch}:*", count=1000))
    client.delete(*doomed)
    assert client.get(memory) == kept
    before = len(site.requests())
    push_urls([f"{site.urls[0]}site/p/{i}.html" for i in range(6)], redis_url, worker_env,
              tmp_path)
    run_workers(1, redis_url, worker_env, tmp_path,
                {"FLEET_HOST_RATE": CEILING, "RETRY_TIMES": 50}, timeout=300)
    raw = client.hget(FrontierAdmin(redis_url, "fetch").keys.adaptive, "127.0.0.2")
    assert raw is not None
    fields = raw.decode().split("|")
    # B's controller began at A's capacity: its learned capacity is A's (or, refused again,
    # the lower rate it was refused at), never the ceiling (without the memory: none, or the
    # ceiling where B was first refused), and its rate has probed little above it
    assert 0 < float(fields[8]) <= capacity * 1.001 and float(fields[0]) <= capacity * 1.25, \
        (fields, kept)
    b_log = [r for r in site.requests()[before:] if r["path"].startswith("/site/p/")]
    assert {r["path"] for r in b_log if r["status"] == 200} == \
        {f"/site/p/{i}.html" for i in range(6)}


def test_a_host_asking_a_crawl_delay_over_the_limit_is_skipped(redis_url, tmp_path, site_factory,
                                                               worker_env):
    """FLEET_SKIP_CRAWL_DELAY_OVER (opt-in): every request of a host whose robots.txt asks
    more goes to the dead letters with the reason crawl_delay, without reaching the host and
    without waiting its Crawl-delay; the other host is crawled."""
    generate_site(tmp_path / "www", 8, 2, seed=4)
    site = site_factory(tmp_path / "www", binds=("127.0.0.2", "127.0.0.3"), behaviour={
        "robots": {"127.0.0.2": "User-agent: *\nCrawl-delay: 120\n"}})
    slow, other = site.urls[0], site.urls[1]
    push_urls([f"{u}site/p/{i}.html" for u in (slow, other) for i in range(6)], redis_url,
              worker_env, tmp_path)
    run_workers(2, redis_url, worker_env, tmp_path,
                {"ROBOTSTXT_OBEY": True, "FLEET_SKIP_CRAWL_DELAY_OVER": 60, "FLEET_HOST_RATE": 10},
                timeout=240)
    admin = FrontierAdmin(redis_url, "fetch")
    dead = list(admin.dead_letters(limit=100))
    assert sorted(d["reason"] for d in dead) == ["crawl_delay"] * 6, dead
    assert len(hits(site, "127.0.0.2")) == 0  # robots.txt only
    assert len(hits(site, "127.0.0.3")) == 6
    assert admin.client.hget(admin.keys.crawldelay, "127.0.0.2") is None  # no 120-s spacing
    listing = run_scrapy(TEST_PROJECT, ["fleet", "urls", "fetch", "--host", "127.0.0.2",
                                        "--state", "dead", "--json", "-s",
                                        f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.count("crawl_delay") == 6, listing.stdout
