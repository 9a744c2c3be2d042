"""The ACL rule of a partitioned crawl (issue 21) lets its roles reach the partitions' keys,
and only this crawl's: checked against a real Redis's ACLs."""

from __future__ import annotations

import os

import pytest
import redis

from scrapy_fleet import acl, lua
from scrapy_fleet.frontier.lean import lean_args
from scrapy_fleet.frontier.protocol import FrontierParams
from scrapy_fleet.keys.calls import PUSH_LEAN_CALL
from scrapy_fleet.keys.crawl import CrawlKeys


def lean_push(url: str, crawl: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = CrawlKeys("fleet", crawl).partition(2, 4)
        lua.load(client, "push_lean.lua")(
            keys=keys.call_keys(PUSH_LEAN_CALL, "op"),
            args=[lean_args([(os.urandom(12), 0, b"x", "h.test")], FrontierParams(), "")])
    finally:
        client.close()


def test_the_rule_names_the_partitions_pattern():
    rule = acl.acl_rule("worker", crawl_id="docs", partitions=True)
    assert "~fleet:{docs}:* ~fleet:{docs/*}:*" in rule
    assert "{docs/*}" not in acl.acl_rule("worker", crawl_id="docs")


def test_a_partitioned_worker_rule_reaches_its_partitions_only(acl_users):
    url = acl_users("parts-worker", acl.acl_rule("worker", crawl_id="docs", partitions=True))
    lean_push(url, "docs")
    with pytest.raises(redis.exceptions.NoPermissionError):
        lean_push(url, "docs2")
    plain = acl_users("plain-worker", acl.acl_rule("worker", crawl_id="docs"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        lean_push(plain, "docs")


@pytest.mark.parametrize("role", ["worker", "monitor", "admin"])
def test_each_command_is_allowed_once(role):
    """The admin role runs the monitor's INFO and gets the optional INFO too: listed once."""
    for partitions in (False, True):
        words = [w for w in acl.acl_rule(role, crawl_id="docs", partitions=partitions).split()
                 if w.startswith("+")]
        assert sorted(w for w in set(words) if words.count(w) > 1) == []


def test_standalone_acl_takes_the_partitions_validated_as_the_setting(capsys):
    from scrapy_fleet.commands.cli import main as fleet_main

    assert fleet_main(["acl", "docs", "--role", "worker", "--partitions", "4"]) == 0
    assert "~fleet:{docs}:* ~fleet:{docs/*}:*" in capsys.readouterr().out
    assert fleet_main(["acl", "docs", "--role", "worker"]) == 0
    assert "{docs/*}" not in capsys.readouterr().out
    for bad in ("0", "x", "1025"):
        with pytest.raises(SystemExit) as exited:
            fleet_main(["acl", "docs", "--partitions", bad])
        assert exited.value.code == 2
        assert (f"error: --partitions='{bad}' is invalid: expected an integer from 1 to 1024"
                in capsys.readouterr().err)
