"""The merged snapshot of a partitioned crawl (monitoring/merge.py, issue 21): sums, the
latest row per worker, the busiest hosts of all, series summed step by step."""

from __future__ import annotations

from typing import Any

from scrapy_fleet.monitoring.merge import merge, merge_samples, skew
from scrapy_fleet.monitoring.series import Sample, points_of


def snap(due: int, pages: int, workers: list[dict[str, Any]], hosts: list[dict[str, Any]],
         idle: float | None, ppm: float | None) -> dict[str, Any]:
    return {
        "schema": 2, "crawl": "c", "at": 100.0 + due,
        "frontier": {"due": due, "leased": 1, "depth": due + 1, "seen": due * 2,
                     "deferred": 0, "parked": 0, "dead": 0},
        "counters": {"pages": pages, "requests": {"acked": pages}, "responses": {"2xx": pages}},
        "rates": {"pages_per_min": ppm, "items_per_min": ppm, "window_s": 60.0,
                  "block_rate": None},
        "eta_seconds": 30.0 if due else 0.0, "runnable_now": due, "workers": workers,
        "hosts": hosts, "hosts_total": len(hosts), "hosts_sampled": False, "hosts_ready": 1,
        "alerts": [{"id": "x", "where": "c", "what": "w", "severity": "warning",
                    "since": None, "next": ""}],
        "failed_by": {"http/500": 1}, "redis": {"used_memory": 10, "maxmemory": 0},
        "started_at": 50.0 + due, "last_ack_at": 90.0 + due, "last_worker_at": None,
        "idle_seconds": idle, "start_requests": {"state": None, "seeded_by": None},
        "recrawl": recrawl_block(0, 0, None, (0, 0, 0, 0), 0, None),
    }


def recrawl_block(tracked, due, next_due, outcomes, sampled, fresh):
    return {"tracked": tracked, "scheduled": tracked, "due": due, "overdue": 0,
            "next_due_in": next_due, "dropped": 1, "untracked": 0,
            "tracked_total": tracked + 1, "revisits_queued": 2, "sampled": sampled,
            "outcomes": dict(zip(("not_modified", "unchanged", "changed", "gone"),
                                 outcomes, strict=True)),
            "change_rates": {"monthly": sampled, "weekly": 0, "daily": 0, "hourly": 0,
                             "faster": 0},
            "lastmod": {"due": due, "older": 1, "unknown": 0},
            "not_modified_share": None, "unchanged_share": None,
            "freshness_estimate": fresh}


def worker(wid: str, seen: float, pages: int) -> dict[str, Any]:
    return {"id": wid, "last_seen": seen, "pages": pages, "health": "alive"}


def row(p: int, queued: int) -> dict[str, Any]:
    return {"partition": p, "tag": f"t{p}", "slot": p, "node": "", "queued": queued,
            "leased": 1, "deferred": 0, "parked": 0, "dead": 0, "seen": 0, "bound": None,
            "idle_seconds": None, "acked": 0}


def test_partitions_are_summed_and_each_worker_appears_once_with_its_latest_row():
    a = snap(3, 10, [worker("w1", 5.0, 7), worker("w2", 9.0, 4)],
             [{"host": "a", "queued": 3}], None, 12.0)
    b = snap(9, 5, [worker("w1", 8.0, 9)], [{"host": "b", "queued": 9}], 4.0, None)
    out = merge([a, b], [row(0, 3), row(1, 9)], hosts=1)
    assert out["frontier"] == {"due": 12, "leased": 2, "depth": 14, "seen": 24,
                               "deferred": 0, "parked": 0, "dead": 0}
    assert out["counters"] == {"pages": 15, "requests": {"acked": 15},
                               "responses": {"2xx": 15}}
    assert [(w["id"], w["pages"]) for w in out["workers"]] == [("w1", 9), ("w2", 4)]
    assert out["workers_alive"] == 2
    assert out["hosts"] == [{"host": "b", "queued": 9}] and out["hosts_total"] == 2
    assert out["rates"]["pages_per_min"] == 12.0 and out["runnable_now"] == 12
    assert out["idle_seconds"] is None  # partition 0 is busy
    assert out["started_at"] == 53.0 and out["last_ack_at"] == 99.0
    assert out["failed_by"] == {"http/500": 2} and len(out["alerts"]) == 1
    assert out["redis"] == {"used_memory": 10, "maxmemory": 0}  # one server, counted once
    assert out["partitions"] == 2 and out["skew"] == 1.5
    assert [r["queued"] for r in out["per_partition"]] == [3, 9]


def sample(t: float, due: int, pages: int, bans: int = 0, alive: int = 1) -> Sample:
    return Sample(t=t, due=due, deferred=0, leased=0, parked=0, dead=0, pages=pages,
                  items=0, bans=bans, workers_alive=alive)


def test_series_are_summed_step_by_step_and_skew_of_empty_partitions():
    """Partition 0 sampled at steps 0 and 2, partition 1 at steps 0, 1 and 3: a step one of
    them has no sample of counts its latest earlier one (a partition is sampled only when
    called); a step neither has stays out (None in the series); ``workers_alive`` the most
    of any (a worker calls several partitions)."""
    merged = merge_samples([[sample(1.0, 1, 10), sample(21.0, 3, 30, alive=2)],
                            [sample(4.0, 2, 5), sample(12.0, 4, 7),
                             sample(35.0, 6, 9)]], 10.0)
    assert [(m.t, m.due, m.pages, m.workers_alive) for m in merged] == [
        (1.0, 3, 15, 1), (12.0, 5, 17, 1), (21.0, 7, 37, 2), (35.0, 9, 39, 2)]
    assert [v for _, v in points_of(merged, "depth_due")] == [3.0, 5.0, 7.0, 9.0]
    assert skew([0, 0]) == 0.0 and skew([2, 2]) == 1.0


def test_a_block_rate_series_is_the_summed_counters_ratio():
    """Two partitions, each 1 ban in 10 pages over one step: the crawl's block rate is 0.1
    (summed per partition, the series read 0.2)."""
    merged = merge_samples([[sample(0.0, 0, 0), sample(10.0, 0, 10, bans=1)],
                            [sample(1.0, 0, 0), sample(11.0, 0, 10, bans=1)]], 10.0)
    assert points_of(merged, "block_rate") == [(0.0, None), (10.0, 0.1)]


def test_the_partitions_recrawl_blocks_merge_into_one():
    from scrapy_fleet.monitoring.merge import merge_recrawl

    merged = merge_recrawl([recrawl_block(10, 2, 30.0, (3, 1, 0, 0), 10, 0.9),
                            recrawl_block(5, 0, None, (1, 0, 4, 0), 30, 0.5),
                            recrawl_block(0, 0, None, (0, 0, 0, 0), 0, None)])
    assert (merged["tracked"], merged["due"], merged["dropped"], merged["sampled"]) == (
        15, 2, 3, 40)
    assert merged["next_due_in"] == 30.0
    assert merged["outcomes"] == {"not_modified": 4, "unchanged": 1, "changed": 4, "gone": 0}
    assert (merged["not_modified_share"], merged["unchanged_share"]) == (0.444, 0.111)
    assert merged["change_rates"]["monthly"] == 40
    assert merged["lastmod"] == {"due": 2, "older": 3, "unknown": 0}  # (sitemap <lastmod>)
    assert merged["freshness_estimate"] == 0.6  # (0.9 * 10 + 0.5 * 30) / 40


def test_a_hosts_counters_are_summed_over_the_partitions_its_workers_recorded_them_in():
    # workers record a host's pages/bans with their call to their home partition, wherever
    # the host's entries are: its row sums every partition's counters
    from scrapy_fleet.monitoring.merge import host_totals

    rows = [{"host": "a", "queued": 5, "pages": 4, "bans": 1, "block_rate": 0.25,
             "first_ban": 9.0},
            {"host": "b", "queued": 2, "pages": 0, "bans": 0, "block_rate": None,
             "first_ban": None}]
    per_part = [[[b"4", b"1", b"9000"], [None, None, None]],
                [[b"6", None, None], [None, None, None]],
                [[b"10", b"3", b"7000"], [b"2", None, None]]]
    out = host_totals(rows, per_part)
    assert out == [{"host": "a", "queued": 5, "pages": 20, "bans": 4, "block_rate": 0.2,
                    "first_ban": 7.0},
                   {"host": "b", "queued": 2, "pages": 2, "bans": 0, "block_rate": 0.0,
                    "first_ban": None}]


def full_row(wid: str, seen: float, health: str, *, state: str = "fetching",
             pages: int = 66, leases: int = 2, host: str = "vm",
             pid: int = 12685) -> dict[str, Any]:
    return {"id": wid, "last_seen": seen, "health": health, "state": state, "pages": pages,
            "leases": leases, "host": host, "pid": pid, "last_ack": None}


def test_a_workers_row_is_its_home_record_seen_at_its_latest_call():
    """The fresh-user trial: with P = 8 and two workers, ``status`` showed each worker
    ``unknown`` with 0 pages (the newer row of a partition its calls only mark seen won), and
    a killed worker twice as ``worker_dead`` with two hosts and pids.  The merged row takes
    the state and counts of the home's record and the latest time seen; one alert."""
    home = full_row("w1", 10.0, "alive")
    elsewhere = full_row("w1", 12.0, "alive", state="unknown", pages=0, leases=0,
                         host="w1", pid=0)
    dead_home = full_row("w2", 1.0, "dead", pages=22)
    dead_elsewhere = full_row("w2", 2.0, "dead", state="unknown", pages=0, leases=0,
                              host="w2", pid=0)
    a = snap(3, 10, [home, dead_elsewhere], [], None, 12.0)
    b = snap(9, 5, [elsewhere, dead_home], [], None, 3.0)
    for s in (a, b):  # each partition's own alert of the dead worker
        s["alerts"] = [{"id": "worker_dead", "where": "worker w2, crawl c",
                        "what": f"worker w2 ... pid {s['workers'][1]['pid']}",
                        "severity": "warning", "since": None, "next": ""}]
    out = merge([a, b], [row(0, 3), row(1, 9)])
    rows = {w["id"]: w for w in out["workers"]}
    assert (rows["w1"]["state"], rows["w1"]["pages"], rows["w1"]["last_seen"]) == (
        "fetching", 66, 12.0)
    assert (rows["w2"]["state"], rows["w2"]["pages"], rows["w2"]["health"]) == (
        "fetching", 22, "dead")
    assert out["workers_alive"] == 1
    dead = [a for a in out["alerts"] if a["id"] == "worker_dead"]
    assert len(dead) == 1 and "(pid 12685)" in dead[0]["next"] and "vm" in dead[0]["next"]
