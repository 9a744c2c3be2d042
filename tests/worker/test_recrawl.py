"""Recrawl with real workers against the changing test site (testsite/changing.py): a static
page's revisits are answered 304 and its interval grows while a changing page's shrinks; a
worker killed during a revisit loses nothing; a page gone (404 repeated) leaves the
schedule."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis
from support import (
    TEST_PROJECT,
    kill_worker,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet import codec
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.schedule import STATE_META_KEY, State

KEYS = CrawlKeys("fleet", "recrawl")


def tracked_states(client: redis.Redis) -> dict[str, State]:
    """URL -> state of every record waiting in the schedule."""
    out = {}
    for slot in client.zrange(KEYS.revisit_index, 0, -1):
        for rec in client.lrange(KEYS.revisit_slot(slot.decode()), 0, -1):
            if not rec:
                continue  # a record's tombstone (made due by a sitemap lastmod)
            payload = rec.split(b"\t", 2)[2]
            request = codec.decode_dict(payload)  # (callbacks by name: no spider here)
            state = State.from_meta(request["meta"].get(STATE_META_KEY))
            assert state is not None
            out[request["url"]] = state
    return out


def fetches(site: Any, path: str) -> list[dict[str, Any]]:
    return [r for r in site.requests() if r["path"] == path]


def site_with(site_factory: Any, tmp_path: Path, spec: dict[str, Any]) -> Any:
    root = tmp_path / "www"
    root.mkdir()
    return site_factory(root, behaviour={"changing": spec})


def worker(tmp_path: Path, site: Any, redis_url: str, env: dict[str, str], name: str,
           errbacks: bool = False, **settings: Any) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    base = {"FLEET_REDIS_URL": redis_url, "FLEET_POLL_INTERVAL": 0.2,
            "FLEET_JSONL_PATH": str(tmp_path / f"items-{name}.jsonl")}
    proc = start_worker(TEST_PROJECT, "recrawl", {**base, **settings}, env, log,
                        spider_args={"start": site.url + "changing/",
                                     **({"errbacks": "1"} if errbacks else {})})
    return proc, log


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.terminate()  # a recrawl never goes idle: the worker drains and exits 0
    assert wait_all([proc], 60) == [0], tail(log)


def test_static_page_is_revisited_with_304_its_interval_growing_a_changing_ones_shrinking(
        redis_url, tmp_path, site_factory, worker_env):
    # page 0 changes every second; page 1 never
    site = site_with(site_factory, tmp_path, {"pages": 2, "static_share": 1.0,
                                              "periods": {"0": 1.0}})
    client = redis.Redis.from_url(redis_url)
    # no host budget, hence no host prior: the prior (the host's change rate, synced every few
    # seconds) would make the pages' first intervals depend on whether a sync came before
    # them (a fast prior keeps a page seen changed at its last interval: [10, 10] in CI);
    # priors and budgets are test_recrawl_budget's and test_recrawl_policy's
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="adaptive",
                       FLEET_RECRAWL_INTERVAL=10, FLEET_RECRAWL_MIN_INTERVAL=1,
                       FLEET_RECRAWL_MAX_INTERVAL=100, FLEET_RECRAWL_BUDGET=0)
    static, changing = site.url + "changing/1.html", site.url + "changing/0.html"
    seen: dict[str, dict[int, int]] = defaultdict(dict)  # url -> observations -> interval
    history: dict[str, list[int]] = {}  # url -> its latest history (for the messages)

    def observed() -> bool:
        assert proc.poll() is None, tail(log)
        for url, state in tracked_states(client).items():
            seen[url].setdefault(len(state.history), state.interval)
            history[url] = list(state.history)
        return len(seen[static]) >= 3 and len(seen[changing]) >= 3

    try:
        wait_until(observed, 120, "three scheduled states of both pages", interval=0.3)
    finally:
        stop(proc, log)
    grow = [seen[static][n] for n in sorted(seen[static])]
    shrink = [seen[changing][n] for n in sorted(seen[changing])]
    why = (seen, history, [(r["status"], r["t"], r.get("version")) for r in
                           fetches(site, "/changing/1.html")], tail(log))
    # a first visit: the base interval; then growing, at least 3x once unchanged twice (issue
    # 31: the first visits back off quickly)
    assert grow[0] == 10 and grow == sorted(set(grow)) and grow[2] >= 3 * grow[1], why
    assert shrink[0] == 10 and max(shrink[1:]) < 10, why
    statuses = [r["status"] for r in fetches(site, "/changing/1.html")]
    assert statuses[0] == 200 and statuses[1:] and set(statuses[1:]) == {304}, statuses
    changed = [r["status"] for r in fetches(site, "/changing/0.html")]
    assert set(changed) == {200} and len(changed) >= 3, changed
    # items: the static page once (its revisits were unchanged), the changing one per version
    items = read_items([tmp_path / "items-w1.jsonl"])
    by_url = defaultdict(list)
    for item in items:
        by_url[item["url"]].append(item)
    assert len(by_url[static]) == 1
    versions = by_url[changing]
    assert len(versions) >= 3 and len({i["fleet_signature"] for i in versions}) == len(versions)
    assert all(i["fleet_fetched_at"].endswith("+00:00") for i in items)
    stats = {k.decode(): int(v) for k, v in client.hgetall(KEYS.stats).items()
             if v.isdigit()}
    assert stats["revisit_tracked"] == 3  # the start page and both pages
    assert stats["revisit_rescheduled"] >= 4
    # the workers' outcome counters reach the fleet-wide counters (status, /metrics)
    assert stats["revisit_not_modified"] >= 2 and stats["revisit_changed"] >= 2


def test_a_worker_killed_during_a_revisit_loses_nothing(redis_url, tmp_path, site_factory,
                                                         worker_env):
    spec = {"pages": 2, "static_share": 1.0}
    site = site_with(site_factory, tmp_path, spec)
    client = redis.Redis.from_url(redis_url)
    settings = {"FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 2,
                "FLEET_LEASE_TIMEOUT": 2}
    proc, _ = worker(tmp_path, site, redis_url, worker_env, "w1", **settings)
    target = site.url + "changing/1.html"
    try:
        wait_until(lambda: len(tracked_states(client)) == 3, 60, "three tracked pages")
        # the next revisit of page 1 is held by the site: the worker is killed meanwhile
        site.configure({"changing": spec,
                        "delays": [{"prefix": "/changing/1.html", "seconds": 60}]})
        before = len(fetches(site, "/changing/1.html"))
        wait_until(lambda: len(fetches(site, "/changing/1.html")) > before, 60,
                   "the revisit in flight")
        leased = [m.decode() for m in client.zrange(KEYS.leases, 0, -1)]
        assert any(m.startswith("r") for m in leased), leased
    finally:
        kill_worker(proc)
    assert target not in tracked_states(client)  # neither scheduled...
    assert client.get(KEYS.revisit_count) == b"3"  # ...nor forgotten: leased
    site.configure({"changing": spec})
    held = len(fetches(site, "/changing/1.html"))
    proc2, log2 = worker(tmp_path, site, redis_url, worker_env, "w2", **settings)
    try:
        wait_until(lambda: len(fetches(site, "/changing/1.html")) > held + 1, 60,
                   "page 1 revisited by the second worker")
        wait_until(lambda: target in tracked_states(client), 30, "page 1 scheduled again")
    finally:
        stop(proc2, log2)
    assert client.get(KEYS.revisit_count) == b"3"
    records = sum(1 for slot in client.zrange(KEYS.revisit_index, 0, -1)
                  for rec in client.lrange(KEYS.revisit_slot(slot.decode()), 0, -1)
                  if target.encode() in rec)
    leased_or_queued = client.zcard(KEYS.leases) + int(client.get(KEYS.queue_count) or 0)
    assert records + leased_or_queued >= 1 and records <= 1  # one record of it, never two
    after = [r["status"] for r in fetches(site, "/changing/1.html")[held:]]
    assert 304 in after, after  # its validators survived the kill


def test_a_page_gone_twice_leaves_the_schedule(redis_url, tmp_path, site_factory, worker_env):
    spec = {"pages": 2, "static_share": 1.0}
    site = site_with(site_factory, tmp_path, spec)
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="fixed",
                       FLEET_RECRAWL_INTERVAL=1, FLEET_RECRAWL_GONE_AFTER=2)
    try:
        wait_until(lambda: len(tracked_states(client)) == 3, 60, "three tracked pages")
        site.configure({"changing": spec, "failures": [{"prefix": "/changing/1.html",
                                                        "status": 404}]})
        wait_until(lambda: int(client.hget(KEYS.stats, "revisit_dropped") or 0) == 1, 60,
                   "page 1 dropped")
        others = len(fetches(site, "/changing/0.html"))
        wait_until(lambda: len(fetches(site, "/changing/0.html")) >= others + 3, 60,
                   "three more revisits of page 0")
    finally:
        stop(proc, log)
    gone = [r["status"] for r in fetches(site, "/changing/1.html") if r["status"] == 404]
    assert gone == [404, 404]
    assert client.get(KEYS.revisit_count) == b"2"
    assert site.url + "changing/1.html" not in tracked_states(client)
    assert json.loads(json.dumps(tracked_states(client).keys().__len__())) == 2


def test_a_failed_revisit_is_retried_recorded_and_kept_scheduled(redis_url, tmp_path,
                                                                 site_factory, worker_env):
    spec = {"pages": 2, "static_share": 1.0}
    site = site_with(site_factory, tmp_path, spec)
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="fixed",
                       FLEET_RECRAWL_INTERVAL=1, RETRY_TIMES=1)
    target = site.url + "changing/1.html"
    try:
        wait_until(lambda: len(tracked_states(client)) == 3, 60, "three tracked pages")
        site.configure({"changing": spec, "failures": [{"prefix": "/changing/1.html",
                                                        "status": 503}]})
        wait_until(lambda: client.hlen(KEYS.failed) >= 1, 60, "the failed revisit recorded")
        site.configure({"changing": spec})
        failed_at = len(fetches(site, "/changing/1.html"))
        wait_until(lambda: len(fetches(site, "/changing/1.html")) > failed_at, 60,
                   "page 1 revisited after its failure")
    finally:
        stop(proc, log)
    statuses = [r["status"] for r in fetches(site, "/changing/1.html")]
    assert statuses.count(503) >= 2  # the revisit and its retry
    assert statuses[-1] == 304  # its validators were kept through the failure
    assert target in tracked_states(client) or client.zcard(KEYS.leases) + int(
        client.get(KEYS.queue_count) or 0) >= 1  # scheduled again (or on its way)
    assert client.get(KEYS.revisit_count) == b"3"
    assert int(client.hget(KEYS.stats, "revisit_dropped") or 0) == int(
        client.hget(KEYS.stats, "revisit_tracked") or 0) - 3  # each retry: dropped, tracked


def test_an_errback_sees_a_failed_revisit_but_not_an_unchanged_one(redis_url, tmp_path,
                                                                   site_factory, worker_env):
    spec = {"pages": 2, "static_share": 1.0}  # never changing: revisits answered 304
    site = site_with(site_factory, tmp_path, spec)
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", errbacks=True,
                       FLEET_RECRAWL="fixed", FLEET_RECRAWL_INTERVAL=1, RETRY_TIMES=0)
    try:
        wait_until(lambda: int(client.hget(KEYS.stats, "revisit_not_modified") or 0) >= 4, 60,
                   "four revisits answered 304")
        site.configure({"changing": spec, "failures": [{"prefix": "/changing/1.html",
                                                        "status": 503}]})
        wait_until(lambda: client.hlen(KEYS.failed) >= 1, 60, "the failed revisit recorded")
    finally:
        stop(proc, log)
    items = read_items([tmp_path / "items-w1.jsonl"])
    errbacks = [(i["url"], i["errback"]) for i in items if "errback" in i]
    # the 503 reached the errback (a failure); none of the 304s did (a success)
    assert errbacks and set(errbacks) == {(site.url + "changing/1.html", "HttpError")}, errbacks
    assert [r["status"] for r in fetches(site, "/changing/0.html")].count(304) >= 1


def test_a_purge_while_workers_revisit_stops_them_and_leaves_nothing(redis_url, tmp_path,
                                                                    site_factory, worker_env):
    spec = {"pages": 4, "static_share": 0.5, "periods": {"0": 1.0}}
    site = site_with(site_factory, tmp_path, spec)
    client = redis.Redis.from_url(redis_url)
    settings = {"FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 1}
    w1, log1 = worker(tmp_path, site, redis_url, worker_env, "w1", **settings)
    w2, log2 = worker(tmp_path, site, redis_url, worker_env, "w2", **settings)
    procs = [w1, w2]
    try:
        wait_until(lambda: int(client.hget(KEYS.stats, "revisit_rescheduled") or 0) >= 6, 90,
                   "revisits under way")
        assert int(client.get(KEYS.revisit_count) or 0) == 5  # the start page, 4 pages
        assert client.exists(KEYS.stats) == 1  # (the scan below finds the crawl's keys)
        purged = run_scrapy(TEST_PROJECT, ["fleet", "purge", "recrawl", "--yes",
                                           "-s", f"FLEET_REDIS_URL={redis_url}"], worker_env)
        assert purged.returncode == 0, purged.stderr + purged.stdout
        codes = wait_all(procs, 90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [1, 1], tail(log1) + tail(log2)
    for log in (log1, log2):
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "has lost this crawl's state" in text, tail(log)
        assert "Spider closed (fleet_state_lost)" in text, tail(log)
    # nothing of the crawl is left: no schedule, no count, no queue, no stats written after
    assert sorted(client.scan_iter(match="fleet:{recrawl}*")) == []


def test_a_worker_without_recrawl_on_a_crawl_with_a_schedule_is_refused(
        redis_url, tmp_path, site_factory, worker_env):
    """Issue 22: a worker started without FLEET_RECRAWL would fetch every due revisit as a
    plain GET and drop the schedule; it is refused in one line and the crawl is left as it
    was."""
    site = site_with(site_factory, tmp_path, {"pages": 2, "static_share": 1.0})
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="fixed",
                       FLEET_RECRAWL_INTERVAL=3600)
    try:
        wait_until(lambda: int(client.get(KEYS.revisit_count) or 0) == 3, 120,
                   "three tracked pages", interval=0.3)
    finally:
        stop(proc, log)
    before = {k: client.dump(k) for k in client.keys("*") if b":hb" not in k}
    plain, plain_log = worker(tmp_path, site, redis_url, worker_env, "w2")
    assert wait_all([plain], 120) != [0]
    lines = [line for line in plain_log.read_text().splitlines()
             if "crawl 'recrawl' has 3 URLs scheduled for revisits" in line]
    assert len(lines) == 1, tail(plain_log)
    assert "FLEET_RECRAWL" in lines[0]
    assert int(client.get(KEYS.revisit_count)) == 3
    assert len(tracked_states(client)) == 3
    assert not (tmp_path / "items-w2.jsonl").exists() or not read_items(
        [tmp_path / "items-w2.jsonl"])
    after = {k: client.dump(k) for k in before}
    assert after == before


def write_sitemap(root: Path, base: str, lastmods: dict[str, str]) -> None:
    urls = "".join(f"<url><loc>{base}{path}</loc><lastmod>{lastmod}</lastmod></url>"
                   for path, lastmod in lastmods.items())
    (root / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>')


def test_a_sitemap_lastmod_newer_than_the_last_fetch_makes_a_page_due_at_once(
        redis_url, tmp_path, site_factory, worker_env):
    """A SitemapSpider whose sitemap (revisited every second) moves page 1's <lastmod> past
    its last fetch: page 1 is fetched again at once, with its validators (a 304: its state
    kept), though its own interval is an hour; page 0, whose lastmod is old, is not."""
    import time

    site = site_with(site_factory, tmp_path, {"pages": 2, "static_share": 1.0})
    root = tmp_path / "www"
    old = {"changing/0.html": "2020-01-01", "changing/1.html": "2020-01-01T00:00:00+00:00"}
    write_sitemap(root, site.url, old)
    client = redis.Redis.from_url(redis_url)
    log = tmp_path / "w1.log"
    proc = start_worker(TEST_PROJECT, "recrawl_sitemap",
                        {"FLEET_REDIS_URL": redis_url, "FLEET_POLL_INTERVAL": 0.2,
                         "FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 3600,
                         "FLEET_CRAWL_ID": "recrawl"},
                        worker_env, log, spider_args={"sitemap": site.url + "sitemap.xml"})
    try:
        wait_until(lambda: len(tracked_states(client)) == 3, 60,
                   "the sitemap and its two pages tracked")
        sitemap_fetches = len(fetches(site, "/sitemap.xml"))
        wait_until(lambda: len(fetches(site, "/sitemap.xml")) >= sitemap_fetches + 2, 60,
                   "two revisits of the unchanged sitemap")
        assert [len(fetches(site, f"/changing/{i}.html")) for i in (0, 1)] == [1, 1]
        assert int(client.hget(KEYS.stats, "revisit_lastmod_due") or 0) == 0
        time.sleep(1.5)  # (the lastmod must be past page 1's fetch + 1 s)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_sitemap(root, site.url, {**old, "changing/1.html": now})
        wait_until(lambda: len(fetches(site, "/changing/1.html")) == 2, 60,
                   "page 1 fetched again")
        wait_until(lambda: site.url + "changing/1.html" in tracked_states(client), 30,
                   "page 1 scheduled again")
        wait_until(lambda: len(fetches(site, "/sitemap.xml")) >= sitemap_fetches + 6, 60,
                   "more revisits of the sitemap")
    finally:
        stop(proc, log)
    assert [r["status"] for r in fetches(site, "/changing/1.html")] == [200, 304]
    assert len(fetches(site, "/changing/0.html")) == 1
    stats = {k.decode(): int(v) for k, v in client.hgetall(KEYS.stats).items()
             if v.isdigit()}
    assert stats["revisit_lastmod_due"] == 1
    assert stats["revisit_lastmod_older"] >= 1  # page 0's lastmod, when the sitemap changed
    assert stats["revisit_tracked"] == 3 and client.get(KEYS.revisit_count) == b"3"
    # page 1 was fetched with the lastmod of the sitemap that made it due: not again
    state = tracked_states(client)[site.url + "changing/1.html"]
    assert state.interval == 3600
