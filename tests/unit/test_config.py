"""FleetConfig: every FLEET_* setting validated once, errors name the setting and value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scrapy.settings import Settings

from scrapy_fleet.addon import Addon
from scrapy_fleet.catalog import DEFAULTS, SETTINGS, format_default, unknown_settings
from scrapy_fleet.checks import setting_value
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "scrapy_fleet"
DOCS_DIR = PACKAGE_DIR.parent / "docs"


def test_defaults():
    config = FleetConfig.from_settings(Settings())
    assert config.redis_url == DEFAULTS["FLEET_REDIS_URL"]
    assert (config.lease_timeout, config.max_leases, config.prefetch) == (30.0, 3, 16)
    assert config.idle_timeout is None
    assert (config.dupefilter.capacity, config.dupefilter.error_rate) == (1_000_000, 0.001)
    assert config.resolve_crawl_id("docs") == "docs"


def test_the_catalog_is_the_one_source_of_the_defaults():
    """FleetConfig's fields have no defaults of their own (they repeated the catalog's): a
    config is made by from_settings only, and gets the catalog's."""
    import dataclasses

    assert [f.name for f in dataclasses.fields(FleetConfig)
            if f.default is not dataclasses.MISSING
            or f.default_factory is not dataclasses.MISSING] == []
    config = FleetConfig.from_settings(Settings())
    assert (config.ban_statuses, config.drain_timeout, config.partitions,
            config.partition_flush) == (tuple(DEFAULTS["FLEET_BAN_STATUSES"]),
                                        DEFAULTS["FLEET_DRAIN_TIMEOUT"],
                                        DEFAULTS["FLEET_PARTITIONS"],
                                        DEFAULTS["FLEET_PARTITION_FLUSH"])


def test_command_line_strings_are_converted():
    config = FleetConfig.from_settings(Settings({
        "FLEET_IDLE_TIMEOUT": "5", "FLEET_LEASE_TIMEOUT": "12.5", "FLEET_MAX_LEASES": "4",
        "FLEET_JSONL_FSYNC": "true", "FLEET_CRAWL_ID": "my-crawl.1",
        "FLEET_REDIS_URL": "rediss://user:secret@redis.example:6380/2",
        "FLEET_REQUEST_CLASSES": "scrapy.http.request.Request"}))
    assert (config.idle_timeout, config.lease_timeout, config.max_leases) == (5.0, 12.5, 4)
    assert config.jsonl.fsync is True
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


INT_SETTINGS = [s.name for s in SETTINGS if s.type.startswith("int")]


@pytest.mark.parametrize("name", INT_SETTINGS)
@pytest.mark.parametrize("value", [4.0, 2.5])
def test_an_int_setting_given_as_a_float_is_refused_in_one_line(name, value):
    """settings.py and custom_settings hand floats through as they are, where `-s NAME=4.0` is
    the string "4.0": an integral float is refused as "4.0" is, naming the setting."""
    from scrapy_fleet.pipelines.mongo_config import MongoConfig

    assert len(INT_SETTINGS) == 36  # every int row of the catalog
    with pytest.raises(FleetConfigError) as info:
        if name.startswith("FLEET_MONGO_"):
            MongoConfig.from_settings({"FLEET_MONGO_URI": "mongodb://h", name: value})
        else:
            FleetConfig.from_settings(Settings({name: value}))
    message = str(info.value)
    assert message.startswith(f"{name}={value!r} is invalid: expected ")
    assert "\n" not in message and ("integer" in message or "whole seconds" in message)
    with pytest.raises(FleetConfigError, match=rf"^{name}='4.0' is invalid: expected "):
        if name.startswith("FLEET_MONGO_"):
            MongoConfig.from_settings({"FLEET_MONGO_URI": "mongodb://h", name: "4.0"})
        else:
            FleetConfig.from_settings(Settings({name: "4.0"}))


def test_scrapys_own_concurrency_setting_keeps_scrapys_reading_of_an_integral_float():
    config = FleetConfig.from_settings(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 8.0}))
    assert config.politeness.host_concurrency == 8
    with pytest.raises(FleetConfigError, match=r"^FLEET_HOST_OVERRIDES\['a.com'\]\['burst'\]="
                                               r"2.0 is invalid"):
        FleetConfig.from_settings(Settings({"FLEET_HOST_OVERRIDES": {"a.com": {"burst": 2.0}}}))


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
    assert config.backpressure.queue_low == expected


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


@pytest.mark.parametrize("value", [0, "0"])
def test_a_bound_of_0_means_unbounded(value):
    config = FleetConfig.from_settings(Settings({"FLEET_QUEUE_MAX": value,
                                                 "FLEET_HOST_QUEUE_MAX": value}))
    assert (config.backpressure.queue_max, config.backpressure.host_queue_max,
            config.backpressure.queue_low) == (None, None, None)
    assert config.frontier_params().queue_max is None
    with pytest.raises(FleetConfigError, match=r"FLEET_QUEUE_MAX=-1 is invalid: expected an "
                                               r"integer >= 0 or None \(0 or None: unbounded\)"):
        FleetConfig.from_settings(Settings({"FLEET_QUEUE_MAX": -1}))


@pytest.mark.parametrize("query,fragment", [
    ("decode_responses=True", "the URL option 'decode_responses' is not supported"),
    # redis-py takes the string "False" as true: refused too
    ("decode_responses=False", "the URL option 'decode_responses' is not supported"),
    ("encoding=utf-16", "the URL option 'encoding' is not supported"),
    ("encoding=latin-1", "the URL option 'encoding' is not supported"),
    ("bogus=1", "the URL option 'bogus' is unknown or has a bad value"),
    ("socket_timeout=soon", "the URL option 'socket_timeout' is unknown or has a bad value"),
    ("protocol=4", "protocol must be either 2 or 3"),
])
def test_redis_url_options_that_break_replies_are_refused_by_name(query, fragment):
    url = f"redis://user:pw-secret@127.0.0.1:6379/0?{query}"
    with pytest.raises(FleetConfigError) as info:
        FleetConfig.from_settings(Settings({"FLEET_REDIS_URL": url}))
    message = str(info.value)
    assert message.startswith("FLEET_REDIS_URL='redis://user:***@127.0.0.1:6379/0?")
    assert fragment in message
    assert "pw-secret" not in message


@pytest.mark.parametrize("query", ["encoding=utf-8", "encoding=UTF8", "protocol=3",
                                   "socket_timeout=5&health_check_interval=10", "db=2",
                                   "client_name=me"])
def test_redis_url_options_that_keep_replies_are_accepted(query):
    url = f"redis://127.0.0.1:6379/0?{query}"
    assert FleetConfig.from_settings(Settings({"FLEET_REDIS_URL": url})).redis_url == url


def test_unknown_fleet_settings_are_found_with_the_closest_name():
    settings = Settings({"FLEET_QUEUE_MAXX": 5, "FLEET_REDIS_URL": "redis://h:1/0",
                         "FLEET_MONGO_URI": "mongodb://h/", "FLEET_ZQXJKVWYPBNMQZXQWJKV": 1,
                         "DOWNLOAD_DELAY": 2, "FLEET_MONGO_BATCHSIZE": 3})
    assert unknown_settings(settings) == [("FLEET_MONGO_BATCHSIZE", "FLEET_MONGO_BATCH_SIZE"),
                                          ("FLEET_QUEUE_MAXX", "FLEET_QUEUE_MAX"),
                                          ("FLEET_ZQXJKVWYPBNMQZXQWJKV", None)]


def test_a_setting_without_a_row_in_the_table_cannot_be_read():
    with pytest.raises(KeyError):
        setting_value(Settings(), "FLEET_NOT_IN_THE_TABLE")


def _source_setting_names() -> set[str]:
    """Every FLEET_* name written in the package's code (not prefixes such as FLEET_MONGO_)."""
    names: set[str] = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        names.update(re.findall(r"\bFLEET_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8")))
    return names


def test_every_setting_the_code_names_has_a_row_in_the_table():
    assert _source_setting_names() - set(DEFAULTS) == set()


def test_every_setting_is_documented_with_its_default():
    """docs/settings.md names every setting (or its page does), and where a doc table gives
    a default as one literal, it is the table's."""
    docs = {path.name: path.read_text("utf-8") for path in DOCS_DIR.glob("*.md")}
    row = re.compile(r"^\| `(FLEET_[A-Z0-9_]+)` \| [^|]* \| ([^|]*) \|", re.M)
    documented = {name: default.strip() for text in docs.values()
                  for name, default in row.findall(text)}
    for setting in SETTINGS:
        assert setting.name in docs["settings.md"], setting.name
        assert setting.name in documented, f"{setting.name}: no row in {setting.doc}"
        shown = documented[setting.name].strip("`")
        literal = format_default(setting.default)
        if re.fullmatch(r"[-\d.]+|None|True|False|\"[^\"<]*\"|\{\}|\[\]", shown):
            assert shown == literal, (setting.name, shown, literal)


@pytest.mark.parametrize("path", ["/x", "/0x", "/1/2"])
def test_a_database_that_is_not_a_number_is_refused(path):
    """A fresh-user trial: redis://host/x silently used database 0."""
    with pytest.raises(FleetConfigError, match="database number"):
        FleetConfig.from_settings(Settings({"FLEET_REDIS_URL": f"redis://127.0.0.1:6379{path}"}))
    assert FleetConfig.from_settings(Settings({"FLEET_REDIS_URL": "redis://h:1/15"}))


def test_the_fleet_config_composes_the_features_own_frozen_configs():
    """Issue 20 item 4: a feature's settings are read and validated by its own module into
    its own frozen config (stages/settings.py, browser/settings.py, proxies/settings.py),
    which FleetConfig holds whole; config.py validates none of them itself."""
    import dataclasses

    from scrapy_fleet.browser.settings import BrowserConfig
    from scrapy_fleet.proxies.settings import ProxyConfig
    from scrapy_fleet.stages.settings import StageConfig

    config = FleetConfig.from_settings(Settings({
        "FLEET_ROLE": "parse", "FLEET_RESPONSE_QUEUE_MAX": 5, "FLEET_PLAYWRIGHT_ABORT": "font"}))
    assert config.stages == StageConfig(role="parse", response_queue_max=5)
    assert config.browser == BrowserConfig(playwright=False, abort=("font",))
    assert isinstance(config.proxy, ProxyConfig)
    for part in (config.stages, config.browser, config.proxy):
        with pytest.raises(dataclasses.FrozenInstanceError):
            part.__setattr__(dataclasses.fields(part)[0].name, None)
    with pytest.raises(FleetConfigError, match="FLEET_ROLE"):
        FleetConfig.from_settings(Settings({"FLEET_ROLE": "both"}))
    source = (PACKAGE_DIR / "config.py").read_text()
    # no setting of theirs is read there (its name as a string literal)
    assert not re.search(r"[\"']FLEET_(ROLE|LARGE_RESPONSE|RESPONSE_QUEUE|MAX_STORED|PLAYWRIGHT)",
                         source)


@pytest.mark.parametrize("name,value,expected", [
    ("DOWNLOAD_DELAY", "-3", "seconds >= 0"),
    ("DOWNLOAD_DELAY", "abc", "seconds >= 0"),
    ("DOWNLOAD_DELAY", -3, "seconds >= 0"),
    ("CONCURRENT_REQUESTS_PER_DOMAIN", "-1", "an integer >= 0"),
    ("CONCURRENT_REQUESTS_PER_DOMAIN", "x", "an integer >= 0"),
])
def test_a_bad_translated_scrapy_setting_is_refused_by_the_name_the_user_set(name, value,
                                                                           expected):
    """issue 30, trial item 7: `-s DOWNLOAD_DELAY=-3` was refused as FLEET_HOST_DELAY=-3.0
    (and `=abc` broke the add-on with a traceback); the line names what the user wrote."""
    settings = Settings({name: value}, priority="cmdline")
    Addon().update_settings(settings)  # what Scrapy does first: the add-on's translation
    with pytest.raises(FleetConfigError) as info:
        FleetConfig.from_settings(settings)
    assert str(info.value) == f"{name}={value!r} is invalid: expected {expected}" + (
        " (0: no cap)" if name.startswith("CONCURRENT") else "")


def test_a_bad_fleet_host_delay_is_still_refused_under_its_own_name():
    settings = Settings({"FLEET_HOST_DELAY": "-2", "DOWNLOAD_DELAY": 1}, priority="cmdline")
    Addon().update_settings(settings)
    with pytest.raises(FleetConfigError, match=r"^FLEET_HOST_DELAY='-2' is invalid"):
        FleetConfig.from_settings(settings)
    good = Settings({"DOWNLOAD_DELAY": "2.5"}, priority="cmdline")
    Addon().update_settings(good)
    assert FleetConfig.from_settings(good).politeness.host_delay == 2.5
    assert good.getfloat("DOWNLOAD_DELAY") == 0  # moved to the fleet-wide interval
