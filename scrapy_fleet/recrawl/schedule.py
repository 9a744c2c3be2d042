"""A tracked URL's state and its next interval (docs/recrawl.md).

The state travels in the stored request's meta (:data:`STATE_META_KEY`, a short list: the
schedule holds it in Redis with the request, nothing else): ``[fetched, interval, signature,
etag, last_modified, history, gone]``: the last fetch (unix seconds), the interval that fetch
was scheduled with (seconds), the content signature of the version seen (signature.py, None
before the first), the validators as the server sent them (None when it sent none; a
Last-Modified in the standard form kept as its unix time, :func:`pack_date`), the last
:data:`HISTORY` observations (seconds since the previous fetch: positive when the page had
changed, negative when not), and the 404/410 answers in a row with the last fetch's outcome
(:func:`pack_gone`: one byte, as the count alone took).

Policies: ``fixed`` revisits every ``FLEET_RECRAWL_INTERVAL``; ``adaptive`` estimates the
page's change rate from its history (Cho & Garcia-Molina's estimator for irregular intervals,
with Kolobov's 0.5 smoothing: solve sum over changed of t/(e^(l t) - 1) = sum over unchanged
of t) and gives it the interval of the optimal allocation of freshness (Cho & Garcia-Molina:
dF/df = mu with F(l, f) = (f / l)(1 - e^(-l / f))) at its host's price mu (allocation.py,
budget.py): the base price, at which a page changing once per ``FLEET_RECRAWL_INTERVAL`` is
revisited once per interval, or higher when the host's pages would exceed its budget; within
the min and max intervals.  A page changing faster than the budget can follow gets the max
interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

from scrapy_fleet.recrawl.allocation import base_price, interval_at
from scrapy_fleet.recrawl.settings import RecrawlConfig

#: meta key of a tracked request's state (kept in the frontier with the request)
STATE_META_KEY = "fleet_rv"
#: per-request meta: False opts a URL out of the recrawl; a number (seconds) sets its
#: interval (fixed for that URL, whatever the policy)
RECRAWL_META_KEY = "fleet_recrawl"
#: observations kept per URL
HISTORY = 8
#: a host's price over the base one lengthens a page's interval by at most this many times
#: its last one per visit (beyond the base price's interval)
GROWTH = 4.0
#: a page seen unchanged at its last BACKOFF_AFTER visits, its rate still uncertain, waits at
#: least BACKOFF times its last interval (schedule.learning)
BACKOFF, BACKOFF_AFTER = 3.0, 2
#: the last fetch's outcome (State.last): not recorded (a state written before it was),
#: a first fetch, a 2xx with new items (or text), a 2xx with the same, a 304, a fetch that
#: failed (a download error or another final status: its interval kept), a 404/410 (below
#: FLEET_RECRAWL_GONE_AFTER in a row); the names are those of the view and of the stats
#: ``fleet/recrawl/<name>`` (``first`` counts as ``tracked``, ``gone`` when dropped)
OUTCOME_NAMES = ("unknown", "first", "changed", "unchanged", "not_modified", "failed", "gone")
UNKNOWN, FIRST, CHANGED, UNCHANGED, NOT_MODIFIED, FAILED, GONE = range(len(OUTCOME_NAMES))
#: a page with fewer observations is learning (schedule.learning bounds its interval); from
#: HISTORY observations its rate is known (its host's price applies)
LEARNING = 4


@dataclass
class State:
    """A tracked URL's state (the module docstring gives the fields)."""

    fetched: int = 0
    interval: int = 0
    signature: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    history: list[int] = field(default_factory=list)
    gone: int = 0
    #: the last fetch's outcome: one of UNKNOWN ... GONE (:data:`OUTCOME_NAMES`)
    last: int = UNKNOWN

    def to_meta(self) -> list[Any]:
        return [self.fetched, self.interval, self.signature, self.etag,
                pack_date(self.last_modified), list(self.history),
                pack_gone(self.gone, self.last)]

    @classmethod
    def from_meta(cls, value: Any) -> State | None:
        """The state kept in meta, None when *value* is not one (absent, or not written by
        this module: such a request is tracked anew)."""
        if not isinstance(value, (list, tuple)) or len(value) != 7:
            return None
        fetched, interval, sig, etag, lm, hist, gone = value
        if not (isinstance(fetched, int) and isinstance(interval, int)
                and isinstance(hist, (list, tuple)) and isinstance(gone, int)):
            return None
        gone, last = unpack_gone(gone)
        return cls(fetched, interval, sig if isinstance(sig, int) else None,
                   etag if isinstance(etag, str) else None, unpack_date(lm),
                   [int(h) for h in hist if isinstance(h, int)][-HISTORY:], gone, last)


def pack_gone(gone: int, last: int) -> int:
    """The state's last slot: the 404/410 answers in a row *gone* and the last outcome *last*
    (:data:`OUTCOME_NAMES` index) as ``-(1 + 8 gone + last)``, negative so that a state
    written before the outcome was kept (the count alone, >= 0) reads as it was with the
    outcome unknown.  msgpack stores -1..-32 in one byte (a negative fixint), as it stored
    the count 0..127: no byte more per URL while gone <= 3 (FLEET_RECRAWL_GONE_AFTER's
    default is below)."""
    return -(1 + 8 * max(0, gone) + (last if 0 <= last < len(OUTCOME_NAMES) else UNKNOWN))


def unpack_gone(value: int) -> tuple[int, int]:
    """(gone, last outcome) of the state's last slot (:func:`pack_gone`; a count >= 0 from a
    state written before: that count, UNKNOWN)."""
    if value >= 0:
        return value, UNKNOWN
    packed = -value - 1
    last = packed % 8
    return packed // 8, last if last < len(OUTCOME_NAMES) else UNKNOWN


def pack_date(value: str | None) -> str | int | None:
    """A Last-Modified value as kept: the unix time when formatting that time gives the same
    string back (an IMF-fixdate, RFC 9110: 5 bytes instead of 29), else the string itself
    (echoed verbatim either way)."""
    if value is None:
        return None
    try:
        when = int(parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return value
    return when if formatdate(when, usegmt=True) == value else value


def unpack_date(value: Any) -> str | None:
    """The Last-Modified string of a kept value (:func:`pack_date`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return formatdate(value, usegmt=True)
    return None


def estimate_rate(history: list[int], prior: float) -> float:
    """Changes per second of a page from its *history* (module docstring), by bisection, with
    half an observation changed and half unchanged at *prior* seconds (the smoothing:
    finite for all-changed and all-unchanged histories).  Within [1e-6, 1e3] / prior."""
    changed = [float(t) for t in history if t > 0] + [0.5 * prior]
    unchanged = sum(-float(t) for t in history if t < 0) + 0.5 * prior

    def excess(rate: float) -> float:
        return sum(t / math.expm1(min(rate * t, 700.0)) for t in changed) - unchanged

    lo, hi = 1e-6 / prior, 1e3 / prior
    for _ in range(48):  # geometric bisection of a 1e9 ratio: 1e-13 relative
        mid = math.sqrt(lo * hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def optimal_interval(rate: float, base: float) -> float:
    """Seconds between fetches of a page changing *rate* times a second, at the optimal
    allocation whose price makes a page changing once per *base* seconds be fetched once per
    *base* seconds (allocation.py); ``math.inf`` when it is not worth fetching (changes too
    fast)."""
    return interval_at(rate, base_price(base))


def wanted_interval(request_meta: Any) -> float | None:
    """The interval (seconds) a request's meta sets, None for none or an invalid value (not a
    finite number > 0: :func:`invalid_wanted` tells which)."""
    value = request_meta.get(RECRAWL_META_KEY) if hasattr(request_meta, "get") else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        return None
    return float(value)


def invalid_wanted(request_meta: Any) -> bool:
    """True when the request's meta has ``fleet_recrawl`` set to neither False (opted out)
    nor a finite number of seconds > 0 (None, True, 0, -5, NaN, "abc"...)."""
    if not hasattr(request_meta, "get") or RECRAWL_META_KEY not in request_meta:
        return False
    return request_meta[RECRAWL_META_KEY] is not False and wanted_interval(request_meta) is None


def opted_out(request_meta: Any) -> bool:
    """True when the request's meta opts its URL out of the recrawl."""
    return hasattr(request_meta, "get") and request_meta.get(RECRAWL_META_KEY) is False


def next_interval(config: RecrawlConfig, state: State, wanted: float | None = None,
                  price: float | None = None, prior: float | None = None) -> int:
    """Seconds to the next fetch of a URL in *state* (its history updated), by the policy of
    *config*; *wanted*: the request's own interval (meta), which wins; *price*: the host's
    price of a fetch (seconds, allocation.py; ``math.inf``: every page at the max interval),
    None for the base interval's (no budget binds); *prior*: the change rate (changes a
    second) its host's pages have shown (budget.py ``HostBudgets.prior``), None when not
    known yet (the base interval's rate).  A page's estimate starts from the prior; while it
    is learning (fewer than :data:`LEARNING` observations) :func:`learning` bounds the
    interval; until its rate is known (:data:`HISTORY` observations) the base price applies,
    not its host's (the budget allocation is for known rates: a price solved from the first
    visits' guesses sent every page away); a page without history gets the base interval
    without a prior."""
    if wanted is not None:
        return max(1, round(wanted))
    base = base_price(config.interval)
    if config.mode != "adaptive" or (not state.history and prior is None):
        return max(1, round(config.interval))
    start = prior_interval(config, prior)
    rate = estimate_rate(state.history, start)
    interval = learning(interval_at(rate, base), state.history)
    if price is not None and price > base and len(state.history) >= HISTORY:
        # the budget lengthens the interval the base price gives, by at most GROWTH times the
        # last one per visit (an estimate from few observations must not send a page away
        # for the max interval)
        priced = interval_at(rate, price)
        if state.history:
            priced = min(priced, GROWTH * max(abs(state.history[-1]), config.interval))
        interval = max(interval, priced)
    return max(1, round(min(max(interval, config.min_interval), config.max_interval)))


def prior_interval(config: RecrawlConfig, prior: float | None) -> float:
    """Seconds per change of a page nothing is known of: its host's *prior* rate's, within
    the min and max intervals (the base interval without a prior)."""
    if prior is None or not prior > 0 or not math.isfinite(prior):
        return float(config.interval)
    return min(max(1.0 / prior, config.min_interval), config.max_interval)


def learning(interval: float, history: list[int]) -> float:
    """The interval of a page still learning (fewer than :data:`LEARNING` observations), the
    estimate's *interval* bounded so that it learns fast (issue 31):

    * seen unchanged at its last :data:`BACKOFF_AFTER` visits: at least :data:`BACKOFF` times
      its last interval (the estimate alone grows it about 20 % a visit);
    * seen changing at its last visit: at most the time it took to change; seen changing
      before: at most :data:`BACKOFF` times its last interval (never the max interval at once,
      where the allocation sends a page that looks faster than the price after a change or
      two).

    Later the estimate's *interval* alone (bounding it longer costs freshness at equal fetches
    once the pages' rates are spread: bench/README.md)."""
    if not history or len(history) >= LEARNING:
        return interval
    last = history[-1]
    if last > 0:
        return min(interval, float(last))
    if len(history) >= BACKOFF_AFTER and all(t < 0 for t in history[-BACKOFF_AFTER:]):
        interval = max(interval, BACKOFF * -last)
    if any(t > 0 for t in history):
        interval = min(interval, BACKOFF * -last)
    return interval


def observe(state: State, now: int, changed: bool) -> None:
    """Add one observation to *state*: the page *changed* (or not) since its last fetch
    (*now*: unix seconds).  A first fetch (no previous one) adds nothing."""
    if state.fetched > 0:
        elapsed = max(1, now - state.fetched)
        state.history.append(elapsed if changed else -elapsed)
        del state.history[:-HISTORY]
    state.fetched = now
