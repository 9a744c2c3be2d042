"""FleetConfig: every FLEET_* setting validated once, errors name the setting and value."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_fleet.addon import Addon
from scrapy_fleet.config import DEFAULTS, FleetConfig
from scrapy_fleet.errors import FleetConfigError


def test_defaults():
    config = FleetConfig.from_settings(Settings())
    assert config.redis_url == DEFAULTS["FLEET_REDIS_URL"]
    assert (config.lease_timeout, config.max_leases, config.prefetch) == (30.0, 3, 16)
    assert config.idle_timeout is None
    assert (config.dupefilter_capacity, config.dupefilter_error_rate) == (1_000_000, 0.001)
    assert config.resolve_crawl_id("docs") == "docs"


def test_command_line_strings_are_converted():
    config = FleetConfig.from_settings(Settings({
        "FLEET_IDLE_TIMEOUT": "5", "FLEET_LEASE_TIMEOUT": "12.5", "FLEET_MAX_LEASES": "4",
        "FLEET_JSONL_FSYNC": "true", "FLEET_CRAWL_ID": "my-crawl.1",
        "FLEET_REDIS_URL": "rediss://user:secret@redis.example:6380/2",
        "FLEET_REQUEST_CLASSES": "scrapy.http.request.Request"}))
    assert (config.idle_timeout, config.lease_timeout, config.max_leases) == (5.0, 12.5, 4)
    assert config.jsonl_fsync is True
    assert config.resolve_crawl_id("ignored") == "my-crawl.1"
    assert config.request_classes == ("scrapy.http.request.Request",)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "unix:///run/redis.sock?db=1",
                                 "rediss://:pw@h:1/0"])
def test_redis_url_schemes(url):
    assert FleetConfig.from_settings(Settings({"FLEET_REDIS_URL": url})).redis_url == url


@pytest.mark.parametrize("name,value,fragment", [
    ("FLEET_REDIS_URL", "http://localhost:6379",
     "redis://, rediss://, unix://, redis+cluster://"),
    ("FLEET_REDIS_URL", "redis://:6379", "a host in the URL"),
    ("FLEET_REDIS_URL", "redis://h:notaport/0", "bad port"),
    ("FLEET_LEASE_TIMEOUT", "soon", "seconds >= 1"),
    ("FLEET_LEASE_TIMEOUT", 0.5, "seconds >= 1"),
    ("FLEET_MAX_LEASES", 0, "an integer >= 1"),
    ("FLEET_MAX_LEASES", 2.5, "an integer >= 1"),
    ("FLEET_PREFETCH", True, "an integer >= 1"),
    ("FLEET_IDLE_TIMEOUT", -1, "seconds >= 0 or None"),
    ("FLEET_DUPEFILTER_ERROR_RATE", 0, "a probability between 0 and 0.5"),
    ("FLEET_DUPEFILTER_ERROR_RATE", 0.9, "a probability between 0 and 0.5"),
    ("FLEET_DUPEFILTER_CAPACITY", "many", "an integer >= 1"),
    ("FLEET_CRAWL_ID", "bad id{", "letters, digits"),
    ("FLEET_START_REQUESTS", "sometimes", "one of once, always, never"),
    ("FLEET_JSONL_FSYNC", "maybe", "a boolean"),
    ("FLEET_LEASE_TIMEOUT", "nan", "a finite number"),
    ("FLEET_POLL_INTERVAL", "inf", "a finite number"),
    ("FLEET_JSONL_PATH", "out-%(bogus)s.jsonl", "placeholders may be"),
    ("FLEET_JSONL_PATH", "out-%d.jsonl", "placeholders may be"),
    ("FLEET_REQUEST_CLASSES", ["os.system"], "scrapy.Request subclasses"),
    ("FLEET_KEY_PREFIX", "a{b}", "letters, digits"),
])
def test_wrong_values_name_the_setting_and_value(name, value, fragment):
    with pytest.raises(FleetConfigError) as info:
        FleetConfig.from_settings(Settings({name: value}))
    message = str(info.value)
    assert message.startswith(f"{name}={value!r} is invalid")
    assert fragment in message


def test_addon_sets_components_at_addon_priority_and_keeps_user_values():
    settings = Settings({"SCHEDULER": "my.Scheduler", "FLEET_MONGO_URI": "mongodb://m/",
                         "FLEET_JSONL_PATH": "out.jsonl"}, priority="project")
    Addon().update_settings(settings)
    assert settings["SCHEDULER"] == "my.Scheduler"  # the project's choice wins
    assert settings["DUPEFILTER_CLASS"] == "scrapy_fleet.frontier.dupefilter.RedisBloomDupeFilter"
    pipelines = {getattr(k, "__name__", k): v
                 for k, v in settings.getdict("ITEM_PIPELINES").items()}
    assert pipelines == {"MongoPipeline": 300, "JsonLinesPipeline": 800}
    middlewares = {getattr(k, "__name__", k): v
                   for k, v in settings.getdict("SPIDER_MIDDLEWARES").items()}
    assert middlewares == {"FleetSpiderMiddleware": 0}
    fresh = Settings()
    Addon().update_settings(fresh)
    assert fresh["SCHEDULER"] == "scrapy_fleet.frontier.scheduler.FleetScheduler"
    assert fresh.getdict("ITEM_PIPELINES") == {}  # sinks only when configured
    assert not any(k.startswith("SCHEDULER_") and fresh.getpriority(k) == 15
                   for k in fresh.attributes)


@pytest.mark.parametrize("queue_max,low,expected", [
    (1, 0.9, 1), (5, 0.1, 1), (10, 0.9, 9), ("None", 0.9, None)])
def test_producers_resume_at_least_when_the_frontier_is_empty(queue_max, low, expected):
    config = FleetConfig.from_settings(Settings({"FLEET_QUEUE_MAX": queue_max,
                                                 "FLEET_QUEUE_LOW_WATERMARK": low}))
    assert config.queue_low == expected


@pytest.mark.parametrize("url,expected", [
    ("redis://fleet:s3cret@h:6379/0", "redis://fleet:***@h:6379/0"),
    ("redis://:pa/ss@h:6379/0", "redis://:***@h:6379/0"),  # unescaped '/': still hidden
    ("unix://fleet:s3cret@/tmp/r.sock?db=0", "unix://fleet:***@/tmp/r.sock?db=0"),
    ("unix:///tmp/r.sock?db=0&password=s3cret", "unix:///tmp/r.sock?db=0&password=***"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_redis_urls_are_redacted_for_logs(url, expected):
    from scrapy_fleet.redact import redact

    assert redact(url) == expected
