"""``scrapy fleet proxies ...`` and ``scrapy-fleet proxies ...`` against a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys

from support import TEST_PROJECT, run_scrapy

from scrapy_fleet import redis_client
from scrapy_fleet.addon import Addon
from scrapy_fleet.proxies.pool import proxy_id

A = "http://alice:s3cret-a@127.0.0.1:3128"
B = "http://bob:s3cret-b@127.0.0.1:3128"
C = "http://127.0.0.9:8080"


def cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                           redis_url, *args], capture_output=True, text=True, timeout=60)


def test_console_add_list_drain_remove_reset(redis_url):
    out = cli(redis_url, "proxies", "add", "crawl1", A, B, C)
    assert out.returncode == 0, out.stderr
    assert "added 3" in out.stdout and proxy_id(A) in out.stdout
    listing = cli(redis_url, "proxies", "list", "crawl1", "--json")
    assert listing.returncode == 0, listing.stderr
    snap = json.loads(listing.stdout)
    assert snap["pool"] == "crawl1"
    assert {e["id"] for e in snap["exits"]} == {proxy_id(A), proxy_id(B), proxy_id(C)}
    row = snap["exits"][0]
    assert set(row) >= {"id", "address", "status", "in_flight", "ok", "ban", "rate_limited",
                        "proxy_dead", "site_error", "responses", "block_rate", "sites"}
    assert set(snap["totals"]) == {"bans", "responses", "block_rate", "counters"}
    # by host:port: both accounts on the gateway
    drained = cli(redis_url, "proxies", "drain", "crawl1", "127.0.0.1:3128")
    assert drained.returncode == 0 and "draining 2" in drained.stdout
    snap = json.loads(cli(redis_url, "proxies", "list", "crawl1", "--json").stdout)
    assert {e["id"]: e["status"] for e in snap["exits"]}[proxy_id(A)] == "draining"
    removed = cli(redis_url, "proxies", "remove", "crawl1", proxy_id(C)[:6], "nope:1")
    assert removed.returncode == 1 and "removed 1" in removed.stdout and "nope:1" in removed.stderr
    assert cli(redis_url, "proxies", "reset", "crawl1").returncode == 0
    text = cli(redis_url, "proxies", "list", "crawl1")
    assert text.returncode == 0 and "2 exit(s)" in text.stdout and "active" in text.stdout
    everything = "".join(p.stdout + p.stderr for p in (out, listing, drained, removed, text))
    assert "s3cret" not in everything
    # a bad URL: one clear error, nothing added, no password shown
    bad = cli(redis_url, "proxies", "add", "crawl1", "http://eve:s3cret-e@host-without-port")
    assert bad.returncode == 2 and "s3cret" not in bad.stderr and "host:port" in bad.stderr


def test_project_command_uses_the_pool_setting(redis_url, worker_env):
    base = ["-s", f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_PROXY_POOL=shared"]
    added = run_scrapy(TEST_PROJECT, ["fleet", "proxies", "add", "proxy_pages", C, *base],
                       worker_env)
    assert added.returncode == 0, added.stderr
    client = redis_client.make_client(redis_url)
    assert client.hkeys("fleet:{proxypool:shared}:proxies") == [proxy_id(C).encode()]
    listing = run_scrapy(TEST_PROJECT, ["fleet", "proxies", "list", "proxy_pages", "--json",
                                        *base], worker_env)
    assert json.loads(listing.stdout)["pool"] == "shared"
    client.close()


def test_addon_enables_the_middleware_only_with_proxies():
    from scrapy.settings import Settings

    path = "scrapy_fleet.proxies.middleware.FleetProxyMiddleware"
    for values, enabled in (({}, False), ({"FLEET_PROXIES": [C]}, True),
                            ({"FLEET_PROXY_POOL": "shared"}, True)):
        settings = Settings(values)
        Addon().update_settings(settings)
        names = {getattr(k, "__module__", "") + "." + getattr(k, "__name__", str(k))
                 if not isinstance(k, str) else k
                 for k in settings.getdict("DOWNLOADER_MIDDLEWARES")}
        assert (path in names) is enabled, values


def test_project_add_to_a_crawl_whose_settings_name_no_pool_warns_it_goes_direct(
        redis_url, worker_env):
    # issue 19: `proxies add` to a crawl whose settings name no pool succeeded silently,
    # while its workers went on sending every request directly
    base = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    added = run_scrapy(TEST_PROJECT, ["fleet", "proxies", "add", "proxy_pages", C, *base],
                       worker_env)
    assert added.returncode == 0, added.stderr
    assert "added 1 exit(s) to pool 'proxy_pages'" in added.stdout
    assert ("warning: the settings of crawl 'proxy_pages' name no proxy pool (FLEET_PROXIES "
            "and FLEET_PROXY_POOL are unset): its workers send every request directly and "
            "never use pool 'proxy_pages'") in added.stderr
    # another pool than the crawl's
    other = run_scrapy(TEST_PROJECT, ["fleet", "proxies", "add", "proxy_pages", C, "--pool",
                                      "spare", *base, "-s", "FLEET_PROXY_POOL=shared"],
                       worker_env)
    assert other.returncode == 0, other.stderr
    assert "crawl 'proxy_pages' uses proxy pool 'shared' (FLEET_PROXY_POOL), not 'spare'" \
        in other.stderr
    # the crawl's own pool: no warning
    own = run_scrapy(TEST_PROJECT, ["fleet", "proxies", "add", "proxy_pages", C, *base,
                                    "-s", "FLEET_PROXY_POOL=shared"], worker_env)
    assert own.returncode == 0 and "warning" not in own.stderr, own.stderr
