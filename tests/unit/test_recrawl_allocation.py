"""The allocation of a host's fetch budget (recrawl/allocation.py, recrawl/budget.py) against
Cho & Garcia-Molina's closed forms."""

from __future__ import annotations

import math

import pytest

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.recrawl import allocation as a
from scrapy_fleet.recrawl.budget import history_bucket, host_budget, host_price
from scrapy_fleet.recrawl.schedule import State, next_interval, optimal_interval
from scrapy_fleet.recrawl.settings import RecrawlConfig

DAY = 86400.0


def test_cho_and_garcia_molinas_five_pages_example():
    """Cho & Garcia-Molina (SIGMOD 2000, 'Synchronizing a database to improve freshness'):
    five pages changing 1, 2, 3, 4, 5 times a day, 5 fetches a day in all: the optimal
    frequencies are 1.15, 1.36, 1.35, 1.14 and 0 a day (the fastest page is not fetched)."""
    rates = {i / DAY: 1 for i in range(1, 6)}
    price = a.solve_price(rates, 1e-9, 1e-3, 1e15, 5 / DAY)
    freqs = [a.frequency_at(i / DAY, price) * DAY for i in range(1, 6)]
    assert [round(f, 2) for f in freqs] == [1.15, 1.36, 1.35, 1.14, 0.0]
    assert sum(freqs) == pytest.approx(5.0, rel=1e-9)


@pytest.mark.parametrize("rate", [1e-4, 0.01, 0.3, 1.0, 7.0])
@pytest.mark.parametrize("price", [0.01, 0.1, 0.5, 0.9])
def test_the_frequency_at_a_price_is_where_the_marginal_freshness_is_the_price(rate, price):
    """dF/df = mu at the frequency found, F being Cho's (f/l)(1 - e^(-l/f)); the marginal
    is the closed form's derivative (checked by a finite difference)."""
    mu = price / rate  # mu * l = price < 1: worth fetching
    f = a.frequency_at(rate, mu)
    assert f > 0
    assert a.marginal(rate, f) == pytest.approx(mu, rel=1e-9)
    h = f * 1e-6
    numeric = (a.freshness(rate, f + h) - a.freshness(rate, f - h)) / (2 * h)
    assert numeric == pytest.approx(mu, rel=1e-5)


def test_a_page_changing_faster_than_the_price_follows_is_not_fetched():
    """mu * l >= 1: dF/df < mu at every f (its supremum, at f -> infinity, is 1/l)."""
    assert a.frequency_at(2.0, 0.5) == 0.0
    assert a.frequency_at(2.0, 0.499) > 0.0
    assert a.interval_at(2.0, 0.6) == math.inf
    assert a.frequency_at(1.0, math.inf) == 0.0


def test_the_base_price_fetches_a_page_changing_once_per_base_once_per_base():
    for base in (10.0, 3600.0, DAY):
        assert a.base_price(base) == pytest.approx(a.marginal(1 / base, 1 / base), rel=1e-12)
        assert a.interval_at(1 / base, a.base_price(base)) == pytest.approx(base, rel=1e-9)
        assert optimal_interval(1 / base, base) == pytest.approx(base, rel=1e-9)


def test_equal_pages_share_a_binding_budget_equally():
    """n pages of one rate, budget B < their demand at the base price: each gets B / n."""
    base = 10.0
    rates = {0.1: 60}  # 60 pages changing every 10 s want 6 fetches a second at the base price
    assert a.demand(rates, 1.0, 1e6, a.base_price(base)) == pytest.approx(6.0, rel=1e-9)
    price = a.solve_price(rates, a.base_price(base), 1.0, 1e6, 2.0)
    assert a.frequency_at(0.1, price) == pytest.approx(2.0 / 60, rel=1e-9)


def test_the_price_fits_the_budget_and_is_the_base_one_when_it_does_not_bind():
    base = 10.0
    counts = {a.rate_bucket(r, base): n for r, n in ((0.001, 100), (0.05, 40), (0.2, 20))}
    config = RecrawlConfig(mode="adaptive", interval=base, min_interval=1.0,
                           max_interval=1000.0)
    rates = a.bucket_rates(counts, base)
    free = a.demand(rates, 1.0, 1000.0, a.base_price(base))
    assert host_price(counts, config, None) == a.base_price(base)
    assert host_price(counts, config, free * 1.01) == a.base_price(base)
    for share in (0.8, 0.5, 0.2):
        price = host_price(counts, config, free * share)
        assert price > a.base_price(base)
        assert a.demand(rates, 1.0, 1000.0, price) == pytest.approx(free * share, rel=1e-6)
        assert a.demand(rates, 1.0, 1000.0, price) <= free * share
    # below every page at the max interval (160 pages / 1000 s): infinite price
    assert host_price(counts, config, 0.1) == math.inf


def test_a_binding_price_makes_every_interval_longer_or_equal_and_the_fastest_max():
    config = RecrawlConfig(mode="adaptive", interval=10.0, min_interval=1.0,
                           max_interval=1000.0)
    base = a.base_price(10.0)
    # known rates (HISTORY observations: the allocation's domain, issue 31)
    histories = [[-10, -12, -14] * 2 + [-17, -20], [10, -10, 10] * 2 + [-10, 10], [5] * 8,
                 [2] * 8]
    for history in histories:
        state = State(fetched=1, history=list(history))
        free = next_interval(config, state)
        assert next_interval(config, state, price=base) == free  # the base price: as before
        assert next_interval(config, state, price=base * 3) >= free
        # every page at the max interval, or GROWTH (4) times its last one if shorter, or
        # the base price's interval if longer
        assert next_interval(config, state, price=math.inf) == \
            min(1000, max(free, 4 * max(abs(history[-1]), 10)))
    # a page whose rate is not known yet (no history, or fewer than HISTORY observations):
    # the price does not apply (schedule.learning decides: issue 31)
    assert next_interval(config, State(fetched=1)) == 10
    assert next_interval(config, State(fetched=1), price=base * 10) == 10
    learning = State(fetched=1, history=[-10, -12, -14])
    assert next_interval(config, learning, price=math.inf) == next_interval(config, learning)
    # a request's own interval wins over any price
    assert next_interval(config, State(fetched=1, history=[2, 2]), 7.0, math.inf) == 7


def test_buckets_are_eighth_octaves_of_rate_times_base_at_their_mean_rate():
    assert a.rate_bucket(0.1, 10.0) == 0
    assert a.rate_bucket(0.2, 10.0) == 8
    assert a.rate_bucket(0.1 * 2 ** 0.125, 10.0) == 1
    assert a.rate_bucket(1e-30, 10.0) == a.BUCKET_LOW
    assert a.rate_bucket(1e30, 10.0) == a.BUCKET_HIGH
    assert a.bucket_rate(8, 10.0) == pytest.approx(0.2)
    fast, slow = history_bucket([10, 10, 10, 10], 10.0), history_bucket([-10, -10, -10], 10.0)
    assert fast[0] > slow[0] and fast[1] > slow[1]
    assert a.rate_bucket(fast[1], 10.0) == fast[0]
    # a bucket stands for its pages' mean rate (kept as a sum); an implausible sum (drift)
    # falls back to the bucket's own rate
    [(mean, n)] = a.bucket_rates({0: 2}, 10.0, {0: 0.1 * 2 ** 0.05 * 2}).items()
    assert (mean, n) == (pytest.approx(0.1 * 2 ** 0.05), 2)
    [(own, n)] = a.bucket_rates({0: 2}, 10.0, {0: 5.0}).items()
    assert (own, n) == (pytest.approx(0.1), 2)
    assert a.bucket_rates({0: 0, 1: -1}, 10.0) == {}


def test_a_hosts_budget_is_the_share_of_its_politeness_rate():
    fleet = FleetConfig.from_settings({
        "FLEET_HOST_RATE": 4, "FLEET_RECRAWL": "adaptive", "FLEET_RECRAWL_BUDGET": 0.5,
        "FLEET_HOST_OVERRIDES": {"slow.test": {"rate": 1}, "delay.test": {"delay": 4}}})
    assert host_budget(fleet, "any.test") == pytest.approx(2.0)
    assert host_budget(fleet, "slow.test") == pytest.approx(0.5)
    assert host_budget(fleet, "delay.test") == pytest.approx(0.125)
    assert host_budget(fleet, "any.test", crawl_delay=10.0) == pytest.approx(0.05)
    free = FleetConfig.from_settings({"FLEET_RECRAWL": "adaptive"})  # no rate, no delay
    assert host_budget(free, "any.test") is None
    off = FleetConfig.from_settings({"FLEET_HOST_RATE": 4, "FLEET_RECRAWL": "adaptive",
                                     "FLEET_RECRAWL_BUDGET": 0})
    assert host_budget(off, "any.test") is None


@pytest.mark.parametrize("value", [-0.1, 1.5, "x", True])
def test_a_wrong_budget_share_names_the_setting(value):
    from scrapy_fleet.errors import FleetConfigError

    with pytest.raises(FleetConfigError, match="FLEET_RECRAWL_BUDGET"):
        FleetConfig.from_settings({"FLEET_RECRAWL": "adaptive", "FLEET_RECRAWL_BUDGET": value})


def test_under_a_binding_price_an_interval_grows_at_most_fourfold_per_visit():
    """A page the raised price sends far away would stay there for the whole interval with an
    estimate from a few noisy observations (bench/README.md: the budget's freshness): while
    the host's price is over the base one, it lengthens a page's interval (beyond the base
    price's) by at most GROWTH times the last one (or the base interval)."""
    config = RecrawlConfig(mode="adaptive", interval=10.0, min_interval=1.0,
                           max_interval=100_000.0)
    high = a.base_price(10.0) * 50
    slow = State(fetched=1, history=[-10, -12, -14, -17, -20, -24, -29, -35])
    free = next_interval(config, slow)
    assert free < 4 * 35
    assert next_interval(config, slow, price=high) == 4 * 35  # 4 x its last interval
    changing = State(fetched=1, history=[3, -3, 3, 3, -3, 3, 3, -3])
    assert next_interval(config, changing) < 40
    assert next_interval(config, changing, price=math.inf) == 40  # 4 x the base interval
    # a page not worth fetching at the base price gets the max interval once its rate is
    # known (HISTORY observations); while it is uncertain, the time it took to change (issue
    # 31: schedule.learning), whatever the price
    fast = State(fetched=1, history=[2, 2, 2])
    assert next_interval(config, fast) == next_interval(config, fast, price=high) == 2
    known = State(fetched=1, history=[2] * 8)
    assert next_interval(config, known) == next_interval(config, known, price=high) == 100_000
