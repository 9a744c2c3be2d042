# ruff: noqa: F811 - the fixtures of proxyfixtures are imported into this module
"""Least privilege: a crawl and the commands run as ACL users with the rules of
docs/deployment.md (scrapy_fleet/acl.py), and a missing permission is one error at start."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest
import redis
from proxyfixtures import proxysite, tinyproxy  # noqa: F401 - fixtures
from support import (
    EXAMPLE_PROJECT,
    TEST_PROJECT,
    read_items,
    run_scrapy,
    start_worker,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet import acl
from scrapy_fleet.errors import RedisPermissionError
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ProxyPoolKeys


def without(rule: str, command: str) -> str:
    """*rule* without its ``+command`` word."""
    words = rule.split()
    assert f"+{command}" in words
    return " ".join(w for w in words if w != f"+{command}")




def test_every_probe_line_has_its_command_s_arity(redis_url):
    """Redis 7.0's redis.acl_check_cmd does not check arity; a short line crashes Redis."""
    client = redis.Redis.from_url(redis_url)
    for name, line in acl.PROBE_LINES.items():
        command, _, sub = name.partition("|")
        info = client.execute_command("COMMAND", "INFO", command)[command]
        arity = int(info["arity"])
        if sub:
            subs = {s[0].decode(): int(s[1]) for s in info["subcommands"]}
            arity = subs[name]
        words = len(line.split())
        assert words >= abs(arity) if arity < 0 else words == arity, (name, line, arity)
    for role in ("worker", "monitor", "admin"):
        for name in (*acl.script_commands(role), *acl.pool_commands(role)):
            assert name in acl.PROBE_LINES, name
    client.close()


def test_the_probe_names_each_command_the_rule_would_miss(acl_users):
    """The documented rule passes the probe; the rule without any one of its commands fails
    it, naming that command: the probe checks every command of the rule, no more."""
    keys = CrawlKeys("fleet", "docs")
    for role in ("worker", "admin"):  # a monitor runs no script: it is not probed
        url = acl_users(f"full-{role}", acl.acl_rule(role, optional=False))
        admin = FrontierAdmin(url, "docs")
        admin.ping(role)
        admin.close()
        for name in acl.commands(role):
            if name in ("ping", "client|setname", "evalsha", "script|load"):
                continue  # the probe needs them to run at all: checked below
            rule = without(acl.acl_rule(role, optional=False), name)
            client = redis.Redis.from_url(acl_users(f"less-{role}", rule))
            with pytest.raises(RedisPermissionError) as info:
                acl.check_sync(client, keys, role)
            assert f"may not run {name} on" in str(info.value), (role, name)
            client.close()
    rule = without(acl.acl_rule("worker"), "evalsha")
    client = redis.Redis.from_url(acl_users("no-evalsha", rule))
    with pytest.raises(RedisPermissionError, match="'evalsha' command"):
        acl.check_sync(client, keys, "worker")
    # another crawl's keys are out of a per-crawl rule's pattern
    url = acl_users("docs-only", acl.acl_rule("worker", crawl_id="docs"))
    client = redis.Redis.from_url(url)
    acl.check_sync(client, keys, "worker")
    with pytest.raises(RedisPermissionError, match=r"may not access the keys of crawl 'other'"):
        acl.check_sync(client, CrawlKeys("fleet", "other"), "worker")
    client.close()


@pytest.mark.slow
def test_crawl_and_commands_as_least_privileged_users(acl_users, site_server, worker_env,
                                                      tmp_path):
    worker = acl_users("fleet-worker", acl.acl_rule("worker", crawl_id="docs"))
    monitor = acl_users("fleet-monitor", acl.acl_rule("monitor", crawl_id="docs"))
    admin_url = acl_users("fleet-admin", acl.acl_rule("admin", crawl_id="docs"))
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site_server.start_url,
                                          "-s", f"FLEET_REDIS_URL={worker}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    outs = [tmp_path / f"out-{n}.jsonl" for n in range(2)]
    logs = [tmp_path / f"w-{n}.log" for n in range(2)]
    procs = [start_worker(EXAMPLE_PROJECT, "docs", {
        "FLEET_REDIS_URL": worker, "FLEET_IDLE_TIMEOUT": 1, "FLEET_JSONL_PATH": outs[n]},
        worker_env, logs[n]) for n in range(2)]
    codes = wait_all(procs, 90)
    for n, code in enumerate(codes):
        assert code == 0, tail(logs[n])
        assert "NOPERM" not in tail(logs[n], 200000)
    urls = [i["url"] for i in read_items(outs)]
    assert set(urls) == site_server.expected_urls
    assert collections.Counter(urls).most_common(1)[0][1] == 1
    status = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "--json", "-s",
                                          f"FLEET_REDIS_URL={monitor}"], worker_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["frontier"]["due"] == 0
    dead = run_scrapy(EXAMPLE_PROJECT, ["fleet", "dead", "docs", "-s",
                                        f"FLEET_REDIS_URL={monitor}"], worker_env)
    assert dead.returncode == 0 and "0 dead letter(s) shown" in dead.stdout, dead.stderr
    # the read-only user cannot push: one error naming what it lacks, nothing written
    denied = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site_server.url + "x",
                                          "-s", f"FLEET_REDIS_URL={monitor}"], worker_env)
    assert denied.returncode == 2
    assert "'evalsha' command" in denied.stderr, denied.stderr
    assert "Traceback" not in denied.stderr
    # a monitor without one of its reads: one line naming it (while the crawl has state)
    blind = acl_users("blind", without(acl.acl_rule("monitor", crawl_id="docs"), "zcard"))
    status = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "-s",
                                          f"FLEET_REDIS_URL={blind}"], worker_env)
    assert status.returncode == 2
    assert "'zcard' command" in status.stderr and "Traceback" not in status.stderr
    assert "(status runs as the monitor role, which needs " in status.stderr  # and its rule
    assert "`scrapy fleet acl` prints its rule" in status.stderr
    # the admin user runs the monitor's reads too
    as_admin = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "-s",
                                            f"FLEET_REDIS_URL={admin_url}"], worker_env)
    assert as_admin.returncode == 0, as_admin.stderr
    # the admin user sets a budget (issue 34: a host raised is served again, ZADD)
    budget = run_scrapy(EXAMPLE_PROJECT, ["fleet", "budget", "docs", "--host", "h.example",
                                          "--pages", "5", "-s",
                                          f"FLEET_REDIS_URL={admin_url}"], worker_env)
    assert budget.returncode == 0, budget.stderr
    # a worker cannot purge (SCAN, UNLINK); the admin user can
    refused = run_scrapy(EXAMPLE_PROJECT, ["fleet", "purge", "docs", "--yes", "-s",
                                           f"FLEET_REDIS_URL={worker}"], worker_env)
    assert refused.returncode == 2 and "scan" in refused.stderr, refused.stderr
    purged = run_scrapy(EXAMPLE_PROJECT, ["fleet", "purge", "docs", "--yes", "-s",
                                          f"FLEET_REDIS_URL={admin_url}"], worker_env)
    assert purged.returncode == 0, purged.stderr
    assert "purged" in purged.stdout


@pytest.mark.slow
def test_a_missing_permission_is_one_error_at_start(acl_users, redis_url, site_server,
                                                    worker_env, tmp_path):
    full = acl_users("pusher", acl.acl_rule("worker"))
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site_server.start_url,
                                          "-s", f"FLEET_REDIS_URL={full}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    # ZADD is called by frontier.lua only after its first writes (a lease, a push)
    lacking = acl_users("no-zadd", without(acl.acl_rule("worker"), "zadd"))
    log = tmp_path / "w.log"
    proc = start_worker(EXAMPLE_PROJECT, "docs", {"FLEET_REDIS_URL": lacking,
                                                  "FLEET_IDLE_TIMEOUT": 2}, worker_env, log)
    assert wait_all([proc], 60) == [1]
    text = tail(log, 100000)
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "Fleet worker cannot start" in errors[0] and "may not run zadd" in errors[0]
    assert "Traceback" not in text
    status = FrontierAdmin(redis_url, "docs").status()
    assert status["queued"] == 1 and status["counters"].get("leased", 0) == 0  # untouched


def test_the_pool_probe_names_each_pool_command_the_rule_would_miss(acl_users):
    """With the proxy pool, a worker's and an admin's rule cover the pool's keys and the
    commands of lua/proxies.lua; without any one of them the probe names it, on the pool's
    keys; a rule without the pool's key pattern is refused the pool's keys."""
    keys, pool = CrawlKeys("fleet", "docs"), ProxyPoolKeys("fleet", "docs")
    assert "hkeys" in acl.pool_commands("worker")  # the first choice for a site lists exits
    assert acl.pool_commands("monitor") == []
    for role in ("worker", "admin"):
        rule = acl.acl_rule(role, crawl_id="docs", proxies=True, optional=False)
        assert "~fleet:{proxypool:docs}:*" in rule.split()
        client = redis.Redis.from_url(acl_users(f"pool-{role}", rule))
        acl.check_sync(client, keys, role, pool=pool)
        client.close()
        for name in acl.pool_commands(role):
            if name in ("evalsha", "script|load"):
                continue
            client = redis.Redis.from_url(acl_users(f"nopool-{role}", without(rule, name)))
            with pytest.raises(RedisPermissionError) as info:
                acl.check_sync(client, None, role, pool=pool)
            assert f"may not run {name} on the proxy pool's keys" in str(info.value), name
            client.close()
    client = redis.Redis.from_url(acl_users("crawl-only", acl.acl_rule("worker",
                                                                       crawl_id="docs")))
    acl.check_sync(client, keys, "worker")
    with pytest.raises(RedisPermissionError, match=r"may not access the keys of proxy pool"):
        acl.check_sync(client, keys, "worker", pool=pool)
    client.close()


@pytest.mark.slow
def test_proxy_pool_crawl_and_commands_as_least_privileged_users(
        acl_users, tinyproxy, proxysite, worker_env, tmp_path):
    """A worker made from the printed rule (proxies=True) crawls through real tinyproxy
    exits; the proxies actions run as the admin rule; a worker lacking a pool command gets
    the one start-up error instead of waiting on the pool for ever."""
    p2, p3 = tinyproxy("127.0.0.2"), tinyproxy("127.0.0.3")
    site = proxysite({"pages": {"127.0.0.1": 12}})
    proxies = f"{p2.url()},{p3.url()}"
    # the rules as `scrapy fleet acl SPIDER` prints them for the project's settings
    printed = run_scrapy(TEST_PROJECT, ["fleet", "acl", "proxy_pages", "-s",
                                        f"FLEET_PROXIES={proxies}"], worker_env)
    assert printed.returncode == 0, printed.stderr
    rules = dict(line.split(" on >PASSWORD ", 1) for line in printed.stdout.splitlines()
                 if line.startswith("ACL SETUSER "))
    rule = rules["ACL SETUSER fleet-worker"]
    assert rule == acl.acl_rule("worker", crawl_id="proxy_pages", proxies=True)
    assert "~fleet:{proxypool:proxy_pages}:*" in rule.split()
    assert "proxypool" not in rules["ACL SETUSER fleet-monitor"]
    worker = acl_users("fleet-worker", rule)
    admin = acl_users("fleet-admin", rules["ACL SETUSER fleet-admin"])
    monitor = acl_users("fleet-monitor", rules["ACL SETUSER fleet-monitor"])

    def fleet(url: str, *args: str) -> Any:
        return run_scrapy(TEST_PROJECT, ["fleet", *args, "-s", f"FLEET_REDIS_URL={url}",
                                         "-s", f"FLEET_PROXIES={proxies}"], worker_env)

    pushed = fleet(worker, "push", "proxy_pages", site.urls[0] + "site/")
    assert pushed.returncode == 0, pushed.stderr
    out, log = tmp_path / "out.jsonl", tmp_path / "w.log"
    proc = start_worker(TEST_PROJECT, "proxy_pages", {
        "FLEET_REDIS_URL": worker, "FLEET_PROXIES": proxies, "FLEET_IDLE_TIMEOUT": 1,
        "FLEET_JSONL_PATH": out, "LOG_LEVEL": "INFO"}, worker_env, log)
    assert wait_all([proc], 120) == [0], tail(log)
    text = tail(log, 10**7)
    assert "NOPERM" not in text and "Proxy pool unavailable" not in text, text[-3000:]
    pages = [i for i in read_items([out]) if "url" in i]
    assert len({i["url"] for i in pages}) == 13
    assert {r["addr"] for r in site.requests()} <= {"127.0.0.2", "127.0.0.3"}  # via exits
    # every proxies action as the admin role
    listed = fleet(admin, "proxies", "list", "proxy_pages", "--json")
    assert listed.returncode == 0, listed.stderr
    snap = json.loads(listed.stdout)
    assert sum(e["ok"] for e in snap["exits"]) >= 13
    drained = fleet(admin, "proxies", "drain", "proxy_pages", p2.url())
    assert drained.returncode == 0 and "draining 1 exit(s)" in drained.stdout, drained.stderr
    added = fleet(admin, "proxies", "add", "proxy_pages", p2.url())
    assert added.returncode == 0, added.stderr
    reset = fleet(admin, "proxies", "reset", "proxy_pages")
    assert reset.returncode == 0 and "reset 2 exit(s)" in reset.stdout, reset.stderr
    removed = fleet(admin, "proxies", "remove", "proxy_pages", p3.url())
    assert removed.returncode == 0 and "removed 1 exit(s)" in removed.stdout, removed.stderr
    # a monitor may not: one error line naming the pool, nothing read
    refused = fleet(monitor, "proxies", "list", "proxy_pages")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "'evalsha' command" in refused.stderr, refused.stderr
    assert "on the keys of proxy pool 'proxy_pages'" in refused.stderr, refused.stderr
    # a worker without HKEYS (called by the pool's first choice for a site, after the
    # reports it carries are written): one error at start
    lacking = acl_users("no-hkeys", without(rule, "hkeys"))
    log2 = tmp_path / "w2.log"
    proc = start_worker(TEST_PROJECT, "proxy_pages", {
        "FLEET_REDIS_URL": lacking, "FLEET_PROXIES": proxies, "FLEET_IDLE_TIMEOUT": 2},
        worker_env, log2)
    assert wait_all([proc], 60) == [1], tail(log2)
    text = tail(log2, 10**6)
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "Fleet worker cannot start" in errors[0]
    assert "may not run hkeys on the proxy pool's keys" in errors[0], errors[0]
    assert "Traceback" not in text


def test_the_documented_rules_are_the_printed_ones():
    """docs/deployment.md shows acl.acl_rule's output (the lists follow the Lua scripts)."""
    from support import REPO_ROOT

    text = (REPO_ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    rules = [acl.acl_rule(role) for role in ("worker", "monitor", "admin")]
    rules += [acl.acl_rule(role, proxies=True) for role in ("worker", "admin")]
    for rule in rules:
        assert f"on >PASSWORD {rule}\n" in text, rule


def _acl_log_count(client: redis.Redis, user: str) -> int:
    """How many refusals Redis's ACL LOG holds for *user* (similar entries are grouped)."""
    return sum(int(e["count"]) for e in client.acl_log() if e["username"] == user)


def test_a_read_only_monitor_stops_sampling_after_one_noperm(acl_users, redis_server,
                                                             redis_url):
    """The read-only monitor role may not run lua/sample.lua (a write): the sampler says so
    once and stops (one refusal in Redis's ACL LOG, however long it runs), and writes
    nothing; a worker's user samples."""
    from scrapy_fleet.monitoring.source import FleetSource, Sampling

    keys = CrawlKeys("fleet", "docs")
    admin = redis_server.client()
    admin.acl_log_reset()
    admin.hset(keys.stats, "pages", 3)  # a crawl with state
    monitor_url = acl_users("fleet-monitor", acl.acl_rule("monitor", crawl_id="docs"))
    client = redis.Redis.from_url(monitor_url)
    said: list[str] = []
    sampling = Sampling(client, keys, interval=0.02, say=said.append).start()
    sampling._thread.join(10)
    assert not sampling._thread.is_alive()
    assert len(said) == 1 and said == [sampling.denied], said
    assert "may not sample the time series" in said[0] and "evalsha" in said[0], said
    assert _acl_log_count(admin, "fleet-monitor") == 1
    assert not admin.exists(keys.series("10s"), keys.mon)  # nothing written
    # the views read on as the monitor
    snap = FleetSource(client, keys).snapshot()
    assert snap["counters"]["pages"] == 3, snap["counters"]
    client.close()
    # a worker's user runs the sampler: the series go on
    worker = redis.Redis.from_url(acl_users("fleet-worker", acl.acl_rule("worker")))
    sampling = Sampling(worker, keys, interval=0.02, say=said.append).start()
    wait_until(lambda: sampling.samples, 10, "a sample", 0.02)
    sampling.stop()
    assert sampling.samples >= 1 and sampling.denied is None and len(said) == 1
    assert admin.strlen(keys.series("10s")) > 0
    worker.close()
    admin.close()


@pytest.mark.slow
def test_monitor_process_as_the_read_only_user(acl_users, redis_server, redis_url,
                                               site_server, worker_env):
    """``scrapy-fleet monitor`` as the monitor role: /metrics and the series the workers'
    calls sampled are served, and the sampler's refusal is one warning line."""
    import re
    import signal
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    worker = acl_users("fleet-worker", acl.acl_rule("worker", crawl_id="docs"))
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", site_server.start_url,
                                          "-s", f"FLEET_REDIS_URL={worker}"], worker_env)
    assert pushed.returncode == 0, pushed.stderr  # a push samples the series too
    monitor = acl_users("fleet-monitor", acl.acl_rule("monitor", crawl_id="docs"))
    reset = redis_server.client()
    reset.acl_log_reset()
    reset.close()
    cli = str(Path(sys.executable).parent / "scrapy-fleet")
    proc = subprocess.Popen([cli, "--redis", monitor, "monitor", "docs", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"dashboard (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        with urllib.request.urlopen(match.group(1) + "metrics", timeout=15) as resp:
            metrics = resp.read().decode()
        assert "scrapy_fleet_up 1" in metrics and "scrapy_fleet_runnable_requests" in metrics
        url = match.group(1) + "api/series?name=depth_due&tier=10s"
        with urllib.request.urlopen(url, timeout=15) as resp:
            points = json.loads(resp.read())["series"]["depth_due"]
        assert [v for _, v in points if v is not None] == [1], points  # the push's sample
        admin = redis_server.client()
        wait_until(lambda: _acl_log_count(admin, "fleet-monitor"), 10,
                   "the monitor's denial in the ACL log", 0.05)
        admin.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: the Redis user may not sample "
                                                   "the time series"), err


def test_a_least_privileged_worker_puts_requests_back_at_the_head_of_their_buckets(
        acl_users, redis_server):
    """A released lease and a reclaimed one go back to the head of their bucket (LPUSH):
    the worker's rule allows every command its calls run, or the script would fail half-way,
    after the lease was deleted, and lose the request."""
    from scrapy import Request

    from scrapy_fleet import codec
    from scrapy_fleet.frontier.bloom import bloom_key
    from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams

    url = acl_users("fleet-worker-back", acl.acl_rule("worker", crawl_id="back"))
    fr = FrontierAdmin(url, "back", params=FrontierParams(lease_timeout=30.0))
    fr.push([(bloom_key(u.encode()), 0, codec.encode(Request(u)), 0, "a.test")
             for u in ("http://a.test/1", "http://a.test/2")])
    first, second = fr.call(CallBatch(take=2), worker="w").leased
    released = fr.call(CallBatch(releases=[(first.entry_id, first.token)]), worker="w")
    assert released.released == 1
    redis_server.client().zadd(fr.keys.leases, {second.entry_id: 1})  # its lease expired
    redis_server.client().delete(fr.keys.next_due)  # (written by hand: the calls' bound goes)
    again = fr.call(CallBatch(take=2), worker="w2")
    assert again.reclaimed == 1
    assert sorted(e.entry_id for e in again.leased) == sorted([first.entry_id, second.entry_id])
    fr.call(CallBatch(acks=[(e.entry_id, e.token) for e in again.leased]), worker="w2")
    status = fr.status()
    assert (status["queued"], status["leased"], status["dead"]) == (0, 0, 0)


def test_every_command_a_script_computes_is_named_for_the_rules():
    """acl.py reads the scripts' commands from their source: a redis.call whose command is
    computed must be frontier.lua's call_many (its callers name the command) or carry an
    ``-- acl: CMD`` note, else a least-privileged user would fail half-way through a call."""
    import re

    from scrapy_fleet.lua import sources

    for script in ("frontier.lua", "failed_retry.lua", "politeness.lua", "seeding.lua",
                   "bloom_add.lua", "proxies.lua", "sample.lua"):
        lines = sources.source(script).splitlines()
        for n, line in enumerate(lines):
            m = re.search(r"redis\.p?call\(\s*([^'\"\s][^,)]*)", line)
            if m:  # (the note on this line or one of the 10 before it)
                noted = any("-- acl:" in before for before in lines[max(0, n - 10):n + 1])
                assert m.group(1) == "cmd" or noted, (script, line)


def test_pause_resume_and_host_block_run_as_admin_not_as_monitor(acl_users, redis_url, capsys):
    """Crawl control (docs/control.md) needs the admin role; the monitor reads it."""
    from support import host_entry

    from scrapy_fleet.commands import cli

    FrontierAdmin(redis_url, "docs").push([host_entry("http://a.test/1")])
    admin_url = acl_users("fleet-admin", acl.acl_rule("admin", crawl_id="docs"))
    monitor_url = acl_users("fleet-monitor", acl.acl_rule("monitor", crawl_id="docs"))
    assert cli.main(["--redis", monitor_url, "pause", "docs"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "admin" in err, err
    assert cli.main(["--redis", admin_url, "pause", "docs", "--reason", "acl"]) == 0
    assert cli.main(["--redis", admin_url, "host", "block", "docs", "a.test"]) == 0
    capsys.readouterr()
    assert cli.main(["--redis", monitor_url, "status", "docs", "--json"]) == 0
    ctl = json.loads(capsys.readouterr().out)["control"]
    assert ctl["paused"] and ctl["why"] == "acl" and list(ctl["hosts"]) == ["a.test"]
    assert cli.main(["--redis", admin_url, "resume", "docs"]) == 0
    assert cli.main(["--redis", admin_url, "host", "unblock", "docs", "a.test"]) == 0
