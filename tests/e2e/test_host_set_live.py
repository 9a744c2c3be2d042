"""`host set --rate` taken live by the lease step (issue 34, docs/control.md): a worker
crawling a host at 8 requests/s is slowed to 2/s by the command, without a restart; counted
from the site's own log."""

from __future__ import annotations

import time

import pytest
from support import TEST_PROJECT, run_scrapy, running, start_worker, tail, wait_until

from scrapy_fleet.commands import cli
from testsite import generate_site

pytestmark = pytest.mark.slow

PAGES = 60


def most_in(times: list[float], window: float) -> int:
    """The most hits in any *window* seconds starting at a hit."""
    return max(sum(1 for t in times if s <= t < s + window) for s in times)


def test_host_set_rate_slows_the_host_at_its_next_lease(redis_url, tmp_path, site_factory,
                                                        worker_env, capsys):
    generate_site(tmp_path / "www", PAGES, 2, seed=6)
    site = site_factory(tmp_path / "www")
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(f"{site.urls[0]}site/p/{i}.html\n" for i in range(PAGES)))
    pushed = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", "-f", str(listing), "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    log = tmp_path / "w.log"
    proc = start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_HOST_RATE": 8,
        "FLEET_HOST_BURST": 1}, worker_env, log)

    def hits() -> list[float]:
        return sorted(r["t"] for r in site.requests() if r["path"].startswith("/site/p/"))

    try:
        wait_until(lambda: running(proc, log=log) and len(hits()) >= 16, 90, "16 pages",
                   explain=lambda: tail(log))
        assert cli.main(["--redis", redis_url, "host", "set", "fetch", "127.0.0.1",
                         "--rate", "2"]) == 0, capsys.readouterr().err
        set_at = time.time()
        before = [t for t in hits() if t < set_at]
        # (a lease granted before the command may still go out just after it: skip 1 s)
        wait_until(lambda: running(proc, log=log) and len(
            [t for t in hits() if t >= set_at + 1.0]) >= 10, 90, "10 pages after the set",
            explain=lambda: tail(log))
        after = [t for t in hits() if t >= set_at + 1.0]
    finally:
        proc.kill()
        proc.wait()
    assert most_in(before, 1.0) >= 6  # 8/s before (GCRA, burst 1)
    assert most_in(after, 2.0) <= 5  # 2/s after: 4 turns in 2 s, one more at its edge
    assert (len(after) - 1) / (after[-1] - after[0]) <= 2.1
