"""Shared robots.txt in real crawls (issue 9, items 1 and 2): scrapy crawl workers of
tests/project against a closed port and local servers answering 503 / 429 for robots.txt,
a real redis-server; retried with a growing wait, given up after
FLEET_ROBOTSTXT_MAX_ATTEMPTS, per origin while politeness stays per host (lua/test_robots.py
calls the scripts directly)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from support import (
    TEST_PROJECT,
    free_port,
    read_items,
    start_worker,
    tail,
    wait_all,
    worker_stats,
)

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.politeness.hosts import robots_origin
from testsite import generate_site


def run_probe(n: int, urls: list[str], redis_url: str, env: dict[str, str], tmp_path: Path,
              extra: dict[str, object], timeout: float = 120) -> tuple[list[Path], list[Path]]:
    """*n* workers of the ``robots_probe`` spider (start requests *urls*, with an errback)."""
    outs = [tmp_path / f"out-{i}.jsonl" for i in range(n)]
    logs = [tmp_path / f"w-{i}.log" for i in range(n)]
    settings: dict[str, object] = {
        "FLEET_REDIS_URL": redis_url, "ROBOTSTXT_OBEY": True, "FLEET_IDLE_TIMEOUT": 3,
        "FLEET_BACKOFF_BASE": 0.2, "FLEET_BACKOFF_MAX": 2}
    settings.update(extra)
    procs = [start_worker(TEST_PROJECT, "robots_probe",
                          {**settings, "FLEET_JSONL_PATH": outs[i]}, env, logs[i],
                          spider_args={"urls": ",".join(urls)}) for i in range(n)]
    codes = wait_all(procs, timeout)  # an unreachable robots.txt must not keep them running
    assert codes == [0] * n, tail(logs[0])
    return outs, logs


def total(logs: list[Path], key: str) -> float:
    return sum(worker_stats(log).get(key, 0) for log in logs)


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["refused", 429])
def test_unfetchable_robots_txt_is_retried_then_its_requests_fail(
        failure, redis_url, worker_env, tmp_path, site_factory):
    if failure == "refused":
        base = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
        site = None
    else:
        generate_site(tmp_path / "www", 5, 1)
        site = site_factory(tmp_path / "www", behaviour={"robots_status": {"127.0.0.1": 429}})
        base = site.url
    url = f"{base}site/p/0.html"
    outs, logs = run_probe(2, [url], redis_url, worker_env, tmp_path,
                           {"FLEET_ROBOTSTXT_HOLD": 1, "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 3})
    # three attempts for the fleet, each by one worker, then the request failed: the crawl
    # ended by itself (idle close), with the reason in the errback and the dead letters
    assert total(logs, "fleet/politeness/robots_fetched") == 3
    # one request each (Scrapy's RetryMiddleware does not multiply them), and no page
    assert total(logs, "downloader/request_count") == 3
    assert total(logs, "fleet/politeness/robots_failed") == 3
    assert total(logs, "fleet/politeness/robots_hold") == 2  # sent back after attempts 1, 2
    assert total(logs, "fleet/politeness/robots_unreachable") == 1
    items = read_items(outs)
    assert [(i["url"], i["error"]) for i in items] == [(url, "RobotsTxtUnavailable")]
    origin = robots_origin(url)
    assert f"robots.txt of {origin} could not be fetched in 3 attempt(s)" in items[0]["message"]
    admin = FrontierAdmin(redis_url, "robots_probe")
    letters = list(admin.dead_letters())
    assert [codec.decode_dict(d["data"])["url"] for d in letters] == [url]
    assert letters[0]["reason"] == items[0]["message"]
    status = admin.status()
    assert (status["queued"], status["leased"], status["deferred"]) == (0, 0, 0)
    # logged once per origin, by the worker that gave up
    gave_up = sum(log.read_text().count("could not be fetched in 3 attempt(s)") for log in logs)
    assert gave_up == 1
    # waiting, nobody spins: the two workers' frontier and politeness round trips, counted
    # (about 50 over this crawl of ~12 s; the bug made ~190 frontier calls a second, over
    # 1,100 in the 6 s the holds and the idle close take at least; 600 would take a correct
    # fleet longer than wait_all's 120 s)
    calls = total(logs, "fleet/redis/roundtrips") + total(logs, "fleet/politeness/redis_calls")
    assert calls < 600, calls
    assert total(logs, "fleet/frontier/leased") == 3  # one lease per attempt, no more
    if site is not None:
        robots = sorted(r["t"] for r in site.requests() if r["path"] == "/robots.txt")
        assert len(robots) == 3
        gaps = [b - a for a, b in itertools.pairwise(robots)]
        # FLEET_ROBOTSTXT_HOLD * 2^(n-1): 1 s, then 2 s (a wait is never shorter)
        assert gaps[0] >= 0.95 and gaps[1] >= 1.95, gaps
        assert not [r for r in site.requests() if r["path"].startswith("/site/")]


@pytest.mark.slow
def test_robots_txt_is_per_origin_while_politeness_stays_per_host(
        redis_url, worker_env, tmp_path, site_factory):
    generate_site(tmp_path / "www", 20, 2, seed=3)
    www = tmp_path / "www"
    # three origins of one host (FLEET_HOST_KEY="host": one politeness key, 127.0.0.1)
    failing = site_factory(www, behaviour={"robots_status": {"127.0.0.1": 503}})
    one, two = (site_factory(www, behaviour={"robots": {
        "127.0.0.1": f"User-agent: *\nDisallow: /site/p/{n}\n"}}) for n in (1, 2))
    urls = [f"{failing.url}site/p/{i}.html" for i in range(3)]
    urls += [f"{site.url}site/p/{i}.html" for site in (one, two) for i in range(10)]
    outs, logs = run_probe(2, urls, redis_url, worker_env, tmp_path,
                           {"FLEET_ROBOTSTXT_HOLD": 6, "FLEET_ROBOTSTXT_MAX_ATTEMPTS": 2,
                            "FLEET_HOST_KEY": "host"})
    failing_robots = sorted(r["t"] for r in failing.requests() if r["path"] == "/robots.txt")
    assert len(failing_robots) == 2  # two attempts, then given up
    assert failing_robots[1] - failing_robots[0] >= 5.95
    assert not [r for r in failing.requests() if r["path"] != "/robots.txt"]
    # each origin's robots.txt fetched once and its own rules applied to its own pages
    for site, forbidden in ((one, "/site/p/1.html"), (two, "/site/p/2.html")):
        paths = [r["path"] for r in site.requests()]
        assert paths.count("/robots.txt") == 1
        expected = {f"/site/p/{i}.html" for i in range(10)} - {forbidden}
        assert {p for p in paths if p != "/robots.txt"} == expected
        # not held back by the failing origin: done before its second robots.txt attempt
        assert max(r["t"] for r in site.requests()) < failing_robots[1]
    items = read_items(outs)
    failed = sorted(i["url"] for i in items if i.get("error") == "RobotsTxtUnavailable")
    assert failed == sorted(urls[:3])
    assert len([i for i in items if i.get("status") == 200]) == 18
    assert total(logs, "fleet/politeness/robots_unreachable") == 3
    letters = list(FrontierAdmin(redis_url, "robots_probe").dead_letters())
    assert len(letters) == 3
    assert all(robots_origin(failing.url) in d["reason"] for d in letters)
