"""Crawl groups (issue 34, docs/control.md "Crawl groups") against a real redis-server: two
crawls of one group share a host's politeness (GCRA turns, concurrency cap) and split its
turns by FLEET_CRAWL_WEIGHT (lua/step_group.lua), on the Lua steps' test clock."""

from __future__ import annotations

import random

from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys


def crawl(url: str, crawl_id: str, group: str = "g", weight: float = 1.0,
          **params) -> FrontierAdmin:
    return FrontierAdmin(url, crawl_id, keys=CrawlKeys("fleet", crawl_id, group=group),
                         params=FrontierParams(group_weight=weight, **params))


def pushes(host: str, n: int, tag: str):
    out = []
    for i in range(n):
        url = f"http://{host}/{tag}/{i}"
        out.append((bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, host))
    return out


def take(admin: FrontierAdmin, worker: str, n: int = 5) -> list:
    return admin.call(CallBatch(take=n), worker=worker).leased


def test_the_crawls_of_a_group_share_a_hosts_rate(redis_url, lua_clock):
    a = crawl(redis_url, "a", host_interval=1.0)
    b = crawl(redis_url, "b", host_interval=1.0)
    a.push(pushes("h", 10, "a"))
    b.push(pushes("h", 10, "b"))
    assert len(take(a, "wa")) == 1
    assert take(b, "wb") == []  # the host's turn is the group's: taken by a
    lua_clock(1.0)
    got = len(take(b, "wb")) + len(take(a, "wa"))
    assert got == 1  # one turn a second for both
    # the politeness keys are the group's (one tat for both), the queues each crawl's
    assert a.keys.tat == b.keys.tat == "fleet:{group:g}:tat"
    assert a.client.hexists("fleet:{group:g}:tat", "h")
    assert not a.client.exists("fleet:{a}:tat") and not a.client.exists("fleet:{b}:tat")
    assert a.status()["queued"] + b.status()["queued"] == 18


def test_crawls_without_a_group_each_get_the_whole_rate(redis_url):
    # the baseline the group changes: two crawl ids on one host get a turn each
    a = crawl(redis_url, "a", group="", host_interval=1.0)
    b = crawl(redis_url, "b", group="", host_interval=1.0)
    a.push(pushes("h", 10, "a"))
    b.push(pushes("h", 10, "b"))
    assert len(take(a, "wa")) == 1
    assert len(take(b, "wb")) == 1


def test_the_crawls_of_a_group_share_a_hosts_concurrency_cap(redis_url):
    a = crawl(redis_url, "a", host_concurrency=2)
    b = crawl(redis_url, "b", host_concurrency=2)
    a.push(pushes("h", 10, "a"))
    b.push(pushes("h", 10, "b"))
    held = take(a, "wa", 1)
    assert len(held) == 1
    assert len(take(b, "wb", 5)) == 1  # 2 in flight in all
    assert take(a, "wa", 5) == [] and take(b, "wb", 5) == []
    a.call(CallBatch(acks=[(held[0].entry_id, held[0].token)]), worker="wa")
    assert len(take(a, "wa", 5)) + len(take(b, "wb", 5)) == 1  # the freed slot, once


def share_turns(redis_url, lua_clock, weights, rounds: int, seed: int) -> dict[str, int]:
    """Both crawls call for every turn of the host (1 a second), in a random order."""
    admins = {name: crawl(redis_url, name, weight=w, host_interval=1.0)
              for name, w in weights.items()}
    for name, admin in admins.items():
        admin.push(pushes("h", rounds + 10, name))
    counts = dict.fromkeys(admins, 0)
    order = list(admins)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            counts[name] += len(take(admins[name], f"w{name}", 1))
        lua_clock(1.0)
    return counts


def test_weights_3_to_1_share_the_turns_75_25(redis_url, lua_clock):
    counts = share_turns(redis_url, lua_clock, {"a": 3.0, "b": 1.0}, 200, seed=7)
    assert sum(counts.values()) == 200  # every turn taken, once
    # stride scheduling: the lag is at most a stride of each, so 150/50 within 2 turns
    assert abs(counts["a"] - 150) <= 2, counts


def test_equal_weights_share_the_turns_evenly(redis_url, lua_clock):
    counts = share_turns(redis_url, lua_clock, {"a": 1.0, "b": 1.0}, 100, seed=3)
    assert sum(counts.values()) == 100
    assert abs(counts["a"] - 50) <= 1, counts


def test_a_crawl_alone_on_the_host_takes_every_turn(redis_url, lua_clock):
    # b wanted the host once, then has no more work there: after its want is forgotten (2 s
    # of the clock, the window), a takes every turn; b coming back banks no credit
    a = crawl(redis_url, "a", weight=1.0, host_interval=1.0)
    b = crawl(redis_url, "b", weight=1.0, host_interval=1.0)
    a.push(pushes("h", 40, "a"))
    b.push(pushes("h", 1, "b"))
    assert len(take(b, "wb", 1)) == 1
    lua_clock(1.0)
    got = 0
    for _ in range(10):
        got += len(take(a, "wa", 1))
        lua_clock(1.0)
    assert got == 10  # b leased its last request of h: it wants h no more, no turn is lost
    b.push(pushes("h", 20, "b2"))
    counts = {"a": 0, "b": 0}
    for i in range(20):
        for name, admin in (("a", a), ("b", b)) if i % 2 else (("b", b), ("a", a)):
            counts[name] += len(take(admin, f"w{name}", 1))
        lua_clock(1.0)
    assert sum(counts.values()) == 20
    assert abs(counts["b"] - 10) <= 1, counts  # lifted to a's pass: no burst of 10 turns


def test_a_slot_freed_by_another_crawl_of_the_group_is_seen(redis_url, lua_clock):
    # a host at its concurrency cap waits for a free slot; an acknowledgement wakes only the
    # hosts of its own crawl, so another crawl of the group looks again 250 ms later
    a = crawl(redis_url, "a", host_concurrency=1)
    b = crawl(redis_url, "b", host_concurrency=1)
    a.push(pushes("h", 3, "a"))
    b.push(pushes("h", 3, "b"))
    held = take(a, "wa", 1)
    assert len(held) == 1
    assert take(b, "wb", 1) == []  # the group's one slot is a's
    a.call(CallBatch(acks=[(held[0].entry_id, held[0].token)]), worker="wa")
    lua_clock(0.3)
    assert len(take(b, "wb", 1)) == 1
