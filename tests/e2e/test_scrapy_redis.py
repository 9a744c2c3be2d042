"""A scrapy-redis project moved to the fleet (issue 36; docs/from-scrapy-redis.md): its
spiders (scrapy-redis's own ``RedisSpider``/``RedisCrawlSpider``, and scrapy_fleet's of the same
names), their start keys fed by producers with LPUSH, SADD or ZADD before and during the crawl,
plain URLs and scrapy-redis's JSON, items through scrapy-redis's ``RedisPipeline``; real
``scrapy crawl`` workers of tests/scrapyredis_project, a real Redis, a local site, SIGKILL."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from support import kill_worker, start_worker, tail, wait_all, wait_until, worker_stats

from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ScrapyRedisKeys, StartKeyKeys
from testsite import generate_site

pytest.importorskip("scrapy_redis", reason="scrapy-redis is not installed (the oldest-releases "
                    "environment leaves it out: tox.ini)")

PROJECT = Path(__file__).resolve().parents[1] / "scrapyredis_project"


def _site(tmp_path: Path, site_factory: Any, pages: int = 200, behaviour: Any = None) -> Any:
    paths = generate_site(tmp_path / "www", pages, 5)
    site = site_factory(tmp_path / "www", behaviour=behaviour)
    site.expected_paths = [*paths, "/outside/"]
    return site


def _workers(tmp_path: Path, spider: str, redis_url: str, env: dict[str, str], n: int,
             extra: dict[str, Any] | None = None, first: int = 0) -> tuple[list[Any], list[Path]]:
    procs, logs = [], []
    for i in range(first, first + n):
        settings: dict[str, Any] = {"REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 2}
        settings.update(extra or {})
        log = tmp_path / f"worker-{i}.log"
        procs.append(start_worker(PROJECT, spider, settings, env, log, {"domain": "127.0.0.1"}))
        logs.append(log)
    return procs, logs


def _item_urls(client: redis.Redis, spider: str) -> list[str]:
    return [json.loads(raw)["url"] for raw in client.lrange(ScrapyRedisKeys(spider).items, 0, -1)]


def _left(client: redis.Redis, start_key: str) -> int:
    """Entries still in the start key or taken and not done."""
    keys = StartKeyKeys(start_key)
    kind = client.type(start_key).decode()
    size = {"list": client.llen, "set": client.scard, "zset": client.zcard}.get(
        kind, lambda _k: 0)(start_key)
    return int(size) + int(client.zcard(keys.deadlines))


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("spider", ["mycrawler_redis", "fleet_mycrawler_redis"])
def test_two_workers_crawl_what_producers_push(tmp_path, redis_url, worker_env, site_factory,
                                               partitions, spider):
    """A plain URL LPUSHed before the workers start and a JSON entry LPUSHed during the crawl
    are crawled; every page once; items in <spider>:items = pages; the key ends empty."""
    site = _site(tmp_path, site_factory)
    client = redis.Redis.from_url(redis_url)
    start_key = "mycrawler:start_urls" if spider == "mycrawler_redis" \
        else "fleetcrawler:start_urls"
    client.lpush(start_key, site.url.rstrip("/") + "/site/")
    procs, logs = _workers(tmp_path, spider, redis_url, worker_env, 2,
                           {"FLEET_PARTITIONS": partitions})
    wait_until(lambda: client.llen(ScrapyRedisKeys(spider).items) >= 20, 120,
               "the first items", interval=0.1)
    client.lpush(start_key, json.dumps({"url": site.url.rstrip("/") + "/site/p/0.html",
                                        "meta": {"origin": "producer"}, "via": "json"}))
    codes = wait_all(procs, 240)
    assert codes == [0, 0], "\n".join(tail(log) for log in logs)
    urls = _item_urls(client, spider)
    counts = collections.Counter(urls)
    assert [u for u, c in counts.items() if c > 1] == []
    assert set(urls) == site.expected_urls  # a start page itself makes no item (CrawlSpider)
    assert _left(client, start_key) == 0
    fetched = collections.Counter(r["path"] for r in site.requests())  # (without queries)
    # every page once, and p/0.html once more: the JSON entry (?via=json)
    assert {p: c for p, c in fetched.items() if p.startswith("/site/p/") and c != 1} == {
        "/site/p/0.html": 2}
    stats = [worker_stats(log) for log in logs]
    assert sum(s.get("fleet/startkey/taken", 0) for s in stats) == 2
    assert sum(s.get("fleet/startkey/done", 0) for s in stats) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "partitions"), [("set", 2), ("zset", 1)])
def test_set_and_sorted_set_keys(tmp_path, redis_url, worker_env, site_factory, kind,
                                 partitions):
    """SADD / ZADD start keys (REDIS_START_URLS_AS_SET / _AS_ZSET), a one-page spider, two
    workers: every entry crawled once, and at every moment an item is in <spider>:items
    before its request is acknowledged (read acked, then the list)."""
    site = _site(tmp_path, site_factory, pages=60)
    client = redis.Redis.from_url(redis_url)
    urls = [site.url.rstrip("/") + f"/site/p/{i}.html" for i in range(60)]
    if kind == "set":
        client.sadd("myspider:start_urls", *urls[:40])
        setting = {"REDIS_START_URLS_AS_SET": True}
    else:
        client.zadd("myspider:start_urls", {u: i for i, u in enumerate(urls[:40])})
        setting = {"REDIS_START_URLS_AS_ZSET": True}
    procs, logs = _workers(tmp_path, "myspider_redis", redis_url, worker_env, 2,
                           {"FLEET_PARTITIONS": partitions, **setting})
    stats_keys = [k.stats for k in CrawlKeys("fleet", "myspider_redis").all_partitions(
        partitions)]
    items_key = ScrapyRedisKeys("myspider_redis").items
    samples = 0

    def acked() -> int:
        return sum(int(client.hget(k, "acked") or 0) for k in stats_keys)

    def sampled_until_more() -> bool:
        nonlocal samples
        done = acked()
        assert client.llen(items_key) >= done  # read after: its items were already in
        samples += 1
        return client.llen(items_key) >= 20
    wait_until(sampled_until_more, 120, "20 items", interval=0.05)
    if kind == "set":
        client.sadd("myspider:start_urls", *urls[40:])
    else:
        client.zadd("myspider:start_urls", {u: 100 + i for i, u in enumerate(urls[40:])})
    while any(p.poll() is None for p in procs):
        done = acked()
        assert client.llen(items_key) >= done
        samples += 1
        time.sleep(0.05)
    codes = wait_all(procs, 240)
    assert codes == [0, 0], "\n".join(tail(log) for log in logs)
    got = _item_urls(client, "myspider_redis")
    assert sorted(got) == sorted(urls)
    assert acked() == 60
    assert samples > 10
    assert _left(client, "myspider:start_urls") == 0


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [1, 2])
def test_worker_killed_after_taking_loses_no_entry(tmp_path, redis_url, worker_env,
                                                   site_factory, partitions):
    """A worker SIGKILLed while it holds start entries taken but not yet confirmed: another
    worker takes them over once their deadline passes, and every entry is crawled.

    The first worker's frontier calls wait FLEET_FLUSH_INTERVAL (600 s) before sending its
    buffered pushes, so the requests it made from its first batch never reach the frontier and
    their entries stay taken, unconfirmed, until it is killed (a worker that reaches the
    frontier confirms them and takes the next batch within milliseconds: the feeder does not
    wait FLEET_POLL_INTERVAL for that, so a window left to timing would be missed)."""
    site = _site(tmp_path, site_factory, pages=40, behaviour={
        "delays": [{"prefix": "/site/p/", "seconds": 1.0, "host": None}]})
    client = redis.Redis.from_url(redis_url)
    urls = [site.url.rstrip("/") + f"/site/p/{i}.html" for i in range(40)]
    client.lpush("myspider:start_urls", *urls)
    keys = StartKeyKeys("myspider:start_urls")
    stats_keys = [k.stats for k in CrawlKeys("fleet", "myspider_redis").all_partitions(
        partitions)]
    common = {"FLEET_PARTITIONS": partitions, "FLEET_LEASE_TIMEOUT": 3,
              "FLEET_IDLE_TIMEOUT": 3}
    # CONCURRENT_REQUESTS: scrapy-redis's batch size, the entries the worker takes at once
    first, first_logs = _workers(tmp_path, "myspider_redis", redis_url, worker_env, 1,
                                 {**common, "CONCURRENT_REQUESTS": 10,
                                  "FLEET_FLUSH_INTERVAL": 600})
    try:
        wait_until(lambda: client.zcard(keys.deadlines) > 0, 120, "entries taken")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{tail(first_logs[0])}") from None
    kill_worker(first[0])
    held = client.zcard(keys.deadlines)
    # one batch taken and held by the one worker, none of its requests in the frontier
    assert held == 10, tail(first_logs[0])
    assert client.llen("myspider:start_urls") == 30
    owners = {v.split(b"\n", 1)[0] for f, v in client.hgetall(keys.taking).items()
              if f != b"#"}
    assert len(owners) == 1
    assert sum(int(client.hget(k, "pushed") or 0) for k in stats_keys) == 0
    second, logs = _workers(tmp_path, "myspider_redis", redis_url, worker_env, 2,
                            common, first=1)
    codes = wait_all(second, 240)
    assert codes == [0, 0], "\n".join(tail(log) for log in logs + first_logs)
    assert set(_item_urls(client, "myspider_redis")) == set(urls)
    assert _left(client, "myspider:start_urls") == 0
    stats = [worker_stats(log) for log in logs]
    assert sum(s.get("fleet/startkey/taken_over", 0) for s in stats) == held


def test_a_worker_with_start_requests_never_leaves_the_start_key_alone(
        tmp_path, redis_url, worker_env, site_factory):
    """FLEET_START_REQUESTS=never (a worker that only drains the frontier): the worker takes
    nothing from the start key and closes for idleness; a worker without it then crawls the
    entry."""
    site = _site(tmp_path, site_factory, pages=5)
    client = redis.Redis.from_url(redis_url)
    url = site.url.rstrip("/") + "/site/p/0.html"
    client.lpush("myspider:start_urls", url)
    procs, logs = _workers(tmp_path, "myspider_redis", redis_url, worker_env, 1,
                           {"FLEET_START_REQUESTS": "never"})
    assert wait_all(procs, 120) == [0], tail(logs[0])
    assert client.lrange("myspider:start_urls", 0, -1) == [url.encode()]
    assert client.zcard(StartKeyKeys("myspider:start_urls").deadlines) == 0
    assert site.requests() == []
    assert "FLEET_START_REQUESTS=never: this worker does not read start key" in \
        logs[0].read_text()
    procs, logs = _workers(tmp_path, "myspider_redis", redis_url, worker_env, 1, first=1)
    assert wait_all(procs, 120) == [0], tail(logs[0])
    assert _item_urls(client, "myspider_redis") == [url]
    assert _left(client, "myspider:start_urls") == 0


def test_the_acl_rules_of_a_start_key_spider_name_its_start_key(worker_env, redis_url):
    """``scrapy fleet acl SPIDER`` of a RedisSpider: the worker's and the admin's rules reach
    its start key and its ``:fleet:*`` keys (acl.acl_rule's, tests/lua/test_startkey_acl.py
    checks them against Redis), the monitor's does not."""
    from support import run_scrapy

    from scrapy_fleet import acl

    result = run_scrapy(PROJECT, ["fleet", "acl", "myspider_redis", "-s",
                                  f"REDIS_URL={redis_url}"], worker_env)
    assert result.returncode == 0, result.stderr
    rules = {line.split()[2]: line.split(">PASSWORD ", 1)[1]
             for line in result.stdout.splitlines() if line.startswith("ACL SETUSER")}
    for role in ("worker", "admin"):
        assert rules[f"fleet-{role}"] == acl.acl_rule(
            role, crawl_id="myspider_redis", start_keys=("myspider:start_urls",))
        assert "~myspider:start_urls ~{myspider:start_urls}:fleet:*" in rules[f"fleet-{role}"]
    assert "start_urls" not in rules["fleet-monitor"]


@pytest.mark.parametrize(("setting", "words"), [
    ("SCHEDULER_PERSIST=False", "SCHEDULER_PERSIST=False"),
    ("SCHEDULER_FLUSH_ON_START=True", "SCHEDULER_FLUSH_ON_START=True")])
def test_worker_refuses_what_the_fleet_cannot_honour(tmp_path, redis_url, worker_env, setting,
                                                     words):
    """One ERROR line, exit status 1, nothing read from the start key."""
    client = redis.Redis.from_url(redis_url)
    client.lpush("myspider:start_urls", "http://127.0.0.1:9/")
    result = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "myspider_redis", "-s",
         f"REDIS_URL={redis_url}", "-s", setting], cwd=PROJECT, env=worker_env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if " ERROR: " in line]
    assert len(errors) == 1 and words in errors[0], result.stderr[-3000:]
    assert client.lrange("myspider:start_urls", 0, -1) == [b"http://127.0.0.1:9/"]


FINGERPRINTER = "scrapy_fleet.compat.fingerprint.ScrapyRedisFingerprinter"


@pytest.mark.slow
def test_half_crawl_of_scrapy_redis_imported(tmp_path, redis_url, worker_env, site_factory):
    """A scrapy-redis crawl (its own scheduler and dupefilter: the add-on off) stopped half-way
    with its state persisted, imported (refused without --trust-pickles, reading nothing),
    then finished by 2 fleet workers: the pages it had fetched are not fetched again (the
    fingerprints match under ScrapyRedisFingerprinter), the others are, every page has its
    item once."""
    site = _site(tmp_path, site_factory, pages=120)
    client = redis.Redis.from_url(redis_url)
    client.lpush("mycrawler:start_urls", site.url.rstrip("/") + "/site/")
    first = start_worker(PROJECT, "mycrawler_redis", {
        "ADDONS": "{}", "REDIS_URL": redis_url, "CLOSESPIDER_ITEMCOUNT": 40,
        "CONCURRENT_REQUESTS": 2, "MAX_IDLE_TIME_BEFORE_CLOSE": 5},
        worker_env, tmp_path / "scrapy-redis.log", {"domain": "127.0.0.1"})
    assert wait_all([first], 180) == [0], tail(tmp_path / "scrapy-redis.log")
    keys = ScrapyRedisKeys("mycrawler_redis")
    pending = client.zcard(keys.requests)
    assert pending > 0 and client.scard(keys.dupefilter) > pending
    before_paths = collections.Counter(r["path"] for r in site.requests())
    before = set(client.keys("*"))
    args = ["fleet", "import-scrapy-redis", "mycrawler_redis", "-s", f"REDIS_URL={redis_url}",
            "-s", f"REQUEST_FINGERPRINTER_CLASS={FINGERPRINTER}"]
    refused = subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=PROJECT,
                             env=worker_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.count("error:") == 1 and "--trust-pickles" in refused.stderr
    assert set(client.keys("*")) == before  # nothing read, nothing written
    done = subprocess.run([sys.executable, "-m", "scrapy", *args, "--trust-pickles"],
                          cwd=PROJECT, env=worker_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {pending} of {pending} pending requests" in done.stdout, done.stdout
    assert client.zcard(keys.requests) == pending  # their keys are left as they were
    procs, logs = _workers(tmp_path, "mycrawler_redis", redis_url, worker_env, 2,
                           {"REQUEST_FINGERPRINTER_CLASS": FINGERPRINTER})
    assert wait_all(procs, 240) == [0, 0], "\n".join(tail(log) for log in logs)
    after_paths = collections.Counter(r["path"] for r in site.requests()) - before_paths
    fetched_twice = {p for p in after_paths if p in before_paths and p.startswith("/site/p/")}
    assert fetched_twice == set()
    urls = _item_urls(client, "mycrawler_redis")
    assert [u for u, c in collections.Counter(urls).items() if c > 1] == []
    pages = {u for u in site.expected_urls if "/site/p/" in u}
    assert pages <= set(urls)
