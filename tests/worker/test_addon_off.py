"""A project made by a real ``scrapy startproject``, with the README's two lines added at the
top of its settings.py: the template's ``ADDONS = {}`` below them turns the add-on off again.
Every ``scrapy fleet`` command there exits 2 with one line saying so; with the add-on put into
the template's ``ADDONS`` dict (the README's quick start) the commands work."""

from __future__ import annotations

import pytest
from support import run_scrapy

from scrapy_fleet.frontier.admin import FrontierAdmin

TIMEOUT = 60.0
ADDON_OFF = (
    "error: this project's settings do not enable scrapy_fleet (ADDONS has no "
    "scrapy_fleet.Addon), so `scrapy crawl` would run as plain Scrapy: put "
    "\"scrapy_fleet.Addon\": 500 into the ADDONS dict of settings.py (a later "
    "`ADDONS = {}` line, as `scrapy startproject` writes, replaces an earlier one)")

PLAIN_CRAWL = (
    "warning: FLEET_REDIS_URL is set but this project's settings do not enable scrapy_fleet "
    "(ADDONS has no scrapy_fleet.Addon): this crawl runs as plain Scrapy, without the fleet; "
    "put \"scrapy_fleet.Addon\": 500 into the ADDONS dict of settings.py\n")


@pytest.fixture
def project(tmp_path, worker_env, redis_url):
    made = run_scrapy(tmp_path, ["startproject", "demo"], worker_env, timeout=TIMEOUT)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "demo"
    spider = run_scrapy(root, ["genspider", "pages", "127.0.0.1"], worker_env, timeout=TIMEOUT)
    assert spider.returncode == 0, spider.stderr
    settings = root / "demo" / "settings.py"
    template = settings.read_text()
    assert "\nADDONS = {}\n" in template  # what Scrapy 2.19's template writes
    settings.write_text('ADDONS = {"scrapy_fleet.Addon": 500}\n'
                        f'FLEET_REDIS_URL = "{redis_url}"\n' + template)
    return root


def test_every_fleet_command_says_the_addon_is_off(project, worker_env, redis_url):
    for args in (["push", "pages", "http://127.0.0.1:1/"], ["status", "pages"],
                 ["failed", "pages"], ["settings"], ["acl", "pages"],
                 ["proxies", "list", "pages"]):
        result = run_scrapy(project, ["fleet", *args], worker_env, timeout=TIMEOUT)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip().splitlines() == [ADDON_OFF], (args, result.stderr)
        assert result.stdout == "", (args, result.stdout)
    assert FrontierAdmin(redis_url, "pages").status()["queued"] == 0  # nothing was pushed
    # scrapy crawl runs as plain Scrapy (nothing of the fleet is loaded), but says so
    crawl = ["crawl", "pages", "-s", "LOG_LEVEL=CRITICAL", "-s", "ROBOTSTXT_OBEY=False",
             "-s", "RETRY_ENABLED=False"]
    plain = run_scrapy(project, crawl, worker_env, timeout=TIMEOUT)
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr.count(PLAIN_CRAWL) == 1, plain.stderr

    # the README's quick start: the add-on goes into the template's ADDONS dict
    settings = project / "demo" / "settings.py"
    text = settings.read_text().replace('ADDONS = {"scrapy_fleet.Addon": 500}\n', "", 1)
    settings.write_text(text.replace("\nADDONS = {}\n",
                                     '\nADDONS = {"scrapy_fleet.Addon": 500}\n'))
    pushed = run_scrapy(project, ["fleet", "push", "pages", "http://127.0.0.1:1/"], worker_env,
                        timeout=TIMEOUT)
    assert pushed.returncode == 0, pushed.stderr
    assert FrontierAdmin(redis_url, "pages").status()["queued"] == 1
    listed = run_scrapy(project, ["list"], worker_env, timeout=TIMEOUT)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "pages\n", "")
