"""Adaptive politeness (issue 35): its settings, Scrapy's AutoThrottle carried over, and what a
download report says (outcome, latency, reason)."""

from __future__ import annotations

import logging

import pytest
from scrapy import Request
from scrapy.http import Response
from scrapy.settings import Settings
from twisted.internet.error import ConnectionRefusedError, TCPTimedOutError

from scrapy_fleet.addon import Addon
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier.protocol import call_constants
from scrapy_fleet.politeness.memory import parse_capacity
from scrapy_fleet.politeness.middlewares import (
    CLEAN,
    NEITHER,
    OVERLOAD,
    exception_report,
    response_report,
)
from scrapy_fleet.politeness.settings import AdaptiveConfig, adaptive_config


def test_on_by_default_and_sent_with_every_call():
    constants = call_constants(FleetConfig.from_settings(Settings()).frontier_params())
    assert constants["ad"] == 1 and constants["ab"] == 0.5 and constants["as"] == 0.05
    assert constants["aw"] == 1000 and constants["ag"] == 2.0 and constants["am"] == 0.05
    off = FleetConfig.from_settings(Settings({"FLEET_ADAPTIVE": False}))
    assert call_constants(off.frontier_params())["ad"] == 0


@pytest.mark.parametrize("name,value", [("FLEET_ADAPTIVE_BETA", 1.0),
                                        ("FLEET_ADAPTIVE_BETA", 0),
                                        ("FLEET_ADAPTIVE_STEP", 1.5),
                                        ("FLEET_ADAPTIVE_WINDOW", 0),
                                        ("FLEET_ADAPTIVE_MEMORY", -1),
                                        ("FLEET_ADAPTIVE_MEMORY", "week"),
                                        ("FLEET_ADAPTIVE_LATENCY_FACTOR", 0.5),
                                        ("FLEET_ADAPTIVE_MIN_RATE", 0),
                                        ("FLEET_ADAPTIVE_OVERLOAD_STATUSES", [429, 42]),
                                        ("FLEET_ADAPTIVE_OVERLOAD_STATUSES", "4x9")])
def test_a_wrong_value_is_one_error_naming_the_setting(name, value):
    with pytest.raises(FleetConfigError, match=name):
        adaptive_config(Settings({name: value}))


def test_overload_statuses_from_the_command_line():
    assert adaptive_config(Settings({"FLEET_ADAPTIVE_OVERLOAD_STATUSES": "429,503,500"})) \
        .overload_statuses == {429, 500, 503}


def test_autothrottle_is_turned_off_and_carried_over(caplog):
    settings = Settings({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_TARGET_CONCURRENCY": 2.5,
                         "AUTOTHROTTLE_MAX_DELAY": 20})
    with caplog.at_level(logging.INFO, logger="scrapy_fleet.addon"):
        Addon().update_settings(settings)
    assert settings.getbool("AUTOTHROTTLE_ENABLED") is False
    config = FleetConfig.from_settings(settings)
    assert config.politeness.host_concurrency == 3
    assert config.politeness.adaptive.min_rate == pytest.approx(0.05)
    lines = [r for r in caplog.records if "AutoThrottle" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


@pytest.mark.parametrize("given,takes_over", [
    ({}, False),
    ({"DOWNLOAD_DELAY": 0}, False),
    ({"FLEET_HOST_RATE": None}, False),
    ({"FLEET_HOST_OVERRIDES": {"a.test": {"concurrency": 1}}}, False),
    ({"DOWNLOAD_DELAY": 0.5}, True),
    ({"FLEET_HOST_DELAY": 1}, True),
    ({"FLEET_HOST_RATE": 2}, True),
    ({"FLEET_HOST_RATE": "2"}, True),  # as given on the command line
])
def test_the_autothrottle_line_says_whether_the_controller_can_act(caplog, given, takes_over):
    """The controller adapts under a configured rate or delay (its ceiling) and does not act
    without one (docs/politeness.md): the line said it took over in both cases."""
    settings = Settings({"AUTOTHROTTLE_ENABLED": True, **given})
    with caplog.at_level(logging.INFO, logger="scrapy_fleet.addon"):
        Addon().update_settings(settings)
    assert settings.getbool("AUTOTHROTTLE_ENABLED") is False
    [line] = [r.getMessage() for r in caplog.records if "AutoThrottle" in r.getMessage()]
    if takes_over:
        assert "the fleet's adaptive politeness has one controller per host" in line
        assert "needs a rate or delay" not in line
    else:
        assert ("needs a rate or delay to adapt under and none is set: set FLEET_HOST_RATE, "
                "DOWNLOAD_DELAY or FLEET_HOST_DELAY (FLEET_HOST_CONCURRENCY=1, "
                "FLEET_ADAPTIVE_MIN_RATE=0.0166667)") in line


def test_the_autothrottle_line_names_the_hosts_an_override_gives_a_ceiling(caplog):
    settings = Settings({"AUTOTHROTTLE_ENABLED": True, "FLEET_HOST_OVERRIDES": {
        "a.test": {"rate": 1}, "b.test": {"delay": 2}, "c.test": {"concurrency": 1}}})
    with caplog.at_level(logging.INFO, logger="scrapy_fleet.addon"):
        Addon().update_settings(settings)
    [line] = [r.getMessage() for r in caplog.records if "AutoThrottle" in r.getMessage()]
    assert ("needs a rate or delay to adapt under and has one only for the 2 host(s) "
            "FLEET_HOST_OVERRIDES gives one: set FLEET_HOST_RATE, DOWNLOAD_DELAY or "
            "FLEET_HOST_DELAY") in line


def test_autothrottle_stays_when_the_controller_is_off():
    settings = Settings({"AUTOTHROTTLE_ENABLED": True, "FLEET_ADAPTIVE": False})
    Addon().update_settings(settings)
    assert settings.getbool("AUTOTHROTTLE_ENABLED") is True
    assert FleetConfig.from_settings(settings).politeness.host_concurrency == 8


def test_a_setting_given_wins_over_autothrottle():
    settings = Settings({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_TARGET_CONCURRENCY": 4,
                         "FLEET_HOST_CONCURRENCY": 1})
    Addon().update_settings(settings)
    assert FleetConfig.from_settings(settings).politeness.host_concurrency == 1


def _response(status: int, latency: float | None = 0.25) -> tuple[Request, Response]:
    request = Request("http://a.test/")
    if latency is not None:
        request.meta["download_latency"] = latency
    return request, Response("http://a.test/", status=status, request=request)


def test_what_a_download_report_says():
    adaptive = AdaptiveConfig()
    assert response_report(*_response(200), adaptive) == (CLEAN, 250, "")
    assert response_report(*_response(404, None), adaptive) == (CLEAN, -1, "")
    assert response_report(*_response(429), adaptive) == (OVERLOAD, -1, "429")
    assert response_report(*_response(503), adaptive) == (OVERLOAD, -1, "503")
    assert response_report(*_response(403), adaptive) == (NEITHER, -1, "")  # a ban: per exit
    assert response_report(*_response(500), adaptive) == (NEITHER, -1, "")
    request = Request("http://a.test/")
    assert exception_report(request, TCPTimedOutError()) == (OVERLOAD, -1, "timeout")
    assert exception_report(request, ConnectionRefusedError()) == (OVERLOAD, -1, "error")
    assert exception_report(request, ValueError("x")) == (NEITHER, -1, "")


def test_the_learned_capacity_memory_setting_and_stored_value():
    """FLEET_ADAPTIVE_MEMORY: 7 days by default, 0 keeps nothing; a stored capacity is
    read only as a positive number ("<capacity>|<rate>"), anything else is ignored."""
    assert adaptive_config(Settings()).memory == 7 * 86400
    assert adaptive_config(Settings({"FLEET_ADAPTIVE_MEMORY": "0"})).memory == 0
    assert parse_capacity(b"2.5|1.25") == 2.5 and parse_capacity("4") == 4.0
    for bad in (None, b"", b"x|1", b"0|1", b"-3|1", b"inf|1", b"nan|1", b"\x80\x04."):
        assert parse_capacity(bad) is None, bad


@pytest.mark.parametrize("value", [0, -5, "long"])
def test_a_wrong_crawl_delay_skip_is_one_error(value):
    with pytest.raises(FleetConfigError, match="FLEET_SKIP_CRAWL_DELAY_OVER"):
        FleetConfig.from_settings(Settings({"FLEET_SKIP_CRAWL_DELAY_OVER": value}))
    config = FleetConfig.from_settings(Settings({"FLEET_SKIP_CRAWL_DELAY_OVER": "60"}))
    assert config.politeness.skip_crawl_delay_over == 60.0
    assert FleetConfig.from_settings(Settings()).politeness.skip_crawl_delay_over is None
