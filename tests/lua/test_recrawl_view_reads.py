"""The recrawl view (recrawl/view.py) on records and budgets written by the real frontier call
and HostBudgets.sync, with a real redis-server: a page is found by its fingerprint through the
place index (a crawl with sitemaps) or by reading the schedule, its outcome told from its
state; a host's figures come from its budget HASH, an infinite price shown as priced out, and
a partitioned crawl's hosts are listed from every partition."""

from __future__ import annotations

import asyncio
import time

import redis
from scrapy import Request
from support import hosts_in_partition
from test_recrawl_budget_sync import fleet
from test_revisit_lastmod import KEYS, track

from scrapy_fleet import redis_client
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.recrawl import view
from scrapy_fleet.recrawl.budget import HostBudgets
from scrapy_fleet.recrawl.schedule import State


def url_fingerprint(request: Request) -> bytes:
    """The fingerprint test_revisit_lastmod's keys are made from (bloom_key of the URL)."""
    return request.url.encode()


def tracked(redis_url: str, lastmod: int) -> tuple[redis.Redis, int]:
    """Three URLs of host "h" tracked (*lastmod* 1: the crawl keeps the place index)."""
    admin = FrontierAdmin(redis_url, "t", params=FrontierParams())
    now = int(time.time())
    track(admin, "http://h/a", State(fetched=now - 50, interval=600, history=[-300, 400]),
          600, lastmod)
    track(admin, "http://h/b", State(fetched=now - 20, interval=300, history=[-300, -300]),
          900, lastmod)
    track(admin, "http://h/c", State(fetched=now - 5, interval=60, gone=1), 60, lastmod)
    return redis.Redis.from_url(redis_url), now


def test_a_page_is_found_through_the_place_index_with_its_figures(redis_url):
    client, now = tracked(redis_url, lastmod=1)
    # a host that matches no record: only the place index can find the URL
    found = view.find_record(client, KEYS, "http://h/b", "not-h", url_fingerprint)
    assert found is not None and found[1]["url"] == "http://h/b"
    page = view.read_page(client, KEYS, "http://h/a", "h", url_fingerprint)
    assert page is not None
    assert (page["url"], page["history"], page["interval"], page["visits"],
            page["last_outcome"]) == ("http://h/a", [-300, 400], 600, 3, "changed")
    # its slot's end: due after the record's interval (600 s), late by at most 1/16 of it
    assert now + 600 <= page["next_due"] <= now + 600 + 600 / 16 + 5
    assert 500 <= page["next_due_in"] <= 640
    assert view.read_page(client, KEYS, "http://h/b", "h", url_fingerprint)[
        "last_outcome"] == "unchanged"


def test_without_the_index_the_schedule_is_read_and_each_outcome_told(redis_url):
    client, _ = tracked(redis_url, lastmod=0)
    assert client.keys(KEYS.revisit_place_prefix + "*") == []
    pages = {u: view.read_page(client, KEYS, u, "h", url_fingerprint)
             for u in ("http://h/a", "http://h/b", "http://h/c")}
    assert {u: p["last_outcome"] for u, p in pages.items() if p} == {
        "http://h/a": "changed", "http://h/b": "unchanged", "http://h/c": "gone"}
    assert pages["http://h/b"]["change_rate"] < pages["http://h/a"]["change_rate"]
    assert pages["http://h/c"]["change_rate"] is None  # no history: no estimate
    assert view.read_page(client, KEYS, "http://h/never", "h", url_fingerprint) is None
    assert view.find_record(client, KEYS, "http://h/a", "other", url_fingerprint) is None


def test_a_hosts_figures_and_an_infinite_price(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.hset(KEYS.revisit_budget("h"), mapping={"3": 2, "r3": 0.002, "5": 0, "mu": "inf"})
    client.hset(KEYS.revisit_budget("g"), mapping={"2": 1, "r2": 0.5, "mu": "12.5"})
    got = view.read_hosts(client, KEYS, ["h", "g", "none"])
    assert got == {
        "h": {"recrawl_pages": 2, "recrawl_rate": 86.4, "recrawl_price": None,
              "recrawl_priced_out": True},
        "g": {"recrawl_pages": 1, "recrawl_rate": 43200.0, "recrawl_price": 12.5,
              "recrawl_priced_out": False},
        "none": {"recrawl_pages": 0, "recrawl_rate": None, "recrawl_price": None,
                 "recrawl_priced_out": False}}


def test_a_partitioned_crawls_hosts_are_listed_from_every_partition(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = KEYS.__class__("fleet", "budget")
    for part in keys.all_partitions(4):
        client.set(part.marker, "m1")
    hosts = {p: hosts_in_partition(p, 4)[0] for p in (1, 3)}

    async def main() -> None:
        budgets = HostBudgets(fleet(redis_url, 4), keys,
                              redis_client.make_client(redis_url, is_async=True))
        try:
            budgets.move(hosts[1], None, (0, 0.1))
            budgets.move(hosts[3], None, (0, 0.1))
            budgets.move(hosts[3], None, (1, 0.3))
            await budgets.sync()
        finally:
            await budgets.client.aclose()

    asyncio.run(main())
    rows = view.recrawl_hosts(client, keys, parts=4)
    assert [(r["host"], r["recrawl_pages"], r["recrawl_rate"]) for r in rows] == [
        (hosts[3], 2, round(0.2 * 86400, 3)), (hosts[1], 1, round(0.1 * 86400, 3))]
    assert all(r["recrawl_price"] is not None for r in rows)
    assert view.recrawl_hosts(client, keys, parts=4, limit=1)[0]["host"] == hosts[3]


def test_a_least_privileged_monitor_reads_the_view(redis_server, redis_url):
    """As the user of `scrapy fleet acl`'s monitor rule (acl.py): the place index, the slots,
    the slot's due time and the set of hosts are read without a refusal."""
    from scrapy_fleet import acl

    client, _ = tracked(redis_url, lastmod=1)
    client.sadd(KEYS.revisit_hosts, "h")
    client.hset(KEYS.revisit_budget("h"), mapping={"3": 2, "r3": 0.002, "mu": "7"})
    client.execute_command("ACL", "SETUSER", "view-monitor", "reset", "on", ">pw",
                           *acl.acl_rule("monitor", crawl_id=KEYS.crawl_id).split())
    try:
        monitor = redis.Redis.from_url(f"redis://view-monitor:pw@127.0.0.1:{redis_server.port}/0")
        placed = view.read_page(monitor, KEYS, "http://h/a", "h", url_fingerprint)
        client.delete(*client.keys(KEYS.revisit_place_prefix + "*"))  # the slots read
        scanned = view.read_page(monitor, KEYS, "http://h/b", "h", url_fingerprint)
        hosts = view.recrawl_hosts(monitor, KEYS)
    finally:
        client.execute_command("ACL", "DELUSER", "view-monitor")
    assert placed is not None and placed["last_outcome"] == "changed"
    assert scanned is not None and scanned["last_outcome"] == "unchanged"
    assert [(r["host"], r["recrawl_pages"], r["recrawl_price"]) for r in hosts] == [("h", 2, 7.0)]
