"""Crawl groups with real workers (issue 34, docs/control.md "Crawl groups"): two crawls of
one group on the same hosts send each host at most its rate in all (two crawls without a
group send it twice: tests/lua/test_crawl_group_turns.py counts the turns of both cases), and
weights 3:1 share its requests 75/25 while both have work; counted from the site's log."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import TEST_PROJECT, run_scrapy, start_worker, tail, wait_all

from testsite import generate_site

BINDS = ("127.0.0.1", "127.0.0.2")
RATE = 8.0  # requests/s per host, fleet-wide
PAGES = 200

pytestmark = pytest.mark.slow


def push(crawl: str, urls: list[str], redis_url: str, env: dict[str, str],
         tmp_path: Path) -> None:
    listing = tmp_path / f"urls-{crawl}.txt"
    listing.write_text("\n".join(urls) + "\n")
    result = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing),
                                       "-s", f"FLEET_REDIS_URL={redis_url}",
                                       "-s", f"FLEET_CRAWL_ID={crawl}"], env)
    assert result.returncode == 0, result.stderr


def page_of(path: str) -> int:
    return int(path.rsplit("/", 1)[1].split(".")[0])


def run_two_crawls(redis_url, site, env, tmp_path, group: dict[str, dict[str, object]],
                   pages: dict[str, range]) -> dict[str, list[tuple[float, str]]]:
    """Push pages[c] of every host for crawl c, run 2 workers per crawl to the end; return
    host address -> sorted (arrival time, crawl) of its page requests."""
    for crawl, numbers in pages.items():
        push(crawl, [f"{base}site/p/{i}.html" for base in site.urls for i in numbers],
             redis_url, env, tmp_path)
    procs, logs = [], []
    for crawl, extra in group.items():
        for n in range(2):
            log = tmp_path / f"w-{crawl}-{n}.log"
            settings = {"FLEET_REDIS_URL": redis_url, "FLEET_CRAWL_ID": crawl,
                        "FLEET_IDLE_TIMEOUT": 1, "FLEET_HOST_RATE": RATE,
                        "FLEET_HOST_BURST": 1, **extra}
            procs.append(start_worker(TEST_PROJECT, "fetch", settings, env, log))
            logs.append(log)
    codes = wait_all(procs, 300)
    assert codes == [0] * len(procs), tail(logs[codes.index(next(c for c in codes if c))])
    owner = {i: crawl for crawl, numbers in pages.items() for i in numbers}
    out: dict[str, list[tuple[float, str]]] = {addr: [] for addr in BINDS}
    for r in site.requests():
        if r["path"].startswith("/site/p/"):
            out[r["addr"]].append((r["t"], owner[page_of(r["path"])]))
    return {addr: sorted(hits) for addr, hits in out.items()}


@pytest.fixture
def two_hosts(tmp_path, site_factory):
    generate_site(tmp_path / "www", PAGES, 2, seed=5)
    return site_factory(tmp_path / "www", binds=BINDS)


def test_two_crawls_of_a_group_share_each_hosts_rate_3_to_1(redis_url, two_hosts,
                                                            worker_env, tmp_path):
    pages = {"books": range(0, 120), "prices": range(120, 180)}
    hits = run_two_crawls(redis_url, two_hosts, worker_env, tmp_path,
                          {"books": {"FLEET_CRAWL_GROUP": "shop", "FLEET_CRAWL_WEIGHT": 3},
                           "prices": {"FLEET_CRAWL_GROUP": "shop", "FLEET_CRAWL_WEIGHT": 1}},
                          pages)
    for addr, seen in hits.items():
        assert len(seen) == 180, (addr, len(seen))  # every page of both crawls, once
        times = [t for t, _ in seen]
        # both crawls summed: the host's rate, not twice it (+5 %)
        assert (len(times) - 1) / (times[-1] - times[0]) <= RATE * 1.05, addr
        # while both have work (from the later crawl's first request to the first crawl to
        # finish's last), 75/25 within 5 points
        first = max(min(t for t, c in seen if c == crawl) for crawl in pages)
        last = min(max(t for t, c in seen if c == crawl) for crawl in pages)
        both = [c for t, c in seen if first <= t <= last]
        assert len(both) >= 100, (addr, len(both))
        share = both.count("books") / len(both)
        assert 0.70 <= share <= 0.80, (addr, share, len(both))

