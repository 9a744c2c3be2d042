"""The cockpit's data (scrapy_fleet/monitoring/) written by frontier calls made directly
against a real redis-server: exact fleet-wide counters under concurrency and replays, one
clear error for a bad argument, churned worker ids that leave no key behind, bounded series,
rates, ETA and alerts read back by the snapshot.  worker/test_monitoring_crawls.py runs real
crawls (SIGKILL, SIGTERM); unit/test_monitoring_worker_side.py the worker's side alone.
"""

from __future__ import annotations

import threading
import time

import msgpack
import pytest
import redis
from support import crawl_snapshot as snapshot
from support import monitor_payload as payload
from support import queued

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring import series
from scrapy_fleet.monitoring.sampler import sample
from scrapy_fleet.monitoring.snapshot import read_series, read_snapshot


def test_two_workers_adding_to_one_counter_concurrently_lose_nothing(redis_url):
    calls = 300

    def worker(name: str) -> None:
        admin = FrontierAdmin(redis_url, "conc")
        for n in range(1, calls + 1):
            admin.call(CallBatch(beat=True), worker=name,
                       monitor=payload(n, {"resp/200": 1, "pages": 1, "items_scraped": 2},
                                       [["h.test", 1, 0]]))
        admin.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}:1:1",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = snapshot(redis_url, "conc")["counters"]
    assert (c["pages"], c["responses"]["2xx"], c["items_scraped"]) == (600, 600, 1200)
    client = redis.Redis.from_url(redis_url)
    assert client.hget(CrawlKeys("fleet", "conc").hoststats, "p|h.test") == b"600"


def test_a_replayed_call_counts_once(redis_url):
    admin = FrontierAdmin(redis_url, "replay")
    arg = payload(1, {"resp/200": 3, "pages": 3})
    first = admin.call(CallBatch(beat=True), worker="w:1:1", op_id="op-1", monitor=arg)
    again = admin.call(CallBatch(beat=True), worker="w:1:1", op_id="op-1", monitor=arg)
    assert first.now_ms == again.now_ms  # the cached reply: the script did not run again
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 3
    # the same batch resent with a new op id (every retry of a call failed after the script
    # ran): its sequence number was applied already, so it is skipped
    admin.call(CallBatch(beat=True), worker="w:1:1", monitor=arg)
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 3
    admin.call(CallBatch(beat=True), worker="w:1:1", monitor=payload(2, {"pages": 1}))
    assert snapshot(redis_url, "replay")["counters"]["pages"] == 4


def test_a_bad_monitoring_argument_is_refused_before_any_write(redis_url):
    admin = FrontierAdmin(redis_url, "bad")
    admin.push([(b"a" * 12, 0, b"x", 0, "h")])
    client = redis.Redis.from_url(redis_url)
    before = client.hgetall(admin.keys.stats)
    for arg in (b"\xc1", msgpack.packb({"c": {"evil": 1}, "cs": 1}),
                msgpack.packb({"c": {"pages": -5}, "cs": 1}),
                msgpack.packb({"hb": {"st": "x" * 500}})):
        with pytest.raises(redis.ResponseError, match="fleet: "):
            admin.call(CallBatch(take=1), worker="w:1:1", monitor=arg)
    assert client.hgetall(admin.keys.stats) == before
    assert client.zcard(admin.keys.leases) == 0  # the take did not run either


def test_a_monitoring_key_of_another_type_is_one_clear_error_and_changes_nothing(redis_url):
    admin = FrontierAdmin(redis_url, "foreign")
    admin.push([(b"f" * 12, 0, b"x", 0, "h")])
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    client.set(keys.mon, "not ours")
    client.set(keys.hostbans, "not ours either")
    client.delete(keys.series("1m"))
    client.lpush(keys.series("1m"), "a list")
    with pytest.raises(redis.ResponseError, match=r"fleet:\{foreign\}:mon holds a string"):
        admin.call(CallBatch(take=1), worker="w:1:1", monitor=payload())
    assert (queued(client, keys), client.zcard(keys.leases)) == (1, 0)
    snap = snapshot(redis_url, "foreign")  # status still reads what it can
    assert snap["frontier"]["due"] == 1 and snap["started_at"] is None
    client.delete(keys.mon, keys.hostbans)
    admin.call(CallBatch(take=1), worker="w:1:1", monitor=payload())  # a ring of the wrong
    assert client.strlen(keys.series("1m")) == series.tier_bytes("1m")  # type starts afresh


#: FLEET_WORKER_FORGET_AFTER of the churn test's calls (ms): a worker id silent that long is
#: forgotten by the next call
CHURN_FORGET_MS = 1500


# pause: seconds between two churned calls; 0.01 stands for a machine on which the 200 calls
# take longer than CHURN_FORGET_MS (a loaded one: 190 ids were still listed, not 201)
@pytest.mark.parametrize("pause", [0.0, 0.01], ids=["fast", "slow"])
def test_churned_worker_ids_leave_no_keys_behind(redis_url, pause):
    # (max_leases: the 29 entries' leases expire and are reclaimed, by the churned workers'
    # calls too, as often as a slow machine makes them; none may become a dead letter, which
    # would add the crawl-wide `dead` key that this test does not expect)
    params = FrontierParams(op_ttl=1.0, max_leases=10_000)
    resident = FrontierAdmin(redis_url, "churn", params=params)
    resident.push([(bytes([i]) * 12, 0, b"x", 0, "h.test") for i in range(1, 30)])
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    client = redis.Redis.from_url(redis_url)
    registered = []  # per churned worker: was it in the worker list, with its info, at once?

    def churn(names: range) -> None:
        for n in names:  # each leases a request and vanishes, like a SIGKILLed worker
            admin = FrontierAdmin(redis_url, "churn",
                                  params=FrontierParams(op_ttl=1.0, lease_timeout=1.0,
                                                        max_leases=10_000))
            worker = f"gone{n}:{n}:1"
            admin.call(CallBatch(take=1), worker=worker,
                       monitor=payload(1, {"pages": 1}, [[f"h{n}.test", 1, 1]],
                                       forget_ms=CHURN_FORGET_MS))
            # (checked after its own call, not after all 200: a call forgets the ids silent
            # for CHURN_FORGET_MS, and how many calls fit in that depends on the machine)
            registered.append(client.zscore(resident.keys.workers, worker) is not None
                              and client.exists(resident.keys.worker_info(worker)) == 1)
            admin.close()
            time.sleep(pause)

    churn(range(1))  # the crawl-wide keys it creates (stats, hoststats, expiries...) stay
    time.sleep(CHURN_FORGET_MS / 1000 + 1)
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    baseline = sorted(client.keys("*"))
    churn(range(1, 201))
    assert registered == [True] * 201
    # (at least CHURN_FORGET_MS after the last churned call, and the leases' 1 s)
    time.sleep(CHURN_FORGET_MS / 1000 + 1)
    # the resident's next call reclaims the expired leases and forgets the departed ids
    resident.call(CallBatch(beat=True), worker="resident:1:1",
                  monitor=payload(forget_ms=CHURN_FORGET_MS))
    keys_now = sorted(client.keys("*"))

    def others(names: list[bytes]) -> list[bytes]:
        return [k for k in names if b":op:" not in k]

    assert others(keys_now) == others(baseline)
    assert len(keys_now) - len(others(keys_now)) <= 1  # the resident's last reply only
    assert client.zcard(resident.keys.workers) == 1
    assert client.hlen(resident.keys.wlive) == 0 and client.zcard(resident.keys.leases) == 0
    assert snapshot(redis_url, "churn")["counters"]["pages"] == 201


def test_series_have_fixed_bytes_whatever_the_crawl(redis_url):
    admin = FrontierAdmin(redis_url, "ser")
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    admin.push([(b"s" * 12, 0, b"x", 0, "h")])
    sizes = {t: client.strlen(keys.series(t)) for t in series.TIERS}
    assert sizes == {t: series.tier_bytes(t) for t in series.TIERS}
    assert sum(sizes.values()) == (360 + 1440 + 1008) * 80 < 1_000_000
    for chunk in range(20):  # 10,000 entries on 1,000 hosts, 100 workers
        admin.push([(f"{chunk:04d}{i:08d}".encode(), 0, b"x", 0, f"h{i % 1000}")
                    for i in range(500)])
    for n in range(100):
        admin.call(CallBatch(beat=True), worker=f"w{n}:1:1", monitor=payload(1, {"pages": 1}))
    assert {t: client.strlen(keys.series(t)) for t in series.TIERS} == sizes
    points = read_series(client, keys, "depth_due")
    assert len(points) == 360
    # one sample per 10 s step fleet-wide (the test spans one or two steps), each the depth
    # then; none before the crawl began
    values = [v for _, v in points if v is not None]
    assert 1 <= len(values) <= 2 and values[0] == 1.0 and values == sorted(values)
    assert values[-1] <= 10_001
    assert not sample(client, keys)  # this step has its sample: no second one fleet-wide
    with pytest.raises(ValueError, match="unknown series"):
        read_series(client, keys, "nope")


def _ring(samples: list[tuple[float, int, int]]) -> bytes:
    """A 10 s ring holding (t, due, pages) samples, as lua/monitoring.lua writes them."""
    step, points = series.TIERS["10s"]
    raw = bytearray(series.tier_bytes("10s"))
    for t, due, pages in samples:
        slot = int(t * 1000) // (step * 1000)
        series._SLOT.pack_into(raw, (slot % points) * series.SLOT_BYTES,
                               int(t * 1000), due, 0, 0, 0, 0, pages, pages // 2, 0, 1)
    return bytes(raw)


def test_rates_of_a_young_crawl_are_over_its_age(redis_url):
    # issue 19: on a 30 s old crawl pages/min was the count of the last 60 s (half the
    # rate); and (next test) the ETA read "-" while the queue fell from 16k to 6k (it
    # compared the depth with the first sample, taken when the push had barely begun)
    admin = FrontierAdmin(redis_url, "young")
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(6000)])
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "young")
    sec, usec = client.time()
    now = sec + usec / 1e6
    client.set(keys.series("10s"), _ring([(now - 30, 100, 0), (now - 20, 16000, 500),
                                          (now - 10, 11000, 1000)]))
    client.hset(keys.stats, mapping={"pages": 1500, "items_scraped": 750})
    snap = read_snapshot(client, keys)
    rates, window = snap["rates"], snap["at"] - (now - 30)  # the crawl's age: its 1st sample
    assert rates["pages_per_min"] == pytest.approx(1500 * 60 / window, rel=1e-3)
    assert rates["items_per_min"] == pytest.approx(750 * 60 / window, rel=1e-3)
    assert rates["window_s"] == pytest.approx(window, abs=0.1)
    client.close()


def test_the_eta_shows_as_soon_as_the_queue_falls(redis_url):
    admin = FrontierAdmin(redis_url, "falling")
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(6000)])
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "falling")
    sec, usec = client.time()
    now = sec + usec / 1e6
    client.set(keys.series("10s"), _ring([(now - 30, 100, 0), (now - 20, 16000, 500),
                                          (now - 10, 11000, 1000)]))
    client.hset(keys.stats, "pages", 1500)  # pages fetched (what the workers counted)
    snap = read_snapshot(client, keys)
    window = snap["at"] - (now - 30)
    # 16000 -> 6000 in 20 s since the peak: 6000 more take 12 s
    assert snap["frontier"]["depth"] == 6000
    assert snap["eta_seconds"] == pytest.approx(6000 * (now + window - 30 - (now - 20))
                                                / 10000, abs=0.5)
    # a queue that fell, then no page fetched over the last minute (no worker left): no ETA
    client.set(keys.series("10s"), _ring([(now - 80, 100, 0), (now - 70, 16000, 500),
                                          (now - 60, 11000, 1500), (now - 1, 6000, 1500)]))
    stalled = read_snapshot(client, keys)
    assert stalled["rates"]["pages_per_min"] == 0 and stalled["eta_seconds"] is None
    # a queue that does not fall has no ETA
    client.set(keys.series("10s"), _ring([(now - 20, 100, 0), (now - 10, 5000, 10)]))
    assert read_snapshot(client, keys)["eta_seconds"] is None
    client.close()


def test_runnable_now_counts_what_the_caps_let_run(redis_url):
    params = FrontierParams(host_concurrency=2)
    admin = FrontierAdmin(redis_url, "run", params=params)
    client = redis.Redis.from_url(redis_url)
    client.hset(admin.keys.config, "host_concurrency", 2)  # as the workers write it
    admin.push([(f"{i:012d}".encode(), 0, b"x", 0, "one.test") for i in range(1000)])
    assert snapshot(redis_url, "run")["runnable_now"] == 2  # 1000 queued, capped at 2
    for _ in range(3):  # a capped host's slots are shared among the live workers: one first
        admin.call(CallBatch(take=10), worker="w:1:1", monitor=payload())
    snap = snapshot(redis_url, "run")
    assert (snap["frontier"]["leased"], snap["runnable_now"]) == (2, 2)  # never 0 in flight
    admin.push([(f"x{i:011d}".encode(), 0, b"x", 0, f"h{i}.test") for i in range(50)])
    assert snapshot(redis_url, "run")["runnable_now"] == 52


def test_no_worker_alert_says_what_where_and_what_next(redis_url):
    admin = FrontierAdmin(redis_url, "lonely")
    admin.push([(b"l" * 12, 0, b"x", 0, "h")])
    (alert,) = snapshot(redis_url, "lonely")["alerts"]
    assert alert["id"] == "no_worker" and alert["severity"] == "critical"
    assert "1 request(s) wait" in alert["what"] and alert["where"] == "crawl lonely"
    assert alert["next"].startswith("start workers: scrapy crawl")
