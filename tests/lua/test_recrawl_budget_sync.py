"""A host's budget in Redis (recrawl/budget.py): the workers' moves add up in one HASH per host,
every worker solves the same price from it, and a purged crawl gets no key back."""

from __future__ import annotations

import asyncio
import math

import pytest
import redis
from support import hosts_in_partition

from scrapy_fleet import redis_client
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.allocation import base_price, rate_bucket
from scrapy_fleet.recrawl.budget import HostBudgets, host_budget, host_price

KEYS = CrawlKeys("fleet", "budget")
BASE = 10.0


def fleet(redis_url: str, parts: int = 1) -> FleetConfig:
    return FleetConfig.from_settings({
        "FLEET_REDIS_URL": redis_url, "FLEET_RECRAWL": "adaptive", "FLEET_PARTITIONS": parts,
        "FLEET_RECRAWL_INTERVAL": BASE, "FLEET_RECRAWL_MIN_INTERVAL": 1,
        "FLEET_RECRAWL_MAX_INTERVAL": 1000, "FLEET_HOST_RATE": 2, "FLEET_RECRAWL_BUDGET": 0.5})


def test_two_workers_moves_add_up_and_both_solve_the_price_that_fits_the_budget(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set(KEYS.marker, "m1")  # the crawl exists (its first frontier call wrote it)
    config = fleet(redis_url)
    rate = 0.1  # changes every 10 s: at the base price fetched every 10 s
    bucket = (rate_bucket(rate, BASE), rate)

    async def main() -> tuple[float | None, float | None]:
        one = HostBudgets(config, KEYS, redis_client.make_client(redis_url, is_async=True))
        two = HostBudgets(config, KEYS, redis_client.make_client(redis_url, is_async=True))
        try:
            for _ in range(30):  # 30 pages each: 60 pages asking for 6 fetches a second
                one.move("h.test", None, bucket)
                two.move("h.test", None, bucket)
            one.move("h.test", bucket, None)  # one left the schedule: 59
            await one.sync()
            await two.sync()
            await one.sync()  # (nothing to move: its price stays what it read)
            one.move("h.test", bucket, bucket)
            await one.sync()
            return one.price("h.test"), two.price("h.test")
        finally:
            await one.client.aclose()
            await two.client.aclose()

    price_one, price_two = asyncio.run(main())
    fields = client.hgetall(KEYS.revisit_budget("h.test"))
    assert int(fields[str(bucket[0]).encode()]) == 59
    assert float(fields[f"r{bucket[0]}".encode()]) == pytest.approx(59 * rate)
    # budget 0.5 x 2 a second: 1 a second for 59 pages, over the base price
    budget = host_budget(config, "h.test")
    assert budget == 1.0
    expected = host_price({bucket[0]: 59}, config.recrawl, budget, {bucket[0]: 59 * rate})
    assert price_one == price_two == expected
    assert math.isfinite(expected) and expected > base_price(BASE)
    assert float(fields[b"mu"]) == expected


def test_a_purged_crawl_gets_no_budget_key_back(redis_url):
    client = redis.Redis.from_url(redis_url)
    config = fleet(redis_url)

    async def main() -> HostBudgets:
        budgets = HostBudgets(config, KEYS, redis_client.make_client(redis_url, is_async=True))
        try:
            budgets.move("h.test", None, (0, 0.1))
            await budgets.sync()  # no marker: a crawl purged (or never begun)
            return budgets
        finally:
            await budgets.client.aclose()

    budgets = asyncio.run(main())
    assert sorted(client.scan_iter(match="fleet:{budget}*")) == []
    assert budgets.price("h.test") is None and budgets.pending == {}


def test_a_hosts_budget_is_kept_in_its_partition(redis_url):
    """FLEET_PARTITIONS=4: each host's HASH is in its partition's keys (the same rule as for
    P = 1, whose one partition is the crawl's own keys), one transaction per partition."""
    client = redis.Redis.from_url(redis_url)
    parts = KEYS.all_partitions(4)
    for part in parts:
        client.set(part.marker, "m1")
    hosts = {p: hosts_in_partition(p, 4)[0] for p in (1, 3)}

    async def main() -> None:
        budgets = HostBudgets(fleet(redis_url, 4), KEYS,
                              redis_client.make_client(redis_url, is_async=True))
        try:
            for host in hosts.values():
                budgets.move(host, None, (0, 0.1))
            await budgets.sync()
        finally:
            await budgets.client.aclose()

    asyncio.run(main())
    written = {k.decode() for k in client.scan_iter(match="fleet:*:rvb:*")}
    assert written == {parts[p].revisit_budget(host) for p, host in hosts.items()}
    assert {p: int(client.hget(parts[p].revisit_budget(h), "0")) for p, h in hosts.items()} == {
        1: 1, 3: 1}


def test_a_least_privileged_worker_syncs_the_budgets(redis_server, redis_url):
    """As the user of `scrapy fleet acl`'s worker rule (acl.py): the sync's transaction
    (WATCH, MULTI, HINCRBYFLOAT, EXEC) was refused at its WATCH, so no budget ever synced."""
    from scrapy_fleet import acl

    admin = redis.Redis.from_url(redis_url)
    admin.set(KEYS.marker, "m1")
    admin.execute_command("ACL", "SETUSER", "budget-worker", "reset", "on", ">pw",
                          *acl.acl_rule("worker", crawl_id=KEYS.crawl_id).split())
    url = f"redis://budget-worker:pw@127.0.0.1:{redis_server.port}/0"

    async def main() -> HostBudgets:
        budgets = HostBudgets(fleet(url), KEYS, redis_client.make_client(url, is_async=True))
        try:
            budgets.move("h.test", None, (0, 0.1))
            await budgets.sync()
            return budgets
        finally:
            await budgets.client.aclose()

    try:
        budgets = asyncio.run(main())
    finally:
        admin.execute_command("ACL", "DELUSER", "budget-worker")
    assert budgets.pending == {}
    assert float(admin.hget(KEYS.revisit_budget("h.test"), "r0")) == pytest.approx(0.1)
    assert budgets.price("h.test") == float(admin.hget(KEYS.revisit_budget("h.test"), "mu"))


def test_every_worker_reads_its_hosts_prior_the_mean_rate_of_the_hosts_pages(redis_url):
    """Issue 31: a page starts from what its host's pages have shown, fleet-wide."""
    client = redis.Redis.from_url(redis_url)
    client.set(KEYS.marker, "m1")
    config = fleet(redis_url)
    fast, slow = (rate_bucket(0.1, BASE), 0.1), (rate_bucket(0.001, BASE), 0.001)

    async def main() -> tuple[float | None, ...]:
        one = HostBudgets(config, KEYS, redis_client.make_client(redis_url, is_async=True))
        two = HostBudgets(config, KEYS, redis_client.make_client(redis_url, is_async=True))
        try:
            before = one.prior("p.test")
            for _ in range(3):
                one.move("p.test", None, fast)
            one.move("p.test", None, slow)
            await one.sync()
            first = one.prior("p.test")
            two.move("p.test", None, slow)  # a fifth page, seen by the other worker
            await two.sync()
            return before, first, two.prior("p.test"), two.prior("q.test")
        finally:
            await one.client.aclose()
            await two.client.aclose()

    before, first, second, other = asyncio.run(main())
    assert before is None and other is None  # nothing seen yet: the base interval's rate
    assert first == pytest.approx((3 * 0.1 + 0.001) / 4)
    assert second == pytest.approx((3 * 0.1 + 2 * 0.001) / 5)
