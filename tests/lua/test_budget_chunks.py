"""The crawl's page budget at P > 1 (issue 34 item 3): partitions reserve chunks of it at its
home (lua/budget_home.lua), lease only against their chunk (lua/step_budget.lua, bgc), and
give back what they cannot use (lua/budget_part.lua); frontier/budgetchunks.py drives them.
Against a real redis-server."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis
from support import hosts_in_partition, push_row

from scrapy_fleet import lua, redis_client
from scrapy_fleet.frontier import budgetchunks
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.budgetchunks import ChunkBudget
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.calls import BUDGET_HOME_CALL, BUDGET_PART_CALL
from scrapy_fleet.keys.crawl import CrawlKeys

OWN = CrawlKeys("fleet", "t")
PARTS = 3


def home_fields(client) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(OWN.budget).items()}


def test_chunks_never_over_reserve_and_give_backs_are_counted_once(redis_url):
    client = redis.Redis.from_url(redis_url)
    home = lua.load(client, "budget_home.lua")
    rng = random.Random(7)
    back = [0] * PARTS
    grants = []
    for _ in range(300):  # reservations and give-backs in any order, some sent twice
        p = rng.randrange(PARTS)
        if rng.random() < 0.3:
            granted = int(client.hget(OWN.budget, f"g|{p}") or 0)
            back[p] = min(granted, back[p] + rng.randrange(4))
            for _ in range(rng.choice((1, 2))):  # (a repeat: the same cumulative back)
                _, left, _, n = home(keys=OWN.call_keys(BUDGET_HOME_CALL),
                                     args=[p, PARTS, 100, 64, 0, back[p]])
                assert n == 0
        else:
            _, left, pages, n = home(keys=OWN.call_keys(BUDGET_HOME_CALL),
                                     args=[p, PARTS, 100, 64, 1, back[p]])
            assert pages == 100 and n <= 64
            grants.append((n, left))
        f = home_fields(client)
        out = sum(f.get(f"g|{q}", 0) - f.get(f"b|{q}", 0) for q in range(PARTS))
        assert out <= 100  # what the partitions may lease, together
        assert f.get("granted", 0) == sum(f.get(f"g|{q}", 0) for q in range(PARTS))
        assert f.get("returned", 0) == sum(f.get(f"b|{q}", 0) for q in range(PARTS))
        assert out == 100 - left
    # the first chunk is min(64, ceil(100 / 3)); the budget was reached, and then a
    # reservation got nothing until a give-back
    assert grants[0] == (34, 66)
    assert (0, 0) in grants


def test_a_partition_s_chunk_takes_the_largest_grant_and_gives_back_only_when_idle(
        redis_url):
    client = redis.Redis.from_url(redis_url)
    part_keys = OWN.partition(1, PARTS)
    part = lua.load(client, "budget_part.lua")
    keys = part_keys.call_keys(BUDGET_PART_CALL)
    assert part(keys=keys, args=[10, 0])[:4] == [10, 0, 0, 10]
    assert part(keys=keys, args=[4, 0])[:4] == [10, 0, 0, 10]  # (a stale grant: no change)
    client.set(part_keys.queue_count, 3)  # queued work: its unused pages are kept
    assert part(keys=keys, args=[0, 1])[:4] == [10, 0, 0, 10]
    client.set(part_keys.queue_count, 0)
    assert part(keys=keys, args=[0, 1])[:4] == [10, 10, 0, 0]
    assert part(keys=keys, args=[0, 1])[:4] == [10, 10, 0, 0]  # (given back once)


def make_partitions(redis_url, hosts_per=2, pages_per_host=60, work=(0, 1, 2)):
    admins, hosts = [], []
    for p in range(PARTS):
        admin = FrontierAdmin(redis_url, "t", params=FrontierParams(budget_chunked=True),
                              keys=OWN.partition(p, PARTS))
        if p in work:
            for h in hosts_in_partition(p, PARTS, hosts_per):
                admin.push([push_row(h) for _ in range(pages_per_host)])
                hosts.append(h)
        admins.append(admin)
    return admins, hosts


def run(redis_url, pages, admins, rounds=60, take=5, ack=True, first=None):
    """Workers' calls through one ChunkBudget of a *pages* budget: reserve where a chunk is
    spent, lease, acknowledge (*first*: partitions to reserve a chunk for first).  Returns
    the leases granted per partition and whether the crawl's budget was found spent."""
    got = [0] * PARTS
    spent = False

    async def main() -> None:
        nonlocal spent
        client = redis_client.make_client(redis_url, is_async=True)
        budget = ChunkBudget(client, OWN, OWN.all_partitions(PARTS), pages)
        held: list[list] = [[] for _ in range(PARTS)]
        try:
            if first:
                await budget.reserve(dict.fromkeys(first, take))
            for _ in range(rounds):
                for p, admin in enumerate(admins):
                    await budget.reserve({p: take})
                    res = admin.call(CallBatch(take=take, acks=held[p] if ack else []),
                                     worker=f"w{p}")
                    held[p] = [(e.entry_id, e.token) for e in res.leased]
                    got[p] += len(res.leased)
                    budget.note(p, res.budget_left)
                    assert res.budget_spent == ""  # (a chunk spent is not the crawl's)
                    if not res.leased and await budget.spent():
                        spent = True
        finally:
            await client.aclose()

    asyncio.run(main())
    return got, spent


@pytest.fixture
def sweep_at_once(monkeypatch):
    monkeypatch.setattr(budgetchunks, "SWEEP_EVERY", 0.0)


def test_three_partitions_lease_exactly_the_budget_and_find_it_spent(redis_url,
                                                                      sweep_at_once):
    admins, _ = make_partitions(redis_url)
    got, spent = run(redis_url, 100, admins)
    assert sum(got) == 100  # exactly: 360 queued
    assert all(n > 0 for n in got)
    assert spent
    sync = redis.Redis.from_url(redis_url)
    charged = [int(sync.hget(k.budget, "charged")) for k in OWN.all_partitions(PARTS)]
    assert charged == got
    assert home_fields(sync)["granted"] - home_fields(sync).get("returned", 0) == 100


def test_a_partition_without_work_gives_its_chunk_back_to_the_others(redis_url,
                                                                     sweep_at_once):
    admins, _ = make_partitions(redis_url, pages_per_host=30, work=(0, 1))
    got, spent = run(redis_url, 100, admins, first=range(PARTS))  # (2 gets a chunk)
    assert got[2] == 0
    assert got[0] + got[1] == 100  # partition 2's chunk went back and was leased elsewhere
    assert spent
    sync = redis.Redis.from_url(redis_url)
    assert int(sync.hget(OWN.partition(2, PARTS).budget, "back")) > 0


def test_leases_in_flight_keep_the_crawl_from_being_spent(redis_url, sweep_at_once):
    admins, _ = make_partitions(redis_url)
    got, spent = run(redis_url, 20, admins, rounds=10, ack=False)
    assert sum(got) == 20 and not spent  # the last leases were never acknowledged


def test_a_partition_leases_nothing_without_a_chunk_and_exactly_its_chunk(redis_url):
    admins, _ = make_partitions(redis_url, work=(1,))
    got = admins[1].call(CallBatch(take=5), worker="w1")
    assert (len(got.leased), got.budget_left, got.budget_spent) == (0, 0, "")
    part = lua.load(redis.Redis.from_url(redis_url), "budget_part.lua")
    part(keys=OWN.partition(1, PARTS).call_keys(BUDGET_PART_CALL), args=[3, 0])
    got = admins[1].call(CallBatch(take=5), worker="w1")
    assert (len(got.leased), got.budget_left) == (3, 0)
    assert admins[1].call(CallBatch(take=5), worker="w2").leased == []


def test_pages_granted_to_a_worker_that_died_go_to_the_partition_at_the_sweep(
        redis_url, sweep_at_once):
    """Workers killed between the home's grant and the partition's: the grants are not lost;
    the sweep hands them to their partitions, which give them back (nothing queued)."""
    client = redis.Redis.from_url(redis_url)
    home = lua.load(client, "budget_home.lua")
    left = 10
    while left:  # (every page granted, none handed over)
        for p in range(PARTS):
            _, left, _, _ = home(keys=OWN.call_keys(BUDGET_HOME_CALL),
                                 args=[p, PARTS, 10, 64, 1, 0])

    async def sweep() -> tuple[bool, int | None]:
        aclient = redis_client.make_client(redis_url, is_async=True)
        try:
            budget = ChunkBudget(aclient, OWN, OWN.all_partitions(PARTS), 10)
            budget.home_left = 0
            return await budget.spent(), budget.home_left
        finally:
            await aclient.aclose()

    assert asyncio.run(sweep()) == (False, 10)
    f = home_fields(client)
    assert (f["granted"], f["returned"]) == (10, 10)
    chunks = [client.hmget(k.budget, "chunk", "back") for k in OWN.all_partitions(PARTS)]
    assert sum(int(c) for c, _ in chunks) == 10 and all(c == b for c, b in chunks)
