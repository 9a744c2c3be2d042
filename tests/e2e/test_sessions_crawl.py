"""Cookies are fleet state (issue 32, docs/sessions.md): plain Scrapy spiders that log in and
follow links, several real ``scrapy crawl`` workers, a real Redis and a local login site
(tests/loginsite.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import loginsite
import pytest
import redis
from support import (
    TEST_PROJECT,
    read_items,
    run_scrapy,
    start_worker,
    stop_process,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.sessions.pool import pool_report

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parents[1]


class LoginSite:
    def __init__(self, proc: subprocess.Popen[str], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text("utf-8").splitlines() if line]


@pytest.fixture
def login_site(tmp_path: Path) -> Iterator[Callable[[int], LoginSite]]:
    started: list[LoginSite] = []

    def factory(pages: int, flaky: int = 0, expire: int = 0, ban: int = 0,
                login_delay: float = 0.0, page_delay: float = 0.0) -> LoginSite:
        log = tmp_path / f"loginsite-{len(started)}.jsonl"
        proc, url = loginsite.launch(str(log), pages, flaky=flaky, expire=expire, ban=ban,
                                     login_delay=login_delay, page_delay=page_delay)
        site = LoginSite(proc, url, log)
        started.append(site)
        return site

    yield factory
    for site in started:
        stop_process(site.proc)


def crawl(tmp_path: Path, redis_url: str, env: dict[str, str], spider: str, workers: int,
          site: LoginSite, settings: dict[str, Any] | None = None,
          spider_args: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], list[Path]]:
    outs = [tmp_path / f"{spider}-out-{n}.jsonl" for n in range(workers)]
    logs = [tmp_path / f"{spider}-worker-{n}.log" for n in range(workers)]
    procs = []
    for n in range(workers):
        s = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2, "FLEET_JSONL_PATH": outs[n],
             "CONCURRENT_REQUESTS": 8, "FLEET_PREFETCH": 4, "LOG_LEVEL": "INFO",
             **(settings or {})}
        procs.append(start_worker(TEST_PROJECT, spider, s, env, logs[n],
                                  {"site": site.url, **(spider_args or {})}))
    codes = wait_all(procs, 300)
    for n, code in enumerate(codes):
        assert code == 0, f"worker {n} exited {code}:\n{tail(logs[n])}"
    return read_items(outs), logs


def members_outcome(site: LoginSite, items: list[dict[str, Any]]) -> dict[str, int]:
    pages = [i for i in items if "/members/p/" in i["url"]]
    seen = [r for r in site.requests() if r["path"].startswith("/members/p/")]
    return {"items": len(pages), "member_items": sum(i["member"] for i in pages),
            "login_form_items": sum(i["login_form"] for i in pages),
            "fetched": len(seen), "fetched_logged_in": sum(r["member"] for r in seen),
            "logins": sum(r["login"] for r in site.requests())}


def test_a_login_holds_for_every_page_whichever_worker_fetches_it(
        redis_url, login_site, worker_env, tmp_path):
    """A plain spider (FormRequest login, a 302 with Set-Cookie, then links followed), three
    workers: every members page is fetched logged in, none comes back as the login form;
    the retries of the 12 pages that answered 503 first went logged in too."""
    site = login_site(120, flaky=10, page_delay=0.2)
    items, logs = crawl(tmp_path, redis_url, worker_env, "login_members", 3, site)
    assert members_outcome(site, items) == {
        "items": 120, "member_items": 120, "login_form_items": 0, "fetched": 132,
        "fetched_logged_in": 132, "logins": 1}
    workers_with_pages = sum(1 for log in logs if "fleet/cookies/reads" in log.read_text())
    assert workers_with_pages >= 2, "the pages were not spread over the workers"


def test_four_workers_on_one_session_lose_no_cookie(redis_url, login_site, worker_env,
                                                    tmp_path):
    """Each page sets a cookie of its own, four workers merge them into one session's jar at
    once: the jar ends with every one of them (per-cookie merges, no whole-jar overwrite)."""
    site = login_site(300)
    items, _ = crawl(tmp_path, redis_url, worker_env, "cookie_marks", 4, site,
                     spider_args={"jar": "shared"})
    assert len({i["url"] for i in items}) == 301
    client = redis.Redis.from_url(redis_url)
    jar = client.hkeys(CrawlKeys("fleet", "cookie_marks").cookie_jar("shared"))
    names = {key.decode().split("\t")[2] for key in jar}
    assert names == {f"m{i}" for i in range(300)}
    # the fleet's jar is the one the requests used: the pages fetched last carried the
    # cookies the others had set, whichever worker set them
    carried = max(len(r["cookies"]) for r in site.requests() if r["path"].startswith("/mark/"))
    assert carried > 150
    # the jars are the crawl's state: purge deletes them with the rest
    purged = run_scrapy(TEST_PROJECT, ["fleet", "purge", "cookie_marks", "--yes", "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert purged.returncode == 0, purged.stderr
    assert client.exists(CrawlKeys("fleet", "cookie_marks").cookie_jar("shared")) == 0


def test_a_cookie_too_large_is_a_failed_record_never_a_silent_drop(redis_url, login_site,
                                                                  worker_env, tmp_path):
    site = login_site(5)
    items, _ = crawl(tmp_path, redis_url, worker_env, "cookie_marks", 1, site,
                     spider_args={"extra": "big.html"})
    assert {"failed": site.url + "big.html", "error": "CookieTooLargeError"} in items
    assert len([i for i in items if "url" in i]) == 6
    listed = run_scrapy(TEST_PROJECT, ["fleet", "failed", "cookie_marks", "--json", "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["url"], r["reason"]) for r in rows] == [(site.url + "big.html",
                                                        "cookie/too_large")]
    assert "'big' for 127.0.0.1/ (5013 bytes)" in rows[0]["message"]
    assert "bbbb" not in listed.stdout


def pool_outcome(site: LoginSite, items: list[dict[str, Any]]) -> dict[str, Any]:
    """What a session-pool crawl of the members pages got: pages itemised logged in, pages
    itemised as the login form, logins the site granted, ends of sessions it saw."""
    pages = {i["url"]: i for i in items if "/members/p/" in i["url"]}
    log = site.requests()
    return {"pages": len(pages), "member_pages": sum(i["member"] for i in pages.values()),
            "login_form_items": sum(i["login_form"] for i in items),
            "items": len(items),
            "logins": sum(r["login"] for r in log),
            "expired": sum(bool(r.get("expired")) for r in log),
            "banned": sum(bool(r.get("banned")) for r in log)}


def pool_crawl(tmp_path: Path, redis_url: str, env: dict[str, str], site: LoginSite,
               **settings: Any) -> tuple[list[dict[str, Any]], list[Path]]:
    return crawl(tmp_path, redis_url, env, "pool_members", 3, site,
                 settings={"CONCURRENT_REQUESTS": 4, **settings})


def test_a_pool_of_two_sessions_logs_in_exactly_twice_across_three_workers(
        redis_url, login_site, worker_env, tmp_path):
    """Issue 32 items 2 and 4: the spider declares its login; three workers, a pool of two
    sessions: every members page logged in, no login form, exactly two logins (one per
    session, whichever worker needed it first), and both sessions served pages."""
    site = login_site(60, page_delay=0.4)
    items, logs = pool_crawl(tmp_path, redis_url, worker_env, site)
    assert pool_outcome(site, items) == {"pages": 60, "member_pages": 60,
                                         "login_form_items": 0, "items": 62, "logins": 2,
                                         "expired": 0, "banned": 0}
    sessions = {i["session"] for i in items}
    assert sessions == {"127.0.0.1-1", "127.0.0.1-2"}
    # the members pages went out with the cookie of the session that drew them
    members = [r for r in site.requests() if r["path"].startswith("/members/")]
    assert all(r["member"] for r in members)
    assert len({r["sid"] for r in members}) == 2
    busy = sum(1 for log in logs if "fleet/sessions/pinned" in log.read_text())
    assert busy >= 2, "the pages were not spread over the workers"
    listed = run_scrapy(TEST_PROJECT, ["fleet", "sessions", "pool_members", "--json", "-s",
                                       f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert listed.returncode == 0, listed.stderr
    pools = json.loads(listed.stdout)
    assert [p["pool"] for p in pools] == ["127.0.0.1"]
    assert pools[0]["counters"]["logins"] == 2
    assert {s: r["state"] for s, r in pools[0]["sessions"].items()} == {
        "127.0.0.1-1": "active", "127.0.0.1-2": "active"}
    assert "sid=" not in listed.stdout


def test_expired_sessions_log_in_again_once_per_expiry_and_lose_no_page(
        redis_url, login_site, worker_env, tmp_path):
    """The site ends a session after 15 members pages: each end costs exactly one login
    (not one per worker that noticed), and every page that got the login form is fetched
    again on the new generation: all pages itemised logged in."""
    site = login_site(80, expire=15)
    items, _ = pool_crawl(tmp_path, redis_url, worker_env, site)
    outcome = pool_outcome(site, items)
    assert outcome["expired"] >= 4
    assert outcome["logins"] == 2 + outcome["expired"]
    assert {k: outcome[k] for k in ("pages", "member_pages", "login_form_items", "items")} \
        == {"pages": 80, "member_pages": 80, "login_form_items": 0, "items": 82}


def test_a_403_retires_the_session_and_its_pages_go_through_a_new_one(
        redis_url, login_site, worker_env, tmp_path):
    """The site answers 403 to a session after 20 members pages: the session is retired
    (status/403), a replacement logs in, the refused pages are fetched again through it."""
    site = login_site(50, ban=20)
    items, _ = pool_crawl(tmp_path, redis_url, worker_env, site)
    outcome = pool_outcome(site, items)
    assert outcome["banned"] >= 1
    assert outcome["logins"] == 2 + outcome["banned"]
    assert {k: outcome[k] for k in ("pages", "member_pages", "login_form_items", "items")} \
        == {"pages": 50, "member_pages": 50, "login_form_items": 0, "items": 52}
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "pool_members")
    reasons = {k.decode(): int(v) for k, v in
               client.hgetall(keys.session_pool_info("127.0.0.1")).items()
               if k.startswith(b"retired:")}
    assert reasons == {"retired:status/403": outcome["banned"]}


def test_without_inheritance_every_request_draws_the_least_used_session(
        redis_url, login_site, worker_env, tmp_path):
    """FLEET_SESSION_INHERIT = False: each members page draws from the pool, least used
    first: both sessions serve about half the pages, still two logins in all."""
    site = login_site(60)
    items, _ = pool_crawl(tmp_path, redis_url, worker_env, site, FLEET_SESSION_INHERIT=False)
    assert pool_outcome(site, items) == {"pages": 60, "member_pages": 60,
                                         "login_form_items": 0, "items": 62, "logins": 2,
                                         "expired": 0, "banned": 0}
    per_session = {s: sum(i["session"] == s for i in items) for s in ("127.0.0.1-1",
                                                                      "127.0.0.1-2")}
    assert min(per_session.values()) >= 25, per_session
    uses = pool_report(redis.Redis.from_url(redis_url), CrawlKeys("fleet", "pool_members"),
                       "127.0.0.1")["sessions"]
    assert sum(int(r["uses"]) for r in uses.values()) == 62
    assert abs(int(uses["127.0.0.1-1"]["uses"]) - int(uses["127.0.0.1-2"]["uses"])) <= 1


def test_a_login_whose_worker_is_killed_is_taken_over_once(redis_url, login_site, worker_env,
                                                           tmp_path):
    """The worker running a session's login is SIGKILLed while the site holds its POST: its
    claim runs out (FLEET_SESSION_LOGIN_TIMEOUT) and exactly one of the two workers started
    then logs the session in; every page is fetched logged in."""
    site = login_site(30, login_delay=6)
    settings = {"FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 3, "CONCURRENT_REQUESTS": 4,
                "FLEET_LEASE_TIMEOUT": 3, "FLEET_SESSION_POOL_SIZE": 1,
                "FLEET_SESSION_LOGIN_TIMEOUT": 3, "LOG_LEVEL": "INFO"}
    first = start_worker(TEST_PROJECT, "pool_members", {
        **settings, "FLEET_JSONL_PATH": tmp_path / "out-0.jsonl"}, worker_env,
        tmp_path / "w-0.log", {"site": site.url})
    wait_until(lambda: any(r.get("started") for r in site.requests()), 120,
               "the first login at the site")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    others = [start_worker(TEST_PROJECT, "pool_members", {
        **settings, "FLEET_JSONL_PATH": tmp_path / f"out-{k}.jsonl"}, worker_env,
        tmp_path / f"w-{k}.log", {"site": site.url}) for k in (1, 2)]
    assert wait_all(others, 240) == [0, 0], tail(tmp_path / "w-1.log")
    items = read_items([tmp_path / f"out-{k}.jsonl" for k in range(3)])
    pages = {i["url"] for i in items if i["member"]}
    assert len(pages) == 32 and not [i for i in items if i["login_form"]]
    # the killed worker's POST is granted by the site after its delay (maybe after the
    # crawl's end): then it and exactly one more
    wait_until(lambda: sum(r.get("login", False) for r in site.requests()) >= 2, 60,
               "the killed worker's login answered")
    posts = [r for r in site.requests() if r["method"] == "POST"]
    assert len([r for r in posts if r.get("started")]) == 1  # the killed worker's
    assert sum(r.get("login", False) for r in posts) == 2
    logs = [(tmp_path / f"w-{k}.log").read_text() for k in (1, 2)]
    assert sum(log.count("session 127.0.0.1-1 logged in") for log in logs) == 1
    record = redis.Redis.from_url(redis_url).hgetall(
        CrawlKeys("fleet", "pool_members").session("127.0.0.1-1"))
    assert (record[b"state"], record[b"generation"]) == (b"active", b"1")
