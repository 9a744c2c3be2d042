"""Freshness of the recrawl policies at equal fetches, measured from the changing site's own
truth (issue 22's goals: the adaptive policy reaches the uniform policy's freshness with
<= 0.5x the fetches on a site where 60 % of the pages never change; >= 0.80 freshness at
StormCrawler's fetch budget in the research's setting).

The site is testsite/changing.py's model (``ChangingPages``: Poisson changes of known rates,
seeded; the share of pages that never change), on a virtual clock in days; the policies are
the package's own code (``scrapy_fleet.recrawl.schedule``: ``next_interval`` with its
change-rate estimator and optimal interval, the state it keeps, the history of 8
observations), a visit observing what the worker observes (the version changed since the last
fetch, or not).  One host: due pages are fetched earliest-due first at most ``--budget``
fetches a day (the host's politeness: a revisit never goes faster), so a policy asking for
more waits.  Freshness: the time-averaged share of pages whose last fetched version is the
current one, over the days after ``--warm``.  Policies:

* ``uniform``: every page every N / (fetches a day) days (the baseline at a given budget);
* ``fixed``: ``FLEET_RECRAWL = "fixed"`` with ``FLEET_RECRAWL_INTERVAL`` = ``--interval`` days;
* ``adaptive``: ``FLEET_RECRAWL = "adaptive"``, its base interval found by bisection so that
  its fetches a day match the budget compared.

Runs (``--setting``): ``static60``: 500 pages, 60 % never change, the rest log-uniform
1/60 .. 8 changes a day: the fetches the uniform policy needs to reach the adaptive policy's
freshness (bisection), their ratio; ``research``: 500 pages all changing (log-uniform 1/60 ..
8 a day, research note), the adaptive policy at StormCrawler's budget (912 fetches a day).

``budget`` (``--parts budget``, ``--max-days``: the max interval, 30 days by default): at a
fixed host rate (250 or 500 fetches a day) the adaptive policy with a base interval asking for
more (0.3 day) without the budget allocation (due pages wait their turn at the host's rate,
earliest due first) and with it (recrawl/budget.py's histogram and price, the budget the whole
rate), and the uniform policy at that rate.

This is the policies' code on the site's model, not workers over HTTP: the workers' path
(conditional GET, signatures, the schedule in Redis) is tested in tests/worker/test_recrawl.py;
a day of virtual time here is a day of a real crawl.

Usage: ``.venv/bin/python bench/bench_freshness.py [--days 150] [--warm 50]``
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testsite: a checkout folder

from scrapy_fleet.recrawl.budget import history_bucket, host_price
from scrapy_fleet.recrawl.schedule import State, next_interval, observe
from scrapy_fleet.recrawl.settings import RecrawlConfig
from testsite.changing import ChangingPages

DAY = 86400


def site(pages: int, static_share: float, seed: int) -> ChangingPages:
    return ChangingPages({"pages": pages, "static_share": static_share, "seed": seed,
                          "rate_min": 1 / 60 / DAY, "rate_max": 8 / DAY}, start=0.0)


def simulate(policy: str, model: ChangingPages, days: float, warm: float, budget: float,
             base_days: float = 1.0, min_days: float = 1 / 24, max_days: float = 90.0,
             share: float | None = None, min_seconds: float | None = None,
             solve_every: float = DAY / 100) -> dict[str, Any]:
    """One run: *budget* fetches a day at most (the host's rate); returns fetches a day and
    freshness after *warm* days.  Times in seconds on the virtual clock.  *share*: the
    adaptive policy with the host's budget allocation (FLEET_RECRAWL_BUDGET = *share*: the
    workers' histogram of estimated rates, its price solved every 5 s of real time, here
    every *solve_every* seconds (1/100 day by default), with the host's prior: the mean of
    its pages' estimated rates), None without it (every page at the base price, no prior).
    *min_seconds*: the min interval in seconds (else *min_days*)."""
    n = model.pages
    counts: dict[int, int] = {}
    sums: dict[int, float] = {}
    price: float | None = None
    prior: float | None = None
    per_page = [0] * n
    solved_at = -1.0
    config = RecrawlConfig(mode="adaptive" if policy == "adaptive" else "fixed",
                           interval=base_days * DAY,
                           min_interval=min_days * DAY if min_seconds is None else min_seconds,
                           max_interval=max_days * DAY)
    uniform = n / budget * DAY
    slot = DAY / budget  # the host's rate: one fetch per slot at most
    states = [State() for _ in range(n)]
    seen = [-1] * n  # version last fetched
    due = [(i * slot, i) for i in range(n)]  # first visits spread like a first crawl
    heapq.heapify(due)
    end, start = days * DAY, warm * DAY
    fresh_time = 0.0
    fetches = 0
    last = [0.0] * n
    t = 0.0
    while due:
        at, i = heapq.heappop(due)
        t = max(t + slot, at)
        if t >= end:
            break
        version, _since = model.version(i, t)
        old = history_bucket(states[i].history, config.interval) \
            if share is not None and states[i].fetched > 0 else None
        if seen[i] >= 0:
            # page i was fresh from its last fetch until its next change after it
            changes = model._changes[i]
            nxt = next((c for c in changes if c > last[i]), t)
            a, b = max(last[i], start), min(nxt, t)
            if b > a:
                fresh_time += b - a
        changed = version != seen[i]
        if seen[i] >= 0 and t >= start:
            fetches += 1
            per_page[i] += 1
        observe(states[i], int(t), changed)
        seen[i], last[i] = version, t
        if policy == "uniform":
            interval = uniform
        else:
            if share is not None and t - solved_at >= solve_every:
                price, solved_at = host_price(counts, config, share * budget / DAY, sums), t
                pages = sum(counts.values())
                prior = sum(sums.values()) / pages if pages > 0 else None
            interval = next_interval(config, states[i], price=price, prior=prior)
            states[i].interval = interval
            if share is not None:
                new = history_bucket(states[i].history, config.interval)
                for side, sign in ((old, -1), (new, 1)):
                    if side is not None:
                        counts[side[0]] = counts.get(side[0], 0) + sign
                        sums[side[0]] = sums.get(side[0], 0.0) + sign * side[1]
        heapq.heappush(due, (t + interval, i))
    for i in range(n):  # close out: fresh from the last fetch until the next change or the end
        changes = model._changes[i]
        model.version(i, end)
        nxt = next((c for c in changes if c > last[i]), end)
        a, b = max(last[i], start), min(nxt, end)
        if b > a:
            fresh_time += b - a
    span = end - start
    static = [i for i in range(n) if model.rates[i] == 0]
    moving = [i for i in range(n) if model.rates[i] > 0]
    return {"policy": policy, "fetches_per_day": round(fetches / (span / DAY), 1),
            "freshness": round(fresh_time / (n * span), 4),
            "revisits_per_static_page": round(sum(per_page[i] for i in static)
                                              / max(1, len(static)), 2),
            "revisits_per_changing_page": round(sum(per_page[i] for i in moving)
                                                / max(1, len(moving)), 2)}


def run(policy: str, pages: int, static: float, seed: int, args: argparse.Namespace,
        budget: float, **kw: Any) -> dict[str, Any]:
    return simulate(policy, site(pages, static, seed), args.days, args.warm, budget, **kw)


def adaptive_at(pages: int, static: float, seed: int, args: argparse.Namespace,
                fetches: float, budget: float) -> dict[str, Any]:
    """The adaptive policy whose base interval makes it fetch about *fetches* a day."""
    lo, hi = 0.01, 60.0
    best: dict[str, Any] = {}
    for _ in range(9):
        mid = (lo * hi) ** 0.5
        r = run("adaptive", pages, static, seed, args, budget, base_days=mid)
        best = {**r, "base_interval_days": round(mid, 4)}
        if r["fetches_per_day"] > fetches:
            lo = mid
        else:
            hi = mid
    return best


def uniform_reaching(pages: int, static: float, seed: int, args: argparse.Namespace,
                     freshness: float) -> dict[str, Any]:
    """The uniform policy's fewest fetches a day that reach *freshness*."""
    lo, hi = 10.0, 50_000.0
    best: dict[str, Any] = {}
    for _ in range(10):
        mid = (lo * hi) ** 0.5
        r = run("uniform", pages, static, seed, args, mid)
        if r["freshness"] >= freshness:
            hi, best = mid, r
        else:
            lo = mid
    return best


def budget_part(args: argparse.Namespace) -> dict[str, Any]:
    """At a fixed host rate (fetches a day), the adaptive policy whose base interval asks for
    more than that rate (0.3 d: about 900 a day in the research's setting) without the
    allocation (due pages wait their turn at the rate, earliest due first: the backlog) and
    with it (FLEET_RECRAWL_BUDGET = 1: the price rises until the pages fit the rate), and the
    uniform policy at the same rate; 500 pages all changing (the research's setting) and 60 %
    never changing."""
    out: dict[str, Any] = {}
    for static in (0.0, 0.6):
        for rate in (250.0, 500.0):
            row = {}
            for name, share in (("without", None), ("with", 1.0)):
                r = run("adaptive", args.pages, static, args.seed, args, rate, base_days=0.3,
                        max_days=args.max_days, share=share)
                row[f"adaptive_{name}_allocation"] = r
            row["uniform"] = run("uniform", args.pages, static, args.seed, args, rate)
            out[f"static{round(static * 100)}_rate{round(rate)}"] = row
    return out


def first_part(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 31's first visits: 200 pages, 60 % never change, the rest log-uniform once per
    10 s .. once per 30 min; one host at 2 fetches a second; FLEET_RECRAWL_INTERVAL 30 s, min
    5 s, max 1800 s, FLEET_RECRAWL_BUDGET 0.8; the first 8 minutes, measured over the last
    280 s (seconds of virtual time), the price solved every 5 s as the workers do.  The
    adaptive policy, then the uniform policy at the
    fetches it made; mean over seeds."""
    rows: dict[str, list[dict[str, Any]]] = {"adaptive": [], "uniform": []}
    for seed in range(args.seed, args.seed + args.seeds):
        model = ChangingPages({"pages": 200, "static_share": 0.6, "seed": seed,
                               "rate_min": 1 / 1800, "rate_max": 1 / 10}, start=0.0)
        ada = simulate("adaptive", model, 480 / DAY, 200 / DAY, 2.0 * DAY,
                       base_days=30 / DAY, max_days=1800 / DAY, min_seconds=5.0, share=0.8,
                       solve_every=5.0)
        model = ChangingPages({"pages": 200, "static_share": 0.6, "seed": seed,
                               "rate_min": 1 / 1800, "rate_max": 1 / 10}, start=0.0)
        uni = simulate("uniform", model, 480 / DAY, 200 / DAY, ada["fetches_per_day"])
        rows["adaptive"].append(ada)
        rows["uniform"].append(uni)

    def mean(policy: str, key: str) -> float:
        return round(sum(r[key] for r in rows[policy]) / len(rows[policy]), 4)

    ada_f, uni_f = mean("adaptive", "freshness"), mean("uniform", "freshness")
    return {"seeds": args.seeds, "adaptive_freshness": ada_f, "uniform_freshness": uni_f,
            "freshness_ratio": round(ada_f / uni_f, 3),
            "fetches_per_second": round(mean("adaptive", "fetches_per_day") / DAY, 3),
            "static_over_changing_revisits": round(
                mean("adaptive", "revisits_per_static_page")
                / mean("adaptive", "revisits_per_changing_page"), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=150.0)
    parser.add_argument("--warm", type=float, default=50.0)
    parser.add_argument("--pages", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-days", type=float, default=30.0,
                        help="budget part: FLEET_RECRAWL_MAX_INTERVAL, days")
    parser.add_argument("--parts", default="static60,research,budget",
                        help="comma-separated: static60, research, budget, first")
    parser.add_argument("--seeds", type=int, default=10, help="first: seeds averaged")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {}
    if "first" in parts:
        out["first"] = first_part(args)
    if "budget" in parts:
        out["budget"] = budget_part(args)
    if parts <= {"budget", "first"}:
        import json

        print(json.dumps(out, indent=1, sort_keys=True))
        return
    # 60 % never change: the adaptive policy at the fixed-1-day policy's budget and at half of
    # it, against the uniform policy's fetches for the same freshness
    static = run("fixed", args.pages, 0.6, args.seed, args, 10_000.0, base_days=1.0)
    rows = [static]
    for share in (1.0, 0.5):
        target = static["fetches_per_day"] * share
        ada = adaptive_at(args.pages, 0.6, args.seed, args, target, 10_000.0)
        uni_same = run("uniform", args.pages, 0.6, args.seed, args, ada["fetches_per_day"])
        uni = uniform_reaching(args.pages, 0.6, args.seed, args, ada["freshness"])
        rows += [ada, {**uni_same, "note": "uniform at the adaptive policy's fetches"},
                 {**uni, "note": "uniform reaching the adaptive policy's freshness"}]
        out[f"static60_at_{share}"] = {
            "adaptive": ada, "uniform_same_fetches": uni_same, "uniform_same_freshness": uni,
            "fetch_ratio": round(ada["fetches_per_day"] / uni["fetches_per_day"], 3)
            if uni else None}
    # the research's setting: every page changes; StormCrawler's budget (912 a day)
    ada = adaptive_at(args.pages, 0.0, args.seed, args, 912.0, 10_000.0)
    uni = run("uniform", args.pages, 0.0, args.seed, args, ada["fetches_per_day"])
    fixed = run("fixed", args.pages, 0.0, args.seed, args, 10_000.0, base_days=1.0)
    out["research_912"] = {"adaptive": ada, "uniform_same_fetches": uni, "fixed_1d": fixed}
    import json

    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
