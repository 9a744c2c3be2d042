"""The budget settings (issue 34, budget_settings.py): validation, Scrapy's CloseSpider
settings carried over to the fleet's budgets, and the partitions' limit."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_fleet.addon import Addon
from scrapy_fleet.budget_settings import carry_closespider
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.routing import partition_params


def test_budgets_reach_the_frontier_call():
    config = FleetConfig.from_settings(Settings({
        "FLEET_BUDGET_PAGES": "60", "FLEET_BUDGET_SECONDS": "1.5",
        "FLEET_HOST_BUDGET_PAGES": 7,
        "FLEET_HOST_OVERRIDES": '{"A.example": {"budget_pages": 3, "rate": 2}}'}))
    assert (config.budget.pages, config.budget.seconds, config.budget.host_pages,
            config.budget.hosts) == (60, 1.5, 7, {"a.example": 3})
    params = config.frontier_params()
    assert (params.budget_pages, params.budget_seconds, params.host_budget_pages) == (60, 1.5, 7)


def test_no_budget_by_default():
    config = FleetConfig.from_settings(Settings())
    assert not config.budget.any
    assert config.frontier_params().budget_pages == 0


@pytest.mark.parametrize("name,value", [
    ("FLEET_BUDGET_PAGES", 0), ("FLEET_BUDGET_PAGES", "x"), ("FLEET_BUDGET_PAGES", 2.5),
    ("FLEET_BUDGET_SECONDS", -1), ("FLEET_HOST_BUDGET_PAGES", "0")])
def test_a_budget_that_is_not_positive_is_refused_in_one_line(name, value):
    with pytest.raises(FleetConfigError, match=f"^{name}=.* is invalid: expected .* > 0"):
        FleetConfig.from_settings(Settings({name: value}))


def test_a_host_override_budget_that_is_not_positive_is_refused():
    with pytest.raises(FleetConfigError,
                       match=r"FLEET_HOST_OVERRIDES\['a.example'\]\['budget_pages'\]=0"):
        FleetConfig.from_settings(Settings({
            "FLEET_HOST_OVERRIDES": {"a.example": {"budget_pages": 0}}}))


def test_a_time_budget_with_partitions_is_refused_page_and_host_budgets_are_not():
    with pytest.raises(FleetConfigError, match=r"FLEET_BUDGET_SECONDS=5\.0 is invalid: expected "
                                               "None with FLEET_PARTITIONS > 1"):
        FleetConfig.from_settings(Settings({"FLEET_BUDGET_SECONDS": 5, "FLEET_PARTITIONS": 3}))
    config = FleetConfig.from_settings(Settings({"FLEET_HOST_BUDGET_PAGES": 5,
                                                 "FLEET_BUDGET_PAGES": 7,
                                                 "FLEET_PARTITIONS": 3}))
    assert (config.budget.host_pages, config.budget.pages) == (5, 7)
    # each partition leases against its chunk of the page budget (frontier/budgetchunks.py)
    params = partition_params(config.frontier_params(), 3)
    assert (params.budget_pages, params.budget_chunked) == (0, True)
    assert partition_params(config.frontier_params(), 1).budget_chunked is False


def test_closespider_pagecount_and_timeout_become_the_fleet_s_budgets(caplog):
    settings = Settings({"CLOSESPIDER_PAGECOUNT": 60, "CLOSESPIDER_TIMEOUT": 30,
                         "CLOSESPIDER_ITEMCOUNT": 5})
    with caplog.at_level("INFO"):
        lines = carry_closespider(settings)
    assert (settings.getint("FLEET_BUDGET_PAGES"), settings.getfloat("FLEET_BUDGET_SECONDS")) \
        == (60, 30.0)
    # Scrapy's CloseSpider extension no longer closes one worker at its own count
    assert settings.getint("FLEET_BUDGET_ITEMS") == 5
    assert (settings.getint("CLOSESPIDER_PAGECOUNT"), settings.getint("CLOSESPIDER_TIMEOUT"),
            settings.getint("CLOSESPIDER_ITEMCOUNT")) == (0, 0, 0)
    assert lines[0] == ("CLOSESPIDER_PAGECOUNT=60 is the crawl's budget, fleet-wide "
                        "(FLEET_BUDGET_PAGES=60): the fleet stops at that many in all, not "
                        "each worker")
    assert lines[0] in caplog.text


def test_a_fleet_budget_given_wins_over_closespider():
    settings = Settings({"CLOSESPIDER_PAGECOUNT": 60, "FLEET_BUDGET_PAGES": 100})
    carry_closespider(settings)
    assert (settings.getint("FLEET_BUDGET_PAGES"), settings.getint("CLOSESPIDER_PAGECOUNT")) \
        == (100, 0)


def test_the_addon_carries_closespider_over():
    settings = Settings({"CLOSESPIDER_PAGECOUNT": 60})
    Addon().update_settings(settings)
    assert (settings.getint("FLEET_BUDGET_PAGES"), settings.getint("CLOSESPIDER_PAGECOUNT")) \
        == (60, 0)
    assert FleetConfig.from_settings(settings).budget.pages == 60


def test_with_partitions_only_closespider_pagecount_is_the_fleet_s():
    """At P > 1 the page budget is the crawl's (partitions reserve it in chunks); the time
    and item counts stay each worker's (and are warned of), never a start-up error."""
    settings = Settings({"CLOSESPIDER_PAGECOUNT": 9, "CLOSESPIDER_ITEMCOUNT": 4,
                         "FLEET_PARTITIONS": 2})
    assert len(carry_closespider(settings)) == 1
    assert (settings.getint("CLOSESPIDER_PAGECOUNT"), settings.getint("FLEET_BUDGET_PAGES"),
            settings.getint("CLOSESPIDER_ITEMCOUNT")) == (0, 9, 4)
    assert settings.get("FLEET_BUDGET_ITEMS") is None
