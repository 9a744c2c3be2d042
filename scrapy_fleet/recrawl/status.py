"""The recrawl's figures for ``status``, the snapshot (``monitor``, ``/metrics``) and the
cockpit (docs/recrawl.md): tracked URLs, revisits scheduled, due now and overdue, when the
next is due, the outcomes of revisits (fleet-wide counters), and from a sample of the
schedule's records the estimated change rates and the freshness the model expects.

One pipeline of reads (and TIME on the crawl's node); at most :data:`SLOTS_READ` slots are
counted and :data:`SAMPLE` records decoded.
"""

from __future__ import annotations

import math
from typing import Any

from scrapy_fleet import codec, redis_client
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.schedule import STATE_META_KEY, State, estimate_rate

#: slots whose records are counted (the earliest first)
SLOTS_READ = 1000
#: records decoded for the change-rate distribution and the freshness estimate
SAMPLE = 200
#: a revisit due this long ago (seconds) is overdue
OVERDUE_AFTER = 60.0
#: change-rate classes of the distribution (upper bound of changes per day, name)
RATE_CLASSES = ((1 / 30, "monthly"), (1 / 7, "weekly"), (1.0, "daily"), (24.0, "hourly"),
                (math.inf, "faster"))
#: fleet-wide counters of revisit outcomes (monitoring/heartbeat.py) and of the schedule
#: (lua/step_revisit.lua)
OUTCOMES = ("not_modified", "unchanged", "changed", "gone")
#: what known URLs pushed with a sitemap <lastmod> came to (lua/step_revisit.lua): due (made
#: due at once), older (not newer than the last fetch), unknown (not in the schedule)
LASTMOD = ("due", "older", "unknown")


def freshness(rate: float, interval: float) -> float:
    """Cho & Garcia-Molina's expected freshness of a page changing *rate* times a second
    fetched every *interval* seconds: (1 - e^(-rate interval)) / (rate interval)."""
    x = rate * interval
    return 1.0 if x <= 0 else (1 - math.exp(-x)) / x


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def read_recrawl(client: Any, keys: CrawlKeys, now_ms: int | None = None) -> dict[str, Any]:
    """The recrawl block (docs/recrawl.md has its fields); all zeros and None for a crawl
    without a recrawl.  *now_ms*: the Redis server's clock (ms) as the caller read it (the
    snapshot: one TIME for all its figures); read here when None.

    Raises:
        redis.RedisError: when Redis cannot be read.
    """
    if now_ms is None:
        seconds, micros = client.time(**redis_client.node_of(client, keys.stats))
        now_ms = int(seconds) * 1000 + int(micros) // 1000
    with client.pipeline(transaction=False) as pipe:
        pipe.get(keys.revisit_count)
        pipe.zrange(keys.revisit_index, 0, SLOTS_READ - 1, withscores=True)
        pipe.hmget(keys.stats, *(f"revisit_{o}" for o in OUTCOMES),
                   "revisit_tracked", "revisit_dropped", "revisit_untracked", "revisit_due",
                   *(f"revisit_lastmod_{o}" for o in LASTMOD))
        tracked, slots, counts = pipe.execute()
    with client.pipeline(transaction=False) as pipe:
        for name, _ in slots:
            pipe.llen(keys.revisit_slot(name.decode()))
        sizes = pipe.execute() if slots else []
    scheduled = due = overdue = 0
    for (_, at), n in zip(slots, sizes, strict=True):
        scheduled += int(n)
        if at <= now_ms:
            due += int(n)
        if at <= now_ms - OVERDUE_AFTER * 1000:
            overdue += int(n)
    sample: list[bytes] = []
    with client.pipeline(transaction=False) as pipe:
        for name, _ in slots[:8]:
            pipe.lrange(keys.revisit_slot(name.decode()), 0, SAMPLE // 8 - 1)
        for got in (pipe.execute() if slots else []):
            sample.extend(got)
    classes = {name: 0 for _, name in RATE_CLASSES}
    fresh, n_est = 0.0, 0
    for rec in sample[:SAMPLE]:
        try:
            meta = codec.decode_dict(rec.split(b"\t", 2)[2]).get("meta") or {}
        except (IndexError, ValueError):
            continue
        state = State.from_meta(meta.get(STATE_META_KEY))
        if state is None or state.interval <= 0:
            continue
        rate = estimate_rate(state.history, float(state.interval))  # changes per second
        per_day = rate * 86400
        classes[next(name for bound, name in RATE_CLASSES if per_day <= bound)] += 1
        fresh += freshness(rate, state.interval)
        n_est += 1
    outcomes = {o: _int(v) for o, v in zip(OUTCOMES, counts[:len(OUTCOMES)], strict=True)}
    revisits = sum(outcomes.values())
    tracked_n, dropped, untracked, moved = (_int(v) for v in
                                            counts[len(OUTCOMES):len(OUTCOMES) + 4])
    lastmod = {o: _int(v) for o, v in zip(LASTMOD, counts[len(OUTCOMES) + 4:], strict=True)}
    return {
        "tracked": _int(tracked),
        "scheduled": scheduled,
        "due": due,
        "overdue": overdue,
        "next_due_in": (round(max(slots[0][1] - now_ms, 0) / 1000, 1) if slots else None),
        "outcomes": outcomes,
        "not_modified_share": (round(outcomes["not_modified"] / revisits, 3)
                               if revisits else None),
        "unchanged_share": (round(outcomes["unchanged"] / revisits, 3) if revisits else None),
        "changed_share": (round(outcomes["changed"] / revisits, 3) if revisits else None),
        # a rate needs two readings: the views' source fills it (monitoring/source.py)
        "revisits_per_min": None,
        "dropped": dropped,
        "untracked": untracked,
        "tracked_total": tracked_n,
        "revisits_queued": moved,
        "lastmod": lastmod,
        "change_rates": classes,
        "freshness_estimate": round(fresh / n_est, 3) if n_est else None,
        "sampled": n_est,
    }
