"""Budgets charged by the lease step (issue 34, lua/step_budget.lua) against a real
redis-server: exact page budgets across workers and calls, refunds, charge-once, host
budgets, the time budget, and the close reason."""

from __future__ import annotations

from scrapy import Request
from support import wait_server_past

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def make_admin(url: str, lease: float = 30.0, **budgets):
    return FrontierAdmin(url, "t", params=FrontierParams(lease_timeout=lease, **budgets))


def pushes(host: str, n: int):
    out = []
    for i in range(n):
        url = f"http://{host}/{i}"
        out.append((bloom_key(url.encode()), 0, codec.encode(Request(url)), 0, host))
    return out


def lease_all(admin, workers, take=3, rounds=20):
    got = []
    for _ in range(rounds):
        for w in workers:
            got += admin.call(CallBatch(take=take), worker=w).leased
    return got


def charged(admin) -> int:
    return int(admin.client.hget(admin.keys.budget, "charged") or 0)


def test_a_page_budget_grants_exactly_n_leases_across_workers(redis_url):
    admin = make_admin(redis_url, budget_pages=10)
    admin.push(pushes("a", 10) + pushes("b", 10) + pushes("c", 10))
    got = lease_all(admin, ["w1", "w2", "w3"])
    assert len(got) == 10
    assert len({e.entry_id for e in got}) == 10
    assert charged(admin) == 10
    assert admin.status()["queued"] == 20  # the rest kept, not served


def test_a_lease_given_back_unsent_is_refunded(redis_url):
    admin = make_admin(redis_url, budget_pages=4)
    admin.push(pushes("a", 10))
    first = admin.call(CallBatch(take=4), worker="w1").leased
    assert len(first) == 4
    assert admin.call(CallBatch(take=4), worker="w2").leased == []
    # w1 shuts down and gives two prefetched leases back: they are refunded and leased again
    back = admin.call(CallBatch(releases=[(e.entry_id, e.token) for e in first[:2]]),
                      worker="w1")
    assert back.released == 2
    assert charged(admin) == 2
    again = lease_all(admin, ["w2", "w3"])
    assert len(again) == 2
    assert charged(admin) == 4


def test_a_lease_lost_and_granted_again_is_charged_once(redis_url):
    admin = make_admin(redis_url, lease=1.0, budget_pages=3)
    admin.push(pushes("a", 10))
    first = admin.call(CallBatch(take=3), worker="dead").leased
    assert len(first) == 3 and charged(admin) == 3
    wait_server_past(admin.client, max(float(s) for _, s in admin.client.zrange(
        admin.keys.leases, 0, -1, withscores=True)))
    again = admin.call(CallBatch(take=10), worker="w2")
    assert again.reclaimed == 3
    # the three lost leases come back without a new charge; nothing new is leased
    assert sorted(e.entry_id for e in again.leased) == sorted(e.entry_id for e in first)
    assert charged(admin) == 3
    # given back unsent after a re-grant: no refund either (it was charged by its first grant)
    admin.call(CallBatch(releases=[(again.leased[0].entry_id, again.leased[0].token)]),
               worker="w2")
    assert charged(admin) == 3


def test_a_spent_budget_closes_the_crawl_once_nothing_is_in_flight(redis_url):
    admin = make_admin(redis_url, budget_pages=2)
    admin.push(pushes("a", 5))
    got = admin.call(CallBatch(take=5), worker="w1").leased
    assert len(got) == 2
    busy = admin.call(CallBatch(take=5), worker="w2")
    assert busy.budget_spent == ""  # two leases in flight
    done = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got], take=5),
                      worker="w1")
    assert (done.acked, done.leased, done.budget_spent) == (2, [], "budget_pages")
    assert admin.call(CallBatch(take=1), worker="w3").budget_spent == "budget_pages"


def test_a_crawl_without_budget_charges_nothing(redis_url):
    admin = make_admin(redis_url)
    admin.push(pushes("a", 5))
    got = admin.call(CallBatch(take=5), worker="w1")
    assert len(got.leased) == 5 and got.budget_spent == ""
    assert not admin.client.exists(admin.keys.budget)


def test_the_command_s_number_is_above_the_setting(redis_url):
    admin = make_admin(redis_url, budget_pages=2)
    admin.push(pushes("a", 10))
    assert len(lease_all(admin, ["w1"])) == 2
    admin.client.hset(admin.keys.budget, "pages", 5)  # scrapy fleet budget t --pages 5
    assert len(lease_all(admin, ["w1", "w2"])) == 3


def test_a_host_budget_stops_only_that_host_and_raising_it_revives_it(redis_url):
    admin = make_admin(redis_url, host_budget_pages=4)
    admin.push(pushes("big", 30) + pushes("other", 6))
    got = lease_all(admin, ["w1", "w2"])
    hosts = [e.payload for e in got]
    assert len(got) == 8  # 4 of big, 4 of other; the rest of big and other kept
    assert sum(b"//big/" in p for p in hosts) == 4
    assert admin.client.hget(admin.keys.budgeth, "n|big") == b"4"
    assert admin.client.zscore(admin.keys.ready, "big") > 1e15  # kept, not a candidate
    # scrapy fleet budget t --host big --pages 10
    admin.client.hset(admin.keys.budgeth, "c|big", 10)
    admin.client.hset(admin.keys.budget, "hosts", 1)
    admin.client.zadd(admin.keys.ready, {"big": 0}, xx=True)
    more = lease_all(admin, ["w1", "w2"])
    assert sum(b"//big/" in e.payload for e in more) == 6
    assert sum(b"//other/" in e.payload for e in more) == 0


def test_the_time_budget_ends_leasing_on_redis_s_clock(redis_url):
    admin = make_admin(redis_url, budget_seconds=1.0)
    admin.push(pushes("a", 10))
    first = admin.call(CallBatch(take=2), worker="w1")
    assert len(first.leased) == 2
    started = int(admin.client.hget(admin.keys.budget, "started"))
    assert started == first.now_ms
    wait_server_past(admin.client, started + 1000)
    late = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in first.leased], take=5),
                      worker="w1")
    assert (late.leased, late.budget_spent) == ([], "budget_seconds")
    assert admin.status()["queued"] == 8


def test_a_crawl_whose_every_queued_host_is_out_of_budget_closes(redis_url):
    admin = make_admin(redis_url, host_budget_pages=2)
    admin.push(pushes("a", 5) + pushes("b", 1))
    got = admin.call(CallBatch(take=10), worker="w1").leased
    assert len(got) == 3  # 2 of a, 1 of b
    done = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got], take=5),
                      worker="w1")
    assert (done.leased, done.queued, done.budget_spent) == ([], 3, "budget_hosts")


def test_an_item_budget_stops_leasing_once_the_reported_items_reach_it(redis_url):
    admin = make_admin(redis_url, budget_items=5)
    admin.push(pushes("a", 10))
    got = admin.call(CallBatch(take=2), worker="w1").leased
    assert len(got) == 2
    admin.client.hincrby(admin.keys.stats, "items_scraped", 4)  # (a worker's report)
    more = admin.call(CallBatch(take=1), worker="w1")
    assert len(more.leased) == 1 and more.budget_spent == ""
    admin.client.hincrby(admin.keys.stats, "items_scraped", 1)
    acks = [(e.entry_id, e.token) for e in got + more.leased]
    done = admin.call(CallBatch(acks=acks, take=4), worker="w1")
    assert (done.leased, done.budget_spent) == ([], "budget_items")


def test_a_byte_budget_stops_leasing_once_the_reported_bytes_reach_it(redis_url):
    admin = make_admin(redis_url, budget_bytes=10_000)
    admin.push(pushes("a", 10))
    got = admin.call(CallBatch(take=2), worker="w1").leased
    admin.client.hincrby(admin.keys.stats, "response_bytes", 9_999)  # (a worker's report)
    third = admin.call(CallBatch(take=1), worker="w1").leased
    assert len(third) == 1
    admin.client.hincrby(admin.keys.stats, "response_bytes", 1)
    busy = admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got], take=4),
                      worker="w1")
    assert (busy.leased, busy.budget_spent) == ([], "")  # the third page is in flight
    done = admin.call(CallBatch(acks=[(third[0].entry_id, third[0].token)], take=4),
                      worker="w1")
    assert (done.leased, done.budget_spent) == ([], "budget_bytes")
    assert admin.status()["queued"] == 7


def test_host_budgets_hold_in_each_partition_at_p_3(redis_url):
    from support import hosts_in_partition

    from scrapy_fleet.frontier import budgets
    from scrapy_fleet.keys.crawl import CrawlKeys
    from scrapy_fleet.keys.partition import partition_of

    own = CrawlKeys("fleet", "t")
    admins, hosts = [], []
    for p in range(3):
        keys = own.partition(p, 3)
        admin = FrontierAdmin(redis_url, "t", params=FrontierParams(host_budget_pages=3),
                              keys=keys)
        for host in hosts_in_partition(p, 3, 2):
            admin.push(pushes(host, 8))
            hosts.append(host)
        admins.append(admin)
    got = [e for admin in admins for e in lease_all(admin, ["w1", "w2"])]
    per_host = {h: sum(f"//{h}/".encode() in e.payload for e in got) for h in hosts}
    assert per_host == dict.fromkeys(hosts, 3)
    admins[0].client.hset(own.config, "host_budget_pages", 3)  # (what a worker writes)
    view = budgets.budget_status(admins[0].client, own, 3)
    assert (view["charged"], view["hosts_out"], view["pages"]) == (18, 6, None)
    assert view["hosts"] == {h: [3, 3] for h in hosts}
    raised = hosts[5]
    budgets.set_budget(admins[0].client, own.partition(partition_of(raised, 3), 3), pages=5,
                       host=raised)
    more = [e for admin in admins for e in lease_all(admin, ["w1"])]
    assert [f"//{raised}/".encode() in e.payload for e in more] == [True, True]
