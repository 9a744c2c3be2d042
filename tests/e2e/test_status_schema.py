"""``scrapy fleet status --json`` of a real crawl against its documented schema
(docs/monitoring.md, "`status --json` fields"), both ways: every field the JSON holds is
documented with its type, and every documented field is in the JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support import EXAMPLE_PROJECT, kill_worker, run_scrapy, start_worker, tail, wait_until

from scrapy_fleet.monitoring.snapshot import SCHEMA
from testsite import generate_site

DOC = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"
TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
         "object": (dict,), "list": (list,)}

pytestmark = pytest.mark.slow


def documented() -> dict[str, tuple[tuple[type, ...], bool, str]]:
    """path -> (the Python types it may have, null allowed, in: snapshot/status/--hosts), from
    the table of docs/monitoring.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"### `status --json` fields (`schema` {SCHEMA})", 1)
    assert len(section) == 2, f"docs/monitoring.md has no table for schema {SCHEMA}"
    rows = {}
    for line in section[1].split("\n### ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([^`]+)`", cells[0]) if len(cells) == 5 else None
        if match is None:
            continue
        kind, nullable = cells[1], cells[1].endswith(" or null")
        name = kind.removesuffix(" or null")
        assert name in TYPES, f"{match[1]}: unknown type {kind!r}"
        assert cells[3] in ("snapshot", "status", "--hosts", "partitioned"), (match[1], cells[3])
        assert match[1] not in rows, f"{match[1]} documented twice"
        rows[match[1]] = (TYPES[name], nullable, cells[3])
    assert rows, "no field rows found"
    return rows


def check(doc: dict[str, Any], rows: dict[str, tuple[tuple[type, ...], bool, str]],
          hosts: bool, partitioned: bool = False) -> set[str]:
    """Assert that every field of *doc* is documented with its type, and every documented
    field (for a command with or without ``--hosts``, of a crawl partitioned or not) is in
    *doc*; returns the paths seen."""
    seen: set[str] = set()

    def walk(value: Any, path: str) -> None:
        assert path in rows, f"undocumented field {path!r}: {value!r}"
        types, nullable, _ = rows[path]
        seen.add(path)
        if value is None:
            assert nullable, f"{path} is null, documented as never null"
            return
        # bool is an int in Python: only a bool field may hold one
        assert isinstance(value, types) and (isinstance(value, bool) == (types == (bool,))), \
            f"{path}: {value!r} is not of the documented type"
        if isinstance(value, dict):
            for key, child in value.items():
                named = f"{path}.{key}" if path else key
                walk(child, named if named in rows or f"{path}.*" not in rows else f"{path}.*")
        elif isinstance(value, list):
            for item in value:
                assert isinstance(item, dict), f"{path}[]: {item!r}"
                for key, child in item.items():
                    walk(child, f"{path}[].{key}")

    for key, value in doc.items():
        walk(value, key)
    wanted = {"snapshot", "status", "--hosts"} if hosts else {"snapshot", "status"}
    if partitioned:
        wanted.add("partitioned")
    for path, (_, _, where) in rows.items():
        if where in wanted and "*" not in path:
            assert _present(doc, path), f"documented field {path!r} missing"
    return seen


def _present(doc: Any, path: str) -> bool:
    """Whether *path* is in *doc*: in each item of each list on the way (vacuously in an empty
    list), and not below a null."""
    head, _, rest = path.partition(".")
    name = head.removesuffix("[]")
    if not isinstance(doc, dict) or name not in doc:
        return False
    value = doc[name]
    if not rest:
        return True
    if value is None:
        return True
    if head.endswith("[]"):
        return all(_present(item, rest) for item in value)
    return _present(value, rest)


def status_json(redis_url: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "--json", *args, "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_the_documented_table_parses():
    rows = documented()
    assert rows["schema"][2] == "snapshot" and rows["queue_max"][2] == "status"
    assert rows["frontier.deferred"][0] == (int,) and "frontier.scheduled" not in rows
    assert not {"totals", "queued", "delayed", "crawl_id", "failed"} & set(rows)


def test_status_json_of_a_real_crawl_is_the_documented_schema(redis_url, site_factory,
                                                             worker_env, tmp_path):
    generate_site(tmp_path / "www", 12, 2, seed=3)
    # the pages answer slowly, one at a time: the status is read while the crawl runs
    site = site_factory(tmp_path / "www",
                        behaviour={"delays": [{"prefix": "/site/p/", "seconds": 2.0}]})
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site.url + "site/", "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    log = tmp_path / "worker.log"
    worker = start_worker(EXAMPLE_PROJECT, "docs", {
        "FLEET_REDIS_URL": redis_url, "FLEET_HOST_CONCURRENCY": 1, "FLEET_IDLE_TIMEOUT": 60,
        "FLEET_JSONL_PATH": tmp_path / "items.jsonl"}, worker_env, log)
    rows = documented()

    def mid_crawl() -> dict[str, Any] | None:
        d = status_json(redis_url, worker_env, "--hosts")
        busy = d["workers"] and d["counters"]["pages"] >= 1 and d["hosts"] and \
            d["frontier"]["leased"]
        return d if busy else None

    try:
        running = wait_until(mid_crawl, 120, "a status with a worker, a page and a host")
    except AssertionError:
        raise AssertionError(tail(log)) from None
    finally:
        kill_worker(worker)  # its leases stay: no worker alive while entries are due
    assert running["schema"] == SCHEMA == 2
    seen = check(running, rows, hosts=True)
    assert running["host_policy"] is not None and running["hosts"][0]["cap"] == 1
    assert running["control"] is None  # (control never used on this crawl)
    # crawl control (docs/control.md) in the second status: the crawl and a host paused (the
    # killed worker cannot confirm: status 1 after the short wait, the pause stored)
    from scrapy_fleet.commands import cli

    for argv in (["pause", "docs", "--reason", "schema"],
                 ["host", "block", "docs", running["hosts"][0]["host"]]):
        assert cli.main(["--redis", redis_url, *argv, "--wait", "0.1"]) in (0, 1)
    # the worker is dead at once for this command: the alerts say no worker is alive
    stopped = status_json(redis_url, worker_env, "-s", "FLEET_WORKER_DEAD_AFTER=0.01", "-s",
                          "FLEET_HEARTBEAT_INTERVAL=0.005")
    assert {"no_worker", "worker_dead"} <= {a["id"] for a in stopped["alerts"]}, stopped
    assert "host_policy" not in stopped
    assert not [h for h in stopped["hosts"] if "next_in" in h]
    seen |= check(stopped, rows, hosts=False)
    assert stopped["control"]["paused"] and stopped["control"]["why"] == "schema"
    assert [h["kind"] for h in stopped["control"]["hosts"].values()] == ["block"]
    # every documented field was met (a list item's fields in at least one item), but those
    # of a partitioned crawl (tests/e2e/test_partitions_commands.py) and the items of
    # recrawl_hosts, a list that is empty unless the crawl recrawls (their fields are
    # asserted against Redis by tests/worker/test_recrawl_view.py)
    assert {p for p, (_, _, where) in rows.items()
            if "*" not in p and where != "partitioned"
            and not p.startswith("recrawl_hosts[].")} - seen == set()
