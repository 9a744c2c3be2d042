"""scrapy-redis's settings in a fleet worker (compat/settings.py, issue 36): translated by the
add-on, or refused by the start-up check with one line naming the fleet's way."""

from __future__ import annotations

import logging

import pytest
from scrapy.settings import Settings

from scrapy_fleet.addon import Addon
from scrapy_fleet.compat import settings as compat
from scrapy_fleet.compat.feeder import start_key_kind
from scrapy_fleet.errors import FleetConfigError


def applied(values: dict, priority: str = "project") -> Settings:
    settings = Settings()
    settings.setdict(values, priority)
    Addon().update_settings(settings)
    return settings


def test_redis_url_is_the_fleets_redis_unless_fleet_redis_url_is_set():
    assert applied({"REDIS_URL": "redis://r:1/2"})["FLEET_REDIS_URL"] == "redis://r:1/2"
    both = applied({"REDIS_URL": "redis://r:1/2", "FLEET_REDIS_URL": "redis://f:3/0"})
    assert both["FLEET_REDIS_URL"] == "redis://f:3/0"
    assert applied({})["FLEET_REDIS_URL"] is None  # the catalog's default applies


def test_redis_host_port_and_params():
    got = applied({"REDIS_HOST": "h", "REDIS_PORT": 7000,
                   "REDIS_PARAMS": {"password": "p@ss", "db": 3, "socket_timeout": 30}})
    assert got["FLEET_REDIS_URL"] == "redis://:p%40ss@h:7000/3"
    assert applied({"REDIS_PORT": "6380"})["FLEET_REDIS_URL"] == "redis://localhost:6380/0"


def test_max_idle_time_becomes_the_fleets_idle_timeout():
    assert applied({"MAX_IDLE_TIME_BEFORE_CLOSE": 7})["FLEET_IDLE_TIMEOUT"] == 7.0
    assert applied({"MAX_IDLE_TIME_BEFORE_CLOSE": 0})["FLEET_IDLE_TIMEOUT"] is None
    kept = applied({"MAX_IDLE_TIME_BEFORE_CLOSE": 7, "FLEET_IDLE_TIMEOUT": 2})
    assert kept["FLEET_IDLE_TIMEOUT"] == 2


def test_scrapy_redis_scheduler_and_dupefilter_are_replaced_with_one_info_line(caplog):
    with caplog.at_level(logging.INFO, logger="scrapy_fleet.compat.settings"):
        got = applied({"SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                       "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
                       "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.SpiderQueue"})
    assert got["SCHEDULER"] == "scrapy_fleet.frontier.scheduler.FleetScheduler"
    assert got["DUPEFILTER_CLASS"] == "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "SCHEDULER -> FleetScheduler" in lines[0]
    assert "SCHEDULER_QUEUE_CLASS" in lines[0]
    # another project's own scheduler still wins over the add-on
    own = applied({"SCHEDULER": "myproject.MyScheduler"})
    assert own["SCHEDULER"] == "myproject.MyScheduler"


@pytest.mark.parametrize(("values", "words"), [
    ({"SCHEDULER_PERSIST": False}, "scrapy fleet purge SPIDER --yes"),
    ({"SCHEDULER_FLUSH_ON_START": True}, "before starting"),
    ({"MAX_IDLE_TIME_BEFORE_CLOSE": "soon"}, "FLEET_IDLE_TIMEOUT"),
    ({"REDIS_START_URLS_AS_SET": True, "REDIS_START_URLS_AS_ZSET": True}, "both true"),
])
def test_refused_with_one_line(values, words):
    with pytest.raises(FleetConfigError) as info:
        compat.check(applied(values))
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_accepted():
    compat.check(applied({"SCHEDULER_PERSIST": True, "SCHEDULER_FLUSH_ON_START": False,
                          "MAX_IDLE_TIME_BEFORE_CLOSE": 5}))
    assert start_key_kind(applied({})) == "list"
    assert start_key_kind(applied({"REDIS_START_URLS_AS_SET": "True"})) == "set"
    assert start_key_kind(applied({"REDIS_START_URLS_AS_ZSET": True})) == "zset"
