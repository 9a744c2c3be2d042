"""`pause` reaches a worker whose prefetch is full and whose downloads are slow (issue 34,
docs/control.md): such a worker has nothing to send until a download ends or its heartbeat
is due (30 s here), so it learned of a pause that late; it now calls at least every
frontier/control.py CONTROL_POLL seconds while it holds prefetched requests."""

from __future__ import annotations

import pytest
from support import TEST_PROJECT, run_scrapy, running, start_worker, tail, wait_until

from scrapy_fleet.commands import cli
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

pytestmark = pytest.mark.slow


def test_pause_is_confirmed_by_a_worker_with_a_full_prefetch_and_slow_downloads(
        redis_url, tmp_path, site_factory, worker_env, capsys):
    generate_site(tmp_path / "www", 10, 2, seed=8)
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 40.0}]})
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(f"{site.urls[0]}site/p/{i}.html\n" for i in range(10)))
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    log = tmp_path / "w.log"
    # one download at a time (40 s each) and one request prefetched behind it; heartbeat 30 s
    proc = start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "CONCURRENT_REQUESTS": 1,
        "FLEET_PREFETCH": 1, "FLEET_HEARTBEAT_INTERVAL": 30, "FLEET_LEASE_TIMEOUT": 120,
        "FLEET_WORKER_DEAD_AFTER": 120, "FLEET_WORKER_FORGET_AFTER": 600},
        worker_env, log)
    admin = FrontierAdmin(redis_url, "fetch")
    try:
        wait_until(lambda: running(proc, log=log) and admin.client.zcard(admin.keys.leases) == 2
                   and len([r for r in site.requests() if r["path"].startswith("/site/p/")])
                   == 1, 90, "one download on the wire and one request prefetched",
                   explain=lambda: tail(log))
        # its download ends 40 s after it started, its heartbeat is 30 s away: only the
        # control poll makes it call within the command's wait
        assert cli.main(["--redis", redis_url, "pause", "fetch", "--wait", "8"]) == 0, \
            capsys.readouterr().err
        assert len([r for r in site.requests() if r["path"].startswith("/site/p/")]) == 1
    finally:
        proc.kill()
        proc.wait()
        admin.close()
