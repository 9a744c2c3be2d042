"""A host's recrawl budget with a real worker against the changing test site
(recrawl/budget.py, docs/recrawl.md "A host's budget"): a host whose pages ask for more
revisits than its budget gets a price over the base one, longer intervals that fit the
budget, and no backlog of due revisits."""

from __future__ import annotations

import math
import time

import redis
from support import queued, tail, wait_until
from test_recrawl import KEYS, site_with, stop, tracked_states, worker

from scrapy_fleet.recrawl.allocation import base_price

PAGES = 16
RATE = 4.0  # the host's rate, requests a second
SHARE = 0.5  # FLEET_RECRAWL_BUDGET: revisits may take 2 a second
BASE = 3.0  # FLEET_RECRAWL_INTERVAL


def due_records(client: redis.Redis) -> int:
    """Records of the schedule's slots that are due now (by Redis' clock)."""
    sec, usec = client.time()
    now_ms = sec * 1000 + usec // 1000
    return sum(client.llen(KEYS.revisit_slot(slot.decode()))
               for slot in client.zrangebyscore(KEYS.revisit_index, 0, now_ms))


def test_a_host_over_its_budget_gets_longer_intervals_that_fit_it_and_no_backlog(
        redis_url, tmp_path, site_factory, worker_env):
    # every page changes every 3 s: at the base price (3 s) they would ask for 5.3 revisits a
    # second, more than the host's rate and 2.7 times its budget
    site = site_with(site_factory, tmp_path, {
        "pages": PAGES, "static_share": 0.0,
        "periods": {str(i): BASE for i in range(PAGES)}})
    client = redis.Redis.from_url(redis_url)
    proc, log = worker(tmp_path, site, redis_url, worker_env, "w1", FLEET_RECRAWL="adaptive",
                       FLEET_RECRAWL_INTERVAL=BASE, FLEET_RECRAWL_MIN_INTERVAL=1,
                       FLEET_RECRAWL_MAX_INTERVAL=120, FLEET_HOST_RATE=RATE,
                       FLEET_RECRAWL_BUDGET=SHARE)
    budget = RATE * SHARE
    pages = [site.url + f"changing/{i}.html" for i in range(PAGES)]
    backlogs: list[int] = []

    last: list[object] = []

    def settled() -> bool:
        assert proc.poll() is None, tail(log)
        states = tracked_states(client)
        last[:] = [(len(s.history), s.interval) for s in states.values()]
        return all(p in states and len(states[p].history) >= 2 for p in pages)

    try:
        try:
            wait_until(settled, 240, "two revisits of every page", interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: (observations, interval) {last}") from None
        # from now on, every few seconds: revisits due and not fetched (in the schedule's due
        # slots or queued): at the host's rate they are fetched as they come due
        for _ in range(8):
            assert proc.poll() is None, tail(log)
            backlogs.append(due_records(client) + queued(client, KEYS))
            time.sleep(1.5)
        states = tracked_states(client)
        keys = client.keys(KEYS.revisit_budget("*"))
        prices = [client.hget(key, "mu") for key in keys]
    finally:
        stop(proc, log)
    intervals = [states[p].interval for p in pages if p in states]
    # the pages' revisits fit the host's budget (intervals are whole seconds; the last ones
    # were scheduled at the price known then: within a quarter over it), where at the base
    # price they would ask for 5.3 a second
    assert sum(1 / i for i in intervals) <= budget * 1.25, (intervals, prices)
    assert min(intervals) > BASE, intervals
    # no backlog: at most a few revisits wait for their turn at any sample (without the
    # budget all PAGES would be due and waiting, the host at its rate)
    assert max(backlogs) <= PAGES // 4, backlogs
    # the host's price, in Redis, is over the base one (finite: the pages fit at the max);
    # since the first visits are learned (issue 31: the price counts a page once its rate is
    # known), it settles near 1.5x the base price here (1.4997x in two runs of the merge)
    assert len(prices) == 1, keys  # one host
    price = float(prices[0] or 0)
    assert base_price(BASE) * 1.25 < price < math.inf, (price, base_price(BASE))
    # the budgets' closing handler is a coroutine (a handler returning a Deferred is
    # deprecated by Scrapy 2.13+: a warning in every budgeted worker's log)
    assert "Deferred" not in log.read_text(), tail(log)
