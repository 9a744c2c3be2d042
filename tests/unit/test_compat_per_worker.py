"""scrapy_fleet/compat/per_worker.py: the Scrapy settings that act per worker get one warning
line each, only when they are in use (docs/scrapy-compat.md)."""

from __future__ import annotations

import pytest
from scrapy import signals
from scrapy.settings import Settings
from scrapy.signalmanager import SignalManager

from scrapy_fleet.compat.per_worker import CLOSESPIDER, idle_warning, per_worker_settings


def test_scrapy_defaults_warn_about_nothing():
    assert per_worker_settings(Settings()) == []


@pytest.mark.parametrize("name", CLOSESPIDER)
def test_each_closespider_setting_in_use_is_one_line(name):
    instead = {"CLOSESPIDER_ITEMCOUNT": "FLEET_BUDGET_ITEMS",
               "CLOSESPIDER_ERRORCOUNT": "FLEET_BUDGET_PAGES (pages, not errors)",
               "CLOSESPIDER_TIMEOUT": "FLEET_BUDGET_SECONDS",
               "CLOSESPIDER_TIMEOUT_NO_ITEM": "FLEET_BUDGET_SECONDS"}.get(name,
                                                                         "FLEET_BUDGET_PAGES")
    assert per_worker_settings(Settings({name: 60})) == [
        f"{name}=60 is counted by each worker, not by the fleet: N workers go on until each "
        f"has reached it; the fleet-wide budget is {instead} (docs/control.md)"]


@pytest.mark.parametrize("settings,start", [
    ({"AUTOTHROTTLE_ENABLED": "True"}, "AUTOTHROTTLE_ENABLED: each worker runs its own"),
    ({"DOWNLOAD_SLOTS": '{"b.example": {"delay": 2}, "a.example": {}}'},
     "DOWNLOAD_SLOTS (a.example, b.example) sets a concurrency and delay in each worker"),
    ({"CONCURRENT_REQUESTS_PER_IP": 4},
     "CONCURRENT_REQUESTS_PER_IP=4 caps each worker's requests per IP"),
    ({"JOBDIR": "crawls/one"}, "JOBDIR is not needed by a fleet worker"),
    ({"FEEDS": {"items.json": {"format": "json"}}}, "FEEDS (items.json): each worker writes"),
    ({"FEEDS": {"file:///tmp/i.csv": {"format": "csv"}}}, "FEEDS (file:///tmp/i.csv): each"),
])
def test_each_per_worker_setting_in_use_is_one_line(settings, start):
    lines = per_worker_settings(Settings(settings))
    assert len(lines) == 1 and lines[0].startswith(start), lines


def test_remote_feeds_and_settings_turned_off_are_not_warned_about():
    assert per_worker_settings(Settings({
        "FEEDS": {"s3://bucket/items-%(time)s.json": {"format": "json"}},
        "AUTOTHROTTLE_ENABLED": False, "CLOSESPIDER_PAGECOUNT": 0, "DOWNLOAD_SLOTS": {},
        "CONCURRENT_REQUESTS_PER_IP": 0, "JOBDIR": ""})) == []


def test_a_spider_idle_handler_is_warned_about_only_without_an_idle_timeout():
    manager = SignalManager(object())
    assert idle_warning(manager, None) is None  # no handler

    def handler() -> None:
        pass

    manager.connect(handler, signal=signals.spider_idle)
    assert idle_warning(manager, 30.0) is None
    warning = idle_warning(manager, None)
    assert warning is not None and warning.endswith(
        "set FLEET_IDLE_TIMEOUT, or feed the crawl with scrapy fleet push")
