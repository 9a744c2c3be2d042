"""Politeness per session (issue 32 item 5): real ``scrapy crawl`` workers of the pool spider,
a real Redis, the login site (tests/loginsite.py ``--conflict``) answering 409 to a request of
a session while another request of that session is being answered."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import loginsite
import pytest
from support import TEST_PROJECT, read_items, start_worker, stop_process, tail, wait_all, wait_until

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1]


@pytest.fixture
def conflict_site(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    started: list[subprocess.Popen[str]] = []

    def factory(pages: int, hold: float, expire: int = 0) -> tuple[str, Path]:
        log = tmp_path / f"site-{len(started)}.jsonl"
        proc, url = loginsite.launch(str(log), pages, conflict=hold, expire=expire)
        started.append(proc)
        return url, log

    yield factory
    for proc in started:
        stop_process(proc)


def crawl(tmp_path: Path, redis_url: str, env: dict[str, str], url: str, name: str,
          stats: dict[str, int] | None = None, **settings: Any) -> list[dict[str, Any]]:
    """The pool spider's crawl of *url* by three workers; *stats*, when given, receives the
    sum of the workers' ``fleet/sessions/*`` stats."""
    outs = [tmp_path / f"{name}-out-{n}.jsonl" for n in range(3)]
    logs = [tmp_path / f"{name}-worker-{n}.log" for n in range(3)]
    base = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2, "CONCURRENT_REQUESTS": 8,
            "FLEET_PREFETCH": 4, "LOG_LEVEL": "INFO", "FLEET_CRAWL_ID": name, **settings}
    procs = [start_worker(TEST_PROJECT, "pool_members", {**base, "FLEET_JSONL_PATH": out},
                          env, log, {"site": url}) for out, log in zip(outs, logs, strict=True)]
    for n, code in enumerate(wait_all(procs, 300)):
        assert code == 0, f"worker {n} exited {code}:\n{tail(logs[n])}"
    if stats is not None:
        for log in logs:
            for key, value in re.findall(r"'fleet/sessions/([a-z_/]+)': (\d+)", log.read_text()):
                stats[key] = stats.get(key, 0) + int(value)
    return read_items(outs)


def outcome(log: Path, items: list[dict[str, Any]]) -> dict[str, int]:
    requests = [json.loads(line) for line in log.read_text("utf-8").splitlines() if line]
    return {"conflicts": sum(bool(r.get("conflict")) for r in requests),
            "expired": sum(bool(r.get("expired")) for r in requests),
            "logins": sum(bool(r.get("login")) for r in requests),
            "member_pages": len({i["url"] for i in items
                                 if "/members/p/" in i.get("url", "") and i["member"]})}


def test_one_request_per_session_at_a_time_across_three_workers(
        redis_url, conflict_site, worker_env, tmp_path):
    """FLEET_SESSION_CONCURRENCY = 1 (the default): three workers of 8 concurrent requests
    each, a pool of two sessions: the site never sees two requests of one session at once
    (0 answers 409), and every page is fetched logged in.  Without the cap (0) the same crawl
    meets 409s: the site does see them."""
    url, log = conflict_site(40, 0.15)
    items = crawl(tmp_path, redis_url, worker_env, url, "capped")
    assert outcome(log, items) == {"conflicts": 0, "expired": 0, "logins": 2,
                                   "member_pages": 40}
    url, log = conflict_site(40, 0.15)
    items = crawl(tmp_path, redis_url, worker_env, url, "uncapped",
                  FLEET_SESSION_CONCURRENCY=0)
    assert outcome(log, items)["conflicts"] > 0


def test_requests_wait_for_a_relogin_in_the_frontier_and_it_runs_once(
        redis_url, conflict_site, worker_env, tmp_path):
    """The site ends a session after 12 members pages; no cap on a session's requests in
    flight, so many requests of a session are out when it needs its login again: those that
    meet the login running go back to the frontier (deferred), none waits in its worker for
    it, each end of a session costs exactly one login, and every page is fetched logged in."""
    url, log = conflict_site(60, 0.0, expire=12)
    stats: dict[str, int] = {}
    items = crawl(tmp_path, redis_url, worker_env, url, "relogins", stats,
                  FLEET_SESSION_CONCURRENCY=0)
    got = outcome(log, items)
    assert got["expired"] >= 3
    assert got["logins"] == 2 + got["expired"]
    assert got["member_pages"] == 60 and got["conflicts"] == 0
    assert stats.get("deferred", 0) > 0 and stats.get("waits", 0) == 0, stats


def test_a_slot_is_given_back_when_a_later_middleware_raises(
        redis_url, conflict_site, worker_env, tmp_path):
    """A pool of one session, 6 pages each answered with a cookie too large for the fleet's
    jar: the cookies middleware (700) raises in ``process_response`` after the download, so
    the sessions middleware (545) never sees the answer.  Each page's slot is still given
    back (the engine's final result), so the session's next request goes at once: the site
    gets all 6 requests while a leaked slot (it would run out after DOWNLOAD_TIMEOUT + 60 =
    660 s) would hold every request after the first; each fails with CookieTooLargeError."""
    url, log = conflict_site(1, 0.0)
    out, wlog = tmp_path / "big-out.jsonl", tmp_path / "big-worker.log"
    proc = start_worker(TEST_PROJECT, "pool_big_cookies", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2, "CONCURRENT_REQUESTS": 8,
        "FLEET_CRAWL_ID": "bigslots", "DOWNLOAD_TIMEOUT": 600, "LOG_LEVEL": "INFO",
        "FLEET_JSONL_PATH": out}, worker_env, wlog, {"site": url, "pages": 6})
    try:
        def fetched() -> int:
            return sum("/big.html" in json.loads(line).get("path", "")
                       for line in log.read_text("utf-8").splitlines() if line) \
                if log.exists() else 0

        wait_until(lambda: fetched() == 6, 120, "6 requests of the one session",
                   explain=lambda: f"{fetched()} fetched\n{tail(wlog)}")
        assert wait_all([proc], 120) == [0], tail(wlog)
    finally:
        stop_process(proc)
    items = read_items([out])
    assert sorted(i["failed"] for i in items) == sorted(f"{url}big.html?i={i}" for i in range(6))
    assert {i["error"] for i in items} == {"CookieTooLargeError"}
    assert {i["session"] for i in items} == {"127.0.0.1-1"}
