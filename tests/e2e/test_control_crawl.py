"""Crawl control end to end (issue 34, docs/control.md): real workers against a local site
of three hosts; `pause` and `host block` return only once every live worker holds them, and
the site sees no request start after that."""

from __future__ import annotations

import signal
import time

import pytest
from support import TEST_PROJECT, run_scrapy, start_worker, tail, wait_all, wait_until

from scrapy_fleet.commands import cli
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

BINDS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
PAGES = 15  # per host

pytestmark = pytest.mark.slow


@pytest.fixture
def crawl(redis_url, tmp_path, site_factory, worker_env):
    """Three hosts (each page answered after 1 s: requests are in flight when the command
    runs), PAGES pushed per host, two workers started; yields (site, procs, logs, env)."""
    generate_site(tmp_path / "www", 60, 2, seed=4)
    site = site_factory(tmp_path / "www", binds=BINDS,
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 1.0}]})
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(f"{u}site/p/{i}.html\n" for u in site.urls
                               for i in range(PAGES)))
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    # (each worker downloads one request at a time and leases one more while it waits for
    # the answer (1 s): at any time a leased request waits in each worker, unsent; the
    # pause must hold those back too)
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1,
                "CONCURRENT_REQUESTS": 1}
    logs = [tmp_path / f"w-{i}.log" for i in range(2)]
    procs = [start_worker(TEST_PROJECT, "fetch", settings, worker_env, logs[i])
             for i in range(2)]
    yield site, procs, logs, worker_env
    for p in procs:
        if p.poll() is None:
            p.kill()


def page_hits(site) -> list[dict]:
    return [r for r in site.requests() if r["path"].startswith("/site/p/")]


def acked(redis_url: str) -> int:
    admin = FrontierAdmin(redis_url, "fetch")
    try:
        return int(admin.client.hget(admin.keys.stats, "acked") or 0)
    finally:
        admin.close()


def leased(redis_url: str) -> int:
    admin = FrontierAdmin(redis_url, "fetch")
    try:
        return int(admin.client.zcard(admin.keys.leases))
    finally:
        admin.close()


def test_nothing_starts_after_pause_returns_and_resume_fetches_each_page_once(
        redis_url, crawl, capsys):
    site, procs, logs, _ = crawl
    # each worker downloading one request and holding the next one leased, unsent
    wait_until(lambda: len(page_hits(site)) >= 2 and leased(redis_url) == 4, 60,
               "both workers with a request on the wire and one waiting")
    assert cli.main(["--redis", redis_url, "pause", "fetch", "--reason", "test",
                     "--wait", "30"]) == 0, capsys.readouterr().err
    returned = time.time()
    at_pause = len(page_hits(site))
    # every request on the wire finishes and is acknowledged (none is left hanging)
    wait_until(lambda: acked(redis_url) == len(page_hits(site)), 60,
               "the requests in flight at the pause acknowledged")
    time.sleep(3)  # (an observation window three times FLEET_IDLE_TIMEOUT: nothing may start)
    started = [r for r in page_hits(site) if r["t"] > returned]
    assert started == []
    assert len(page_hits(site)) == at_pause < 3 * PAGES
    assert [p.poll() for p in procs] == [None, None]  # paused is not idle: nobody closed
    # a worker stopped while paused (SIGTERM) gives back the request it holds and exits
    procs[0].send_signal(signal.SIGTERM)
    assert wait_all(procs[:1], 60) == [0], tail(logs[0])
    assert cli.main(["--redis", redis_url, "resume", "fetch"]) == 0
    assert wait_all(procs, 180) == [0, 0], tail(logs[1])
    paths = [r["addr"] + r["path"] for r in page_hits(site)]
    assert len(paths) == len(set(paths)) == 3 * PAGES  # each page once


def test_host_block_stops_one_host_while_the_others_are_served(redis_url, crawl):
    site, procs, logs, env = crawl
    # (the queue is FIFO: the first host's pages are leased first) each worker downloading
    # one request of 127.0.0.1 and holding the next one leased, unsent
    wait_until(lambda: len(page_hits(site)) >= 2 and leased(redis_url) == 4, 60,
               "both workers with a request on the wire and one waiting")
    blocked_host, others = "127.0.0.1", ("127.0.0.2", "127.0.0.3")
    assert cli.main(["--redis", redis_url, "host", "block", "fetch", blocked_host,
                     "--reason", "test", "--wait", "30"]) == 0
    returned = time.time()
    wait_until(lambda: sum(r["addr"] in others for r in page_hits(site)) == 2 * PAGES, 120,
               "the other hosts served to the end")
    blocked = [r for r in page_hits(site) if r["addr"] == blocked_host]
    assert [r for r in blocked if r["t"] > returned] == []
    assert len(blocked) < PAGES
    assert [p.poll() for p in procs] == [None, None]  # its queue is kept: not idle
    # (inside the project: scrapy fleet host VERB SPIDER HOST)
    result = run_scrapy(TEST_PROJECT, ["fleet", "host", "unblock", "fetch", blocked_host,
                                       "-s", f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0 and "unblocked host 127.0.0.1" in result.stdout, result.stderr
    assert wait_all(procs, 180) == [0, 0], tail(logs[0])
    paths = [r["addr"] + r["path"] for r in page_hits(site)]
    assert len(paths) == len(set(paths)) == 3 * PAGES
