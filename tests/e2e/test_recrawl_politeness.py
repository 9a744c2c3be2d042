"""Politeness under recrawl (issue 22): 4 workers revisiting one host at FLEET_HOST_RATE keep
its rate as for a first crawl (tests/e2e/test_politeness.py), counted from the site's own log.
bench/bench_recrawl_politeness.py measures the figure (R +- 2 %)."""

from __future__ import annotations

import bisect

import pytest
from support import TEST_PROJECT, start_worker, tail, wait_all, wait_until, worker_stats

pytestmark = pytest.mark.slow

PAGES = 12


def most_in_window(times: list[float], width: float) -> int:
    """The most requests in any window [t, t + width) (reached at t = a request)."""
    return max(bisect.bisect_left(times, t + width) - i for i, t in enumerate(times))


def test_revisits_from_four_workers_keep_the_hosts_rate(redis_url, tmp_path, site_factory,
                                                        worker_env):
    root = tmp_path / "www"
    root.mkdir()
    # half the pages change every 2 s: revisits answered 200 and 304
    site = site_factory(root, behaviour={"changing": {
        "pages": PAGES, "static_share": 1.0,
        "periods": {str(i): 2.0 for i in range(0, PAGES, 2)}}})
    # every page is due every second: the revisits ask for 12 requests a second, the host's
    # rate is 2, so the fleet is held by the rate all along
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_POLL_INTERVAL": 0.2,
                "FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 1,
                "FLEET_HOST_RATE": 2, "FLEET_HOST_BURST": 1}
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    procs = [start_worker(TEST_PROJECT, "recrawl",
                          {**settings, "FLEET_JSONL_PATH": str(tmp_path / f"items-{i}.jsonl")},
                          worker_env, logs[i], spider_args={"start": site.url + "changing/"})
             for i in range(4)]

    def requests() -> list[dict]:
        return [r for r in site.requests() if r["path"].startswith("/changing/")]

    try:
        wait_until(lambda: all(p.poll() is None for p in procs) and
                   len(requests()) >= PAGES + 1 + 60, 240, "60 revisits",
                   interval=0.5)
    finally:
        for proc in procs:
            proc.terminate()
        codes = wait_all(procs, 60)
    assert codes == [0] * 4, tail(logs[0])
    seen: set[str] = set()
    revisits = []
    for r in requests():
        if r["path"] in seen:
            revisits.append(r)
        seen.add(r["path"])
    assert len(revisits) >= 60
    statuses = {r["status"] for r in revisits}
    assert statuses >= {200, 304}, statuses  # conditional GETs, changed and unchanged pages
    # several workers took the revisits (their outcomes in each one's stats), and every
    # revisit the site answered was counted by a worker
    outcomes = [sum(worker_stats(log).get(f"fleet/recrawl/{k}", 0)
                    for k in ("not_modified", "unchanged", "changed")) for log in logs]
    assert sum(1 for n in outcomes if n) >= 2, outcomes
    assert sum(outcomes) >= len(revisits) - 4, (outcomes, len(revisits))  # (4 in flight)
    times = sorted(r["t"] for r in requests())
    revisit_times = sorted(r["t"] for r in revisits)
    # GCRA at 2/s, burst 1 (as for a first crawl, test_politeness.py): a turn taken late
    # keeps the schedule, so a short gap may follow a long one, but no window of w seconds
    # holds more than 2 w + 1 requests: 1 s, 2 s, 5 s, 10 s and the revisits' whole span
    for width, most in ((1.0, 3), (2.0, 5), (5.0, 11), (10.0, 21)):
        assert most_in_window(times, width) <= most, (width, times)
    # and over the revisits' whole span: 2 a second, plus the burst and one turn (the span's
    # first request may have been late by up to a turn, which the schedule then catches up)
    span = revisit_times[-1] - revisit_times[0]
    assert len(revisit_times) <= 2 * span + 2, (len(revisit_times), span)
