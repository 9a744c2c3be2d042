"""A pause outlives the workers and Redis (issue 34, docs/control.md): paused, every worker
killed with SIGKILL and Redis killed and started again from its append-only file, new
workers start no request and none closes for idleness; after `resume` every page is fetched
exactly once.  Real parts: a redis-server with appendonly (fsync always), the test site,
real ``scrapy crawl`` workers."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from support import (
    TEST_PROJECT,
    RedisServer,
    kill_worker,
    run_scrapy,
    running,
    server_ms,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.commands import cli, control
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

pytestmark = pytest.mark.slow

PAGES = 40
QUIET_MS = 8000  #: Redis time the new workers are watched while paused


def start_workers(url: str, env, tmp_path: Path, tag: str) -> tuple[list, list[Path]]:
    # (a page answered after 0.3 s, one download at a time: leases wait in each worker)
    settings = {"FLEET_REDIS_URL": url, "FLEET_IDLE_TIMEOUT": 1, "CONCURRENT_REQUESTS": 1,
                "FLEET_LEASE_TIMEOUT": 60}
    logs = [tmp_path / f"w-{tag}-{i}.log" for i in range(2)]
    return [start_worker(TEST_PROJECT, "fetch", settings, env, log) for log in logs], logs


def test_a_pause_holds_through_sigkill_of_every_worker_and_a_redis_restart(
        tmp_path, site_factory, worker_env, capsys):
    generate_site(tmp_path / "www", PAGES, 2, seed=3)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 0.3}]})
    server = RedisServer(tmp_path / "redis", persistent=True)
    server.start()
    procs: list = []
    try:
        listing = tmp_path / "urls.txt"
        listing.write_text("".join(f"{site.urls[0]}site/p/{i}.html\n" for i in range(PAGES)))
        pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), "-s",
                                           f"FLEET_REDIS_URL={server.url}"], worker_env)
        assert pushed.returncode == 0, pushed.stderr
        procs, logs = start_workers(server.url, worker_env, tmp_path, "a")

        def hits() -> list[dict]:
            return [r for r in site.requests() if r["path"].startswith("/site/p/")]

        wait_until(lambda: running(*procs, log=logs[0]) and len(hits()) >= 4, 90,
                   "4 pages fetched", explain=lambda: tail(logs[0]))
        assert cli.main(["--redis", server.url, "pause", "fetch", "--reason", "durable",
                         "--wait", "30"]) == 0, capsys.readouterr().err
        admin = FrontierAdmin(server.url, "fetch")
        # the requests on the wire finish and are acknowledged; then nothing more starts
        wait_until(lambda: int(admin.client.hget(admin.keys.stats, "acked") or 0)
                   == len(hits()), 30, "every request sent acknowledged")
        at_pause = len(hits())
        admin.close()
        for p in procs:
            kill_worker(p)
        server.kill()
        server.start()  # from the append-only file
        admin = FrontierAdmin(server.url, "fetch")
        state = control.read_state(admin)
        assert state is not None and state["paused"] and state["why"] == "durable"
        procs, logs = start_workers(server.url, worker_env, tmp_path, "b")
        until = server_ms(admin.client) + QUIET_MS
        # watched on Redis's clock: both workers run (a paused crawl is not idle) and the
        # site sees no request
        wait_until(lambda: running(*procs, log=logs[0]) and len(hits()) == at_pause
                   and server_ms(admin.client) >= until, QUIET_MS / 1000 + 60,
                   "the paused crawl watched", explain=lambda: tail(logs[0]))
        assert len(hits()) == at_pause
        assert all(p.poll() is None for p in procs), tail(logs[0]) + tail(logs[1])
        assert cli.main(["--redis", server.url, "resume", "fetch"]) == 0
        assert wait_all(procs, 180) == [0, 0], tail(logs[0]) + tail(logs[1])
        admin.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.stop()
    paths = [r["path"] for r in hits()]
    assert len(set(paths)) == PAGES  # nothing lost
    assert collections.Counter(paths).most_common(1)[0][1] == 1  # nothing fetched twice
