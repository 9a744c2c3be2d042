"""``PYTHONWARNINGS=error``: a fleet crawl by two workers and the ``scrapy fleet`` commands
run clean, on the newest releases (``make test``) and on the oldest the package allows
(tox.ini's ``oldest`` environment runs this file).

A warning raised under ``-W error`` is an exception where it is raised: redis-py 8.2's
``UserWarning`` about a synchronous ``Retry`` given to an asyncio client killed every worker
(``RuntimeError: Scraper slot not assigned``), and a Redis client left to the garbage
collector printed a ``ResourceWarning`` per connection as the worker exited.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import (
    EXAMPLE_PROJECT,
    read_items,
    run_scrapy,
    setting_args,
    start_worker,
    tail,
    wait_all,
)

pytestmark = pytest.mark.slow

#: what Python prints for a warning turned into an error, or one ignored in a __del__
_WARNED = re.compile(r"\w*Warning\b|Traceback|Exception ignored")


def _warned(text: str) -> list[str]:
    return [line for line in text.splitlines() if _WARNED.search(line)]


@pytest.fixture
def strict_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "PYTHONWARNINGS": "error"}


def _command(args: list[str], redis_url: str, env: dict[str, str]) -> str:
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", *args,
                                          *setting_args({"FLEET_REDIS_URL": redis_url})], env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"fleet {' '.join(args)} exited {result.returncode}:\n" \
        + output
    assert _warned(output) == [], f"fleet {' '.join(args)}:\n{output}"
    return result.stdout


def test_two_workers_and_the_commands_run_clean_under_warnings_as_errors(
        redis_url, site_server, strict_env, tmp_path: Path):
    _command(["push", "docs", site_server.start_url], redis_url, strict_env)
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    # robots.txt and a fleet-wide host rate: the politeness and robots.txt middlewares each
    # open a Redis client of their own
    procs = [start_worker(EXAMPLE_PROJECT, "docs", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": out,
        "ROBOTSTXT_OBEY": True, "FLEET_HOST_RATE": 500}, strict_env, log)
        for out, log in zip(outs, logs, strict=True)]
    codes = wait_all(procs, 180)
    for code, log in zip(codes, logs, strict=True):
        text = log.read_text(encoding="utf-8", errors="replace")
        assert code == 0, tail(log)
        assert "Spider closed (finished)" in text, tail(log)
        assert _warned(text) == [], tail(log, 8000)
    urls = [item["url"] for item in read_items(outs)]
    assert sorted(urls) == sorted(site_server.expected_urls)  # each page once
    for args in (["status", "docs", "--hosts"], ["status", "docs", "--json"],
                 ["failed", "docs"], ["dead", "docs"], ["top", "docs", "--once"],
                 ["acl", "docs"], ["settings"], ["shards", "docs"]):
        _command(args, redis_url, strict_env)
    assert "purged" in _command(["purge", "docs", "--yes"], redis_url, strict_env)
