"""Adaptive politeness (issue 35): one controller per host, fleet-wide, in Redis
(lua/adaptive.lua, lua/step_adapt.lua), driven by the download reports of the frontier call."""

from __future__ import annotations

import itertools

import redis
from support import host_entry as entry
from support import server_ms, wait_server_past

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

CLEAN, OVERLOAD, NEITHER = 0, 1, 2
CEILING = 20.0  # requests/s: FLEET_HOST_RATE


def _admin(redis_url: str, window: float = 0.05, g: float = 2.0, crawl: str = "adapt"):
    params = FrontierParams(host_interval=1 / CEILING, host_interval_is_rate=True,
                            host_concurrency=0, adaptive=(0.5, 0.05, window, g))
    return FrontierAdmin(redis_url, crawl, params=params)


def _state(redis_url: str, host: str = "a.test", crawl: str = "adapt") -> dict[str, object]:
    raw = redis.Redis.from_url(redis_url).hget(CrawlKeys("fleet", crawl).adaptive, host)
    assert raw is not None, "no controller state"
    f = raw.decode().split("|")
    return {"rate": float(f[0]), "short": float(f[1]), "min": float(f[2]), "dt": int(f[4]),
            "why": f[6], "ct": int(f[7]), "cap": float(f[8]), "cc": int(f[9]),
            "decreases": int(f[10])}


def _lease(admin: FrontierAdmin, n: int) -> list:
    """*n* leases of a.test (one per GCRA turn, by the server's clock)."""
    got: list = []
    while len(got) < n:
        reply = admin.call(CallBatch(take=n - len(got)), worker="w")
        got += reply.leased
        if len(got) < n and reply.next_ready:
            wait_server_past(admin.client, server_ms(admin.client) + reply.next_ready * 1000)
    return got


def _report(admin: FrontierAdmin, leases: list, outcome: int, latency: int = -1,
            why: str = "", exit_id: str = "") -> None:
    admin.call(CallBatch(downloaded=[(e.entry_id, e.token, outcome, latency, why, exit_id)
                                     for e in leases]), worker="w")


def test_overload_answers_in_flight_before_a_decrease_decrease_once(redis_url):
    admin = _admin(redis_url)
    admin.push([entry(f"http://a.test/{i}") for i in range(8)])
    first = _lease(admin, 4)  # four requests in flight when the site starts to refuse
    _report(admin, first[:1], OVERLOAD, why="429")
    assert _state(redis_url)["rate"] == CEILING * 0.5
    assert _state(redis_url)["why"] == "429" and _state(redis_url)["cap"] == CEILING
    _report(admin, first[1:], OVERLOAD, why="429")  # the same overload event
    state = _state(redis_url)
    assert state["rate"] == CEILING * 0.5 and state["decreases"] == 1
    raw = redis.Redis.from_url(redis_url).hgetall(CrawlKeys("fleet", "adapt").stats)
    stats = {k.decode(): int(v) for k, v in raw.items()}
    assert stats.get("adaptive_decreases") == 1 and stats.get("adaptive_inflight") == 3
    # a request leased after the decrease that is refused again: a new event
    later = _lease(admin, 1)
    _report(admin, later, OVERLOAD, why="503")
    state = _state(redis_url)
    assert state["rate"] == CEILING * 0.25 and state["decreases"] == 2 and state["why"] == "503"


def test_neither_bans_nor_other_errors_lower_the_rate(redis_url):
    admin = _admin(redis_url)
    admin.push([entry(f"http://a.test/{i}") for i in range(2)])
    _report(admin, _lease(admin, 2), NEITHER)
    assert not redis.Redis.from_url(redis_url).hexists(CrawlKeys("fleet", "adapt").adaptive,
                                                       "a.test")


def test_the_learned_rate_spaces_the_leases(redis_url):
    """The host's interval becomes max(1 / learned rate, configured interval)."""
    admin = _admin(redis_url, window=60.0)
    admin.push([entry(f"http://a.test/{i}") for i in range(6)])
    _report(admin, _lease(admin, 1), OVERLOAD, why="429")
    _report(admin, _lease(admin, 1), OVERLOAD, why="429")
    assert _state(redis_url)["rate"] == CEILING / 4  # 5 requests/s: 200 ms between two
    tat = CrawlKeys("fleet", "adapt").tat
    client = redis.Redis.from_url(redis_url)
    turns = []
    for _ in range(3):
        _lease(admin, 1)
        turns.append(int(client.hget(tat, "a.test")))
    # each lease moves the host's next turn (GCRA TAT, server ms) one interval of the learned
    # rate later: 200 ms, not the configured 50 (later still if the lease came late)
    gaps = [b - a for a, b in itertools.pairwise(turns)]
    assert all(g >= 200 for g in gaps) and min(gaps) < 400, gaps


def _cubic_rate(before: float, state: dict[str, object], window_ms: float) -> float:
    """The rate after a clean window by lua/adaptive.lua's rule (RFC 9438's W(t), K = 15
    windows, twice as fast past K), at the server time of the increase (the state's
    clean-window start)."""
    cap, dt, ct = float(state["cap"]), float(state["dt"]), float(state["ct"])
    k = 15 * window_ms
    x = (ct - dt - k) / k
    curve = cap + cap * 0.5 * (2 * x if x > 0 else x) ** 3
    return min(CEILING, before + 0.05 * CEILING, max(before, curve))


def test_clean_windows_follow_the_cubic_curve_flat_near_the_learned_capacity(redis_url):
    admin = _admin(redis_url, window=0.2, g=0)
    admin.push([entry(f"http://a.test/{i}") for i in range(400)])
    _report(admin, _lease(admin, 1), OVERLOAD, why="429")
    assert _state(redis_url)["rate"] == 10.0
    wait_server_past(admin.client, server_ms(admin.client) + 210)
    _report(admin, _lease(admin, 1), CLEAN, latency=20)
    assert _state(redis_url)["rate"] == 11.0  # + 5 % of the ceiling in the first window
    while _state(redis_url)["rate"] < 14.0:
        wait_server_past(admin.client, server_ms(admin.client) + 210)
        _report(admin, _lease(admin, 1), CLEAN, latency=20)
    _report(admin, _lease(admin, 1), OVERLOAD, why="429")  # refused again, below the ceiling
    cap = _state(redis_url)["cap"]
    assert 14.0 <= cap < CEILING and _state(redis_url)["rate"] == cap / 2
    rates, steps_near_cap = [cap / 2], []
    while rates[-1] < CEILING and len(rates) < 200:
        wait_server_past(admin.client, server_ms(admin.client) + 210)
        _report(admin, _lease(admin, 1), CLEAN, latency=20)
        state = _state(redis_url)
        # every increase is the cubic curve's value at its time, at most a full step up
        assert abs(state["rate"] - _cubic_rate(rates[-1], state, 200)) < 1e-4 * CEILING
        if abs(rates[-1] - cap) <= 0.05 * cap:
            steps_near_cap.append(state["rate"] - rates[-1])
        rates.append(state["rate"])
    assert rates[-1] == CEILING and max(rates) == CEILING  # never above it
    assert rates == sorted(rates)  # never down without an overload
    # within 5 % of the learned capacity the steps are a fraction of the full step (1/s)
    assert steps_near_cap and min(steps_near_cap) < 0.25, (steps_near_cap, rates)


def test_rising_latency_lowers_rate_and_concurrency_in_proportion(redis_url):
    admin = _admin(redis_url, window=60.0, g=2.0)
    admin.push([entry(f"http://a.test/{i}") for i in range(40)])
    _report(admin, _lease(admin, 1), CLEAN, latency=50)  # the long minimum: 50 ms
    assert _state(redis_url)["rate"] == CEILING and _state(redis_url)["min"] == 50
    for _ in range(10):
        _report(admin, _lease(admin, 1), CLEAN, latency=400)
        if _state(redis_url)["decreases"]:
            break
    state = _state(redis_url)
    assert state["why"] == "latency" and state["decreases"] == 1
    # the rate times 2 x 50 / (short average) and concurrency of the target in flight
    assert 0 < state["rate"] < CEILING * 100 / 101
    assert state["short"] > 100
    assert state["rate"] == CEILING * 100 / state["short"] or \
        abs(state["rate"] - CEILING * 100 / state["short"]) < 0.01
    assert state["cc"] == max(1, -(-state["rate"] * 100 // 1000))


def test_a_call_without_the_controller_changes_nothing(redis_url):
    params = FrontierParams(host_interval=1 / CEILING, host_interval_is_rate=True)
    admin = FrontierAdmin(redis_url, "plain", params=params)
    admin.push([entry("http://a.test/0")])
    leased = _lease(admin, 1)
    _report(admin, leased, OVERLOAD, why="429")
    assert not redis.Redis.from_url(redis_url).exists(CrawlKeys("fleet", "plain").adaptive)


def test_status_hosts_shows_rate_ceiling_capacity_and_last_decrease(redis_url):
    admin = _admin(redis_url)
    admin.push([entry(f"http://a.test/{i}") for i in range(3)])
    _report(admin, _lease(admin, 1), OVERLOAD, why="503")
    # the per-host defaults every worker writes at start (frontier/scheduler.py)
    admin.client.hset(admin.keys.config, mapping={
        "host_interval_ms": 50, "host_interval_is_rate": 1, "host_burst": 1,
        "host_concurrency": 0})
    row = next(r for r in admin.hosts() if r["host"] == "a.test")
    assert (row["learned_rate"], row["ceiling"], row["capacity"], row["last_decrease"],
            row["decreases"]) == (10.0, CEILING, CEILING, "503", 1)


def test_the_latency_cap_is_lifted_once_latency_is_back(redis_url):
    admin = _admin(redis_url, window=0.05, g=2.0)
    admin.push([entry(f"http://a.test/{i}") for i in range(60)])
    _report(admin, _lease(admin, 1), CLEAN, latency=50)
    while not _state(redis_url)["decreases"]:
        _report(admin, _lease(admin, 1), CLEAN, latency=400)
    assert _state(redis_url)["cc"] >= 1
    for _ in range(30):  # answers as fast as before: the short average comes back down
        wait_server_past(admin.client, server_ms(admin.client) + 60)
        _report(admin, _lease(admin, 1), CLEAN, latency=50)
        if _state(redis_url)["cc"] == 0:
            break
    state = _state(redis_url)
    assert state["cc"] == 0 and state["short"] <= 100 and state["decreases"] >= 1


def test_a_host_without_a_configured_rate_has_no_controller(redis_url):
    """No FLEET_HOST_RATE or delay: no ceiling to adapt under, so its reports write no state
    (its overload answers hold it: politeness/middlewares.py).  Adapting such hosts under what
    their concurrency allows (tried in session 14) sent hosts with a fast 404 beside slower
    pages, or with a 503 now and then, to the slowest rate for good: failover, SIGKILL and
    session crawls stalled."""
    params = FrontierParams(host_interval=0, host_concurrency=8,
                            adaptive=(0.5, 0.05, 60.0, 2.0))
    admin = FrontierAdmin(redis_url, "free", params=params)
    admin.push([entry(f"http://a.test/{i}") for i in range(8)])
    _report(admin, _lease(admin, 1), CLEAN, latency=2)
    for _ in range(3):
        _report(admin, _lease(admin, 1), CLEAN, latency=300)
    _report(admin, _lease(admin, 1), OVERLOAD, why="503")
    client = redis.Redis.from_url(redis_url)
    assert client.hgetall(CrawlKeys("fleet", "free").adaptive) == {}
    assert client.hget(CrawlKeys("fleet", "free").tat, "a.test") is None  # never paced


def test_a_slow_proxy_exit_is_not_taken_for_a_slow_host(redis_url):
    """Latency is kept per host and exit: answers through an exit that is always slow (600
    ms) beside a fast one (20 ms) do not lower the host's rate; the same answers without
    exits (one latency per host) do."""
    for crawl, exits in (("exits", ("fast", "slow")), ("direct", ("", ""))):
        admin = _admin(redis_url, window=60.0, g=2.0, crawl=crawl)
        admin.push([entry(f"http://a.test/{i}") for i in range(24)])
        for _ in range(8):
            _report(admin, _lease(admin, 1), CLEAN, latency=20, exit_id=exits[0])
            _report(admin, _lease(admin, 1), CLEAN, latency=600, exit_id=exits[1])
            if _state(redis_url, crawl=crawl)["decreases"]:
                break  # (a lowered rate spaces the next leases: no need to wait for them)
        state = _state(redis_url, crawl=crawl)
        if crawl == "exits":
            assert state["decreases"] == 0 and state["rate"] == CEILING, state
            raw = redis.Redis.from_url(redis_url).hget(CrawlKeys("fleet", crawl).adaptive,
                                                        "a.test\tslow")
            short, minimum = (float(x) for x in raw.decode().split("|")[:2])
            assert minimum == 600 and short == 600  # the slow exit's own latency
        else:
            assert state["decreases"] >= 1 and state["why"] == "latency", state
