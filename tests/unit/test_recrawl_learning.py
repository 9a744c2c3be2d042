"""Issue 31: the adaptive policy learns from the first visits (recrawl/schedule.py
``next_interval``, ``learning``, ``prior_interval``): a page starts from its host's prior, a
page seen unchanged backs off quickly, a page seen changing is revisited sooner and not sent to
the max interval while it is learning; its host's price applies once its rate is known."""

from __future__ import annotations

import math

from scrapy_fleet.recrawl.allocation import base_price
from scrapy_fleet.recrawl.schedule import (
    BACKOFF,
    HISTORY,
    LEARNING,
    State,
    estimate_rate,
    interval_at,
    next_interval,
    prior_interval,
)
from scrapy_fleet.recrawl.settings import RecrawlConfig

CONFIG = RecrawlConfig(mode="adaptive", interval=30.0, min_interval=5.0, max_interval=1800.0)


def test_a_first_visit_starts_from_its_hosts_prior_within_the_bounds():
    # nothing known of the host: the base interval
    assert next_interval(CONFIG, State(fetched=1)) == 30
    assert prior_interval(CONFIG, None) == 30.0
    # a host whose pages change about once per 200 s: the optimal interval at the rate the
    # estimator gives a page without history at that prior
    expected = interval_at(estimate_rate([], 200.0), base_price(30.0))
    assert next_interval(CONFIG, State(fetched=1), prior=1 / 200) == round(expected)
    assert next_interval(CONFIG, State(fetched=1), prior=1 / 200) > 30
    # a host whose pages change fast: sooner than the base interval (5 s at least)
    assert 5 <= next_interval(CONFIG, State(fetched=1), prior=1 / 15) < 30
    # the prior is the estimate's starting point: one unchanged visit of 60 s on a host of
    # slow pages gives a longer interval than on a host of fast ones
    seen = State(fetched=1, history=[-60])
    assert next_interval(CONFIG, seen, prior=1 / 1000) > next_interval(CONFIG, seen, prior=1 / 20)
    # a prior out of the bounds, or not a rate, is clamped or ignored
    assert prior_interval(CONFIG, 1e-9) == 1800.0
    assert prior_interval(CONFIG, 10.0) == 5.0
    assert prior_interval(CONFIG, math.nan) == prior_interval(CONFIG, -1.0) == 30.0
    # fixed keeps its interval
    fixed = RecrawlConfig(mode="fixed", interval=30.0)
    assert next_interval(fixed, State(fetched=1, history=[-30, -30]), prior=1 / 1000) == 30


def test_a_page_seen_unchanged_twice_backs_off_at_least_threefold_a_visit():
    one = next_interval(CONFIG, State(fetched=1, history=[-30]))
    assert one < 2 * 30  # one unchanged visit: the estimate's interval
    history = [-30, -45]
    for _ in range(LEARNING - 2):
        interval = next_interval(CONFIG, State(fetched=1, history=list(history)))
        assert interval >= BACKOFF * -history[-1]
        history.append(-interval)
    assert history == [-30, -45, -135, -405]
    # then the estimate from those observations: far from the 30 s a page started at
    assert next_interval(CONFIG, State(fetched=1, history=history)) > 100
    # the estimate alone (a history past learning: no bound) grows far slower
    slow = [-30 * 1.2 ** k for k in range(HISTORY)]
    full = next_interval(CONFIG, State(fetched=1, history=[round(t) for t in slow]))
    assert full < BACKOFF * -round(slow[-1])


def test_a_page_seen_changing_is_revisited_sooner_and_not_at_the_max_interval_until_known():
    # changed in the 30 s since its last visit: revisited within 30 s
    assert next_interval(CONFIG, State(fetched=1, history=[30])) <= 30
    # changed fast twice: the allocation alone would give the max interval (faster than the
    # price can follow); while uncertain, the time it took to change
    fast = [3, 3]
    assert interval_at(estimate_rate(fast, 30.0), base_price(30.0)) == math.inf
    assert next_interval(CONFIG, State(fetched=1, history=fast)) == 5  # (the min interval)
    # changed before, unchanged at its last visit: at most BACKOFF times the last interval
    assert next_interval(CONFIG, State(fetched=1, history=[6, -6])) <= BACKOFF * 6
    # past learning (LEARNING observations): the allocation decides, the max interval here
    assert next_interval(CONFIG, State(fetched=1, history=[3] * LEARNING)) == 1800
    assert next_interval(CONFIG, State(fetched=1, history=[3] * HISTORY)) == 1800


def test_the_hosts_price_applies_once_a_pages_rate_is_known():
    price = base_price(30.0) * 20  # a budget that binds hard
    for history in ([], [-30], [-30, -45, -135, -405], [60] * (HISTORY - 1)):
        state = State(fetched=1, history=list(history))
        assert next_interval(CONFIG, state, price=price) == next_interval(CONFIG, state)
    known = State(fetched=1, history=[60] * HISTORY)
    assert next_interval(CONFIG, known, price=price) > next_interval(CONFIG, known)
