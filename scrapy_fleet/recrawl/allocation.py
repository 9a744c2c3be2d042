"""The optimal allocation of a host's fetch budget among its pages (docs/recrawl.md).

Cho & Garcia-Molina: a page changing ``l`` times a second (Poisson) and fetched ``f`` times a
second is fresh a share ``F(l, f) = (f / l)(1 - e^(-l / f))`` of the time.  Maximising the
sum of the pages' freshness under a budget ``sum f <= B`` (the Lagrangian) gives each page the
``f`` where ``dF/df = mu``, one price ``mu`` (seconds) for all the pages of the budget:
with ``x = l / f``, ``dF/df = (1 - (1 + x) e^(-x)) / l``, so ``x = g^-1(mu l)`` with
``g(x) = 1 - (1 + x) e^(-x)``, and ``f = l / x``; a page with ``mu l >= 1`` gets ``f = 0``
(fetching it buys less freshness than the price: it changes faster than the budget can
follow).  ``mu`` is the smallest price whose frequencies fit the budget.

The price a page of the base interval ``b`` (``FLEET_RECRAWL_INTERVAL``, changing once per
``b``) is fetched once per ``b`` at is :func:`base_price`, ``b (1 - 2/e)``: the adaptive policy's
price when no budget binds.  A host's budget binds when its pages' frequencies at that price
exceed it; its price is then solved (:func:`solve_price`) from a histogram of its pages'
estimated change rates in eighth-octave buckets of ``l b`` (:func:`rate_bucket`) with the sum
of their rates (each bucket at its mean rate: near the price's cutoff, ``mu l`` close to 1,
a page's interval is steep in its rate), so the cost does not grow with the host's pages:
at most :data:`BUCKETS` buckets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

#: eighth-octave buckets of l * b (the rate times the base interval), from 2^-10 to 2^10
BUCKET_LOW, BUCKET_HIGH = -80, 80
BUCKETS = BUCKET_HIGH - BUCKET_LOW + 1

# g(x) = 1 - (1 + x) e^(-x) on a log grid of x, for its inverse (then refined by Newton)
_XS = [10 ** (-8 + i * 0.002) for i in range(5001)]  # 1e-8 .. 1e2
_GS = [-math.expm1(-x) - x * math.exp(-x) for x in _XS]


def freshness(rate: float, freq: float) -> float:
    """Cho's time-averaged freshness of a page changing *rate* times a second fetched *freq*
    times a second (0 .. 1; 0 when *freq* is 0, 1 when *rate* is 0)."""
    if freq <= 0:
        return 0.0
    if rate <= 0:
        return 1.0
    x = rate / freq
    return -math.expm1(-x) / x


def marginal(rate: float, freq: float) -> float:
    """dF/df of :func:`freshness` (seconds), *rate* and *freq* > 0."""
    x = rate / freq
    return (-math.expm1(-x) - x * math.exp(-x)) / rate


def _g_inverse(c: float) -> float:
    """x > 0 with 1 - (1 + x) e^(-x) = c, for 0 < c < 1."""
    i = bisect.bisect_left(_GS, c)
    if i >= len(_GS):
        x = _XS[-1]
    else:
        x = _XS[max(i, 1)]
    if c < _GS[0]:
        x = math.sqrt(2 * c)  # g(x) ~ x^2 / 2 near 0
    for _ in range(4):  # Newton: g'(x) = x e^(-x)
        g = -math.expm1(-x) - x * math.exp(-x)
        step = (g - c) / (x * math.exp(-x))
        x = max(x - step, x / 2)
    return x


def base_price(base: float) -> float:
    """The price (seconds) at which a page changing once per *base* seconds is fetched once
    per *base* seconds: ``marginal(1/base, 1/base) = base (1 - 2/e)``."""
    return base * (1 - 2 / math.e)


def frequency_at(rate: float, price: float) -> float:
    """Fetches a second of a page changing *rate* times a second at *price* (seconds): the
    ``f`` with ``dF/df = price``; 0 when ``price * rate >= 1`` (not worth fetching)."""
    c = price * rate
    if c >= 1 or not math.isfinite(price):
        return 0.0
    if c <= 0:
        return math.inf
    return rate / _g_inverse(c)


def interval_at(rate: float, price: float) -> float:
    """Seconds between fetches of a page changing *rate* times a second at *price*;
    ``math.inf`` when it is not worth fetching."""
    f = frequency_at(rate, price)
    return math.inf if f <= 0 else 1.0 / f


def rate_bucket(rate: float, base: float) -> int:
    """The histogram bucket of a page changing *rate* times a second on a host of base
    interval *base*: ``round(8 log2(rate * base))`` within [BUCKET_LOW, BUCKET_HIGH]."""
    k = round(8 * math.log2(max(rate * base, 1e-300)))
    return min(max(k, BUCKET_LOW), BUCKET_HIGH)


def bucket_rate(bucket: int, base: float) -> float:
    """The rate (changes a second) a bucket stands for: ``2^(bucket / 8) / base``."""
    return 2 ** (bucket / 8) / base


def bucket_rates(counts: Mapping[int, int], base: float,
                 sums: Mapping[int, float] | None = None) -> dict[float, int]:
    """A host's histogram (bucket -> pages) as rate (changes a second) -> pages: each
    bucket's mean rate when *sums* (bucket -> sum of its pages' rates) has a plausible one
    (within the bucket's bounds), else the rate it stands for."""
    out: dict[float, int] = {}
    for k, n in counts.items():
        if n <= 0:
            continue
        rate = bucket_rate(k, base)
        mean = (sums or {}).get(k, 0.0) / n
        if rate * 2 ** -0.0625 * 0.999 <= mean <= rate * 2 ** 0.0625 * 1.001:
            rate = mean
        out[rate] = out.get(rate, 0) + n
    return out


def demand(rates: Mapping[float, int], low: float, high: float, price: float) -> float:
    """Fetches a second the pages of *rates* (changes a second -> pages) ask for at *price*,
    each page's interval within [*low*, *high*] seconds (a page not worth fetching: *high*)."""
    total = 0.0
    for rate, n in rates.items():
        if n > 0:
            f = frequency_at(rate, price)
            total += n * min(max(f, 1.0 / high), 1.0 / low)
    return total


def solve_price(rates: Mapping[float, int], start: float, low: float, high: float,
                budget: float | None) -> float:
    """The price (seconds) of a host whose pages change at *rates* (changes a second ->
    pages), their intervals within [*low*, *high*] seconds, with at most *budget* fetches a
    second for their revisits (None: no budget): *start* (:func:`base_price` of the host's
    base interval) when the pages fit the budget at it, else the smallest price at which they
    do (bisection to 1e-12 relative; the demand never over the budget); ``math.inf`` when
    even every page at *high* exceeds the budget (every page then gets *high*)."""
    if budget is None or demand(rates, low, high, start) <= budget:
        return start
    pages = sum(n for n in rates.values() if n > 0)
    if pages / high > budget:
        return math.inf
    lo, hi = start, start
    while demand(rates, low, high, hi) > budget:  # all pages at high past 1 / slowest rate
        lo, hi = hi, hi * 2
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if demand(rates, low, high, mid) > budget:
            lo = mid
        else:
            hi = mid
        if hi / lo - 1 < 1e-12:
            break
    return hi
