"""A worker that cannot start says why in one line, fetches nothing and exits non-zero.

Real ``scrapy crawl`` processes of the test project against: a port where nothing listens,
wrong ``FLEET_*`` values, and a real ``redis-server --requirepass`` given a wrong password.
The fleet's startup check (scrapy_fleet/startup.py) runs before Scrapy builds its engine, so
no component is half-opened and Scrapy prints no follow-up traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import TEST_PROJECT, free_port, run_scrapy, stop_process

from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from testsite import generate_site

PASSWORD = "pw-Zq81-secret"  # must never appear in the output
TIMEOUT = 30.0  # seconds per scrapy process at most (each takes about one)


@pytest.fixture
def site(site_factory, tmp_path):
    """A small site whose request log proves that nothing was fetched."""
    generate_site(tmp_path / "www", 3, 1)
    served = site_factory(tmp_path / "www")
    served.start_path = "/site/"
    return served


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[str]:
    """A real redis-server requiring PASSWORD; yields its URL without credentials."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `make redis`", pytrace=False)
    port = free_port()
    workdir = tmp_path / "redis-auth"
    workdir.mkdir()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--requirepass", PASSWORD, "--dir", str(workdir),
         "--logfile", str(workdir / "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD,
                         socket_connect_timeout=1)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server --requirepass did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}/0"
    finally:
        client.close()
        stop_process(proc)


def crawl(site, env: dict[str, str], *settings: str, log_level: str = "INFO"):
    args = ["crawl", "starts", "-a", f"start={site.start_url}", "-L", log_level]
    for setting in settings:
        args += ["-s", setting]
    return run_scrapy(TEST_PROJECT, args, env, timeout=TIMEOUT)


def assert_clean_failure(result, site, *fragments: str) -> str:
    """Exit status 1, one ERROR line with *fragments*, no traceback, nothing fetched."""
    out = result.stderr + result.stdout
    assert result.returncode == 1, out
    errors = [line for line in out.splitlines() if " ERROR: " in line or " CRITICAL: " in line]
    assert len(errors) == 1, out
    assert "[scrapy_fleet.startup] ERROR: Fleet worker cannot start: " in errors[0], out
    for fragment in fragments:
        assert fragment in errors[0], out
    assert out.count("Traceback") == 0, out
    assert PASSWORD not in out
    assert "Spider opened" not in out  # stopped before the engine was built
    assert site.requests() == []
    return errors[0]


def test_redis_unreachable(site, worker_env):
    url = f"redis://fleet:{PASSWORD}@127.0.0.1:{free_port()}/0"  # nothing listens there
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={url}")
    assert_clean_failure(result, site, "cannot reach Redis at redis://fleet:***@127.0.0.1:",
                                "(FLEET_REDIS_URL)", "Start Redis there, or set FLEET_REDIS_URL")


@pytest.mark.parametrize(("setting", "fragment"), [
    ("FLEET_QUEUE_MAX=-5", "FLEET_QUEUE_MAX='-5' is invalid: expected an integer >= 0 or "
                           "None (0 or None: unbounded)"),
    ("FLEET_REDIS_URL=http://127.0.0.1:6379/0", "FLEET_REDIS_URL='http://127.0.0.1:6379/0' is "
                                                "invalid"),
    ("FLEET_CRAWL_ID=two words", "FLEET_CRAWL_ID='two words' is invalid"),
    # (checked whatever is enabled: no FLEET_MONGO_URI here)
    ("FLEET_MONGO_BATCH_SIZE=0", "FLEET_MONGO_BATCH_SIZE='0' is invalid: expected an "
                                 "integer between 1 and 100000"),
])
def test_invalid_setting(site, worker_env, setting, fragment):
    result = crawl(site, worker_env, setting)
    assert_clean_failure(result, site, fragment, "-s NAME=VALUE",
                         "`scrapy fleet settings` or `scrapy-fleet settings` lists the valid "
                         "values")


def test_wrong_password(site, worker_env, redis_with_password):
    result = crawl(site, worker_env, f"FLEET_REDIS_URL=redis://:{PASSWORD}x@{redis_with_password}")
    assert_clean_failure(result, site, "refused the credentials",
                         f"redis://:***@{redis_with_password}",
                         "Check the user name and password in FLEET_REDIS_URL")
    result = crawl(site, worker_env, f"FLEET_REDIS_URL=redis://{redis_with_password}")
    assert_clean_failure(result, site, "refused the credentials", "Authentication required")


def test_database_out_of_range(site, worker_env, redis_url):
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={redis_url.rsplit('/', 1)[0]}/99")
    assert_clean_failure(result, site, "refused the connection", "DB index is out of range")


def test_traceback_at_debug_level(site, worker_env):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={url}", log_level="DEBUG")
    out = result.stderr + result.stdout
    assert result.returncode == 1, out
    assert "Fleet worker cannot start: cannot reach Redis" in out
    assert out.count("Task exception was never retrieved") == 0, out  # logged once, by us
    assert "Traceback" in out and "RedisUnavailableError" in out
    assert "Spider opened" not in out


def test_a_wrong_setting_has_no_traceback_even_at_debug_level(site, worker_env):
    # Scrapy's default LOG_LEVEL is DEBUG: a new project printed the traceback of a wrong
    # value after the line that says all there is to fix (fresh-user trial)
    result = crawl(site, worker_env, "FLEET_LEASE_TIMEOUT=0.5", log_level="DEBUG")
    out = result.stderr + result.stdout
    assert result.returncode == 1, out
    assert "Fleet worker cannot start: FLEET_LEASE_TIMEOUT='0.5' is invalid" in out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("action", [["status", "starts"], ["push", "starts", "http://x.test/"]])
def test_fleet_commands_with_redis_down(worker_env, action):
    port = free_port()
    url = f"redis://fleet:{PASSWORD}@127.0.0.1:{port}/0"
    result = run_scrapy(TEST_PROJECT, ["fleet", *action, "-s", f"FLEET_REDIS_URL={url}"],
                        worker_env, timeout=TIMEOUT)
    assert result.returncode == 2, result.stderr  # cli.py: 2 = usage error or Redis unreachable
    assert result.stderr.strip().splitlines() == [
        f"error: cannot reach Redis at redis://fleet:***@127.0.0.1:{port}/0 (FLEET_REDIS_URL): "
        f"Error 111 connecting to 127.0.0.1:{port}. Connection refused."]
    assert PASSWORD not in result.stderr + result.stdout


def test_valid_settings_pass_the_check_silently(site, worker_env, redis_url):
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={redis_url}", "FLEET_IDLE_TIMEOUT=1",
                   "FLEET_START_REQUESTS=always")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out
    assert "Fleet worker cannot start" not in out and "FleetStartupCheck" not in out
    assert "Spider opened" in out
    assert site.requests(), out


def test_a_url_that_is_not_redis(site, worker_env, not_redis):
    url = f"redis://:{PASSWORD}@127.0.0.1:{not_redis}/0"  # an HTTP server listens there
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={url}")
    line = assert_clean_failure(
        result, site, f"redis://:***@127.0.0.1:{not_redis}/0 is not a Redis server "
                      "(FLEET_REDIS_URL): it answered in another protocol",
        "Set FLEET_REDIS_URL to the address of a Redis server")
    assert "Task exception was never retrieved" not in result.stderr + result.stdout, line


@pytest.mark.parametrize(("query", "option"), [("decode_responses=True", "decode_responses"),
                                               ("encoding=utf-16", "encoding")])
def test_url_options_that_change_replies_are_refused(site, worker_env, redis_url, query,
                                                     option):
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={redis_url}?{query}")
    assert_clean_failure(result, site, f"the URL option {option!r} is not supported")


@pytest.mark.parametrize("setting", ["FLEET_REDIS_URL={url}?protocol=3", "FLEET_QUEUE_MAX=0",
                                     "FLEET_HOST_QUEUE_MAX=0"])
def test_settings_that_must_work(site, worker_env, redis_url, setting):
    """RESP3 (the fleet's replies are the same) and a bound of 0 (unbounded) crawl."""
    settings = [f"FLEET_REDIS_URL={redis_url}", setting.format(url=redis_url),
                "FLEET_IDLE_TIMEOUT=1", "FLEET_START_REQUESTS=always"]
    result = crawl(site, worker_env, *settings)
    out = result.stderr + result.stdout
    assert result.returncode == 0, out
    assert " ERROR: " not in out, out
    assert [r["path"] for r in site.requests()] == ["/site/"]
    assert "'item_scraped_count': 1" in out, out
    status = FrontierAdmin(redis_url, "starts").status()  # it went through the frontier
    assert (status["counters"].get("acked"), status["queued"], status["leased"]) == (1, 0, 0)
    stored = redis.Redis.from_url(redis_url).hgetall(CrawlKeys("fleet", "starts").config)
    name = setting.split("=")[0]
    for field, value in (("queue_max", b"1000000"), ("host_queue_max", b"0")):
        zero = name == f"FLEET_{field.upper()}"  # 0 stored: unbounded
        assert stored[field.encode()] == (b"0" if zero else value), (field, stored)


def test_an_unknown_setting_is_one_warning_with_the_closest_name(site, worker_env, redis_url):
    result = crawl(site, worker_env, f"FLEET_REDIS_URL={redis_url}", "FLEET_IDLE_TIMEOUT=1",
                   "FLEET_START_REQUESTS=always", "FLEET_QUEUE_MAXX=5")
    out = result.stderr + result.stdout
    assert result.returncode == 0, out
    warnings = [line for line in out.splitlines() if "Unknown setting" in line]
    assert len(warnings) == 1, out
    assert warnings[0].endswith(
        "[scrapy_fleet.startup] WARNING: Unknown setting FLEET_QUEUE_MAXX ignored: did you "
        "mean FLEET_QUEUE_MAX? (`scrapy fleet settings` or `scrapy-fleet settings` lists "
        "every FLEET_* setting)"), warnings[0]
    assert site.requests(), out
