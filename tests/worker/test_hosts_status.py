"""``scrapy-fleet status --hosts`` (a real command process) shows the per-host politeness state
that frontier calls wrote in a real redis-server (split from lua/test_hosts.py, which calls the
scripts directly)."""

from __future__ import annotations

import json
import subprocess
import sys

from support import host_entry as entry

from scrapy_fleet.frontier.admin import FrontierAdmin


def test_status_hosts_shows_per_host_state(redis_url):
    admin = FrontierAdmin(redis_url, "hostview")
    admin.push([entry("http://a.test/1"), entry("http://a.test/2"), entry("http://b.test/1")])
    result = subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                             redis_url, "status", "hostview", "--hosts", "--json"],
                            capture_output=True, text=True, timeout=60)
    rows = {r["host"]: r for r in json.loads(result.stdout)["hosts"]}
    assert (rows["a.test"]["queued"], rows["b.test"]["queued"]) == (2, 1)
