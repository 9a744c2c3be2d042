"""Crawl groups' settings and key names (issue 34, docs/control.md "Crawl groups"):
FLEET_CRAWL_GROUP and FLEET_CRAWL_WEIGHT checked with one clear error each, and the
politeness keys (only they) under the group's tag."""

from __future__ import annotations

import pytest

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.protocol import FrontierParams, call_constants
from scrapy_fleet.keys.calls import POLITENESS_CALL
from scrapy_fleet.keys.crawl import CrawlKeys


def test_group_and_weight_reach_the_keys_and_the_calls_constants():
    config = FleetConfig.from_settings({"FLEET_CRAWL_GROUP": "shop", "FLEET_CRAWL_WEIGHT": 3})
    assert (config.group.name, config.group.weight) == ("shop", 3.0)
    keys = config.crawl_keys("books")
    assert keys == CrawlKeys("fleet", "books", group="shop")
    assert config.frontier_params().group_weight == 3.0
    cst = call_constants(config.frontier_params(), keys.crawl_id)
    assert (cst["gi"], cst["gw"]) == ("books", 3.0)
    assert "gi" not in call_constants(FrontierParams())  # no group: nothing sent


def test_without_a_group_the_keys_are_the_crawls_own():
    config = FleetConfig.from_settings({})
    assert config.group.name == "" and config.group.weight == 1.0
    keys = config.crawl_keys("books")
    assert keys.tat == "fleet:{books}:tat"
    assert keys.politeness_base == keys.base


def test_only_the_politeness_keys_move_to_the_group():
    keys = CrawlKeys("fleet", "books", group="shop")
    shared = set(POLITENESS_CALL) - {"ready"}  # ready: the crawl's own hosts with work
    for name in shared:
        assert getattr(keys, name) == f"fleet:{{group:shop}}:{name}"
    assert keys.group_share("h") == "fleet:{group:shop}:gs:h"
    for name in ("ready", "hostq", "queue_index", "leases", "budget", "budgeth", "ctl",
                 "ctlhosts", "ctlhostconf", "wlive", "stats"):
        assert getattr(keys, name).startswith("fleet:{books}:"), name
    assert keys.partition(0, 1) == keys  # (P = 1: the same keys, group kept)


@pytest.mark.parametrize(("settings", "message"), [
    ({"FLEET_CRAWL_GROUP": "a b"}, "FLEET_CRAWL_GROUP='a b' is invalid"),
    ({"FLEET_CRAWL_GROUP": "g", "FLEET_CRAWL_WEIGHT": 0}, "FLEET_CRAWL_WEIGHT=0 is invalid"),
    ({"FLEET_CRAWL_WEIGHT": "x"}, "FLEET_CRAWL_WEIGHT='x' is invalid"),
    ({"FLEET_CRAWL_GROUP": "g", "FLEET_PARTITIONS": 2},
     "FLEET_CRAWL_GROUP='g' cannot be used with FLEET_PARTITIONS > 1"),
    ({"FLEET_CRAWL_GROUP": "g", "FLEET_REDIS_URL": "redis+cluster://127.0.0.1:7000"},
     "FLEET_CRAWL_GROUP='g' cannot be used on Redis Cluster"),
])
def test_bad_group_settings_are_refused_with_one_line(settings, message):
    with pytest.raises(FleetConfigError) as info:
        FleetConfig.from_settings(settings)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)
