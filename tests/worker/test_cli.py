"""The two command forms as a user meets them: help texts, --version, the settings listing,
standard input as ``-``, a crawl id with no state, a URL that is not Redis (issue 9).

Real processes: ``python -m scrapy_fleet.commands.cli`` (the ``scrapy-fleet`` console
script) and ``scrapy fleet`` in the example project, against a real redis-server and, for
"not Redis", a real HTTP server (the ``not_redis`` fixture).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import EXAMPLE_PROJECT, run_scrapy, scrapy_command

from scrapy_fleet.catalog import SETTINGS, format_default
from scrapy_fleet.commands import cli as cli_module
from scrapy_fleet.frontier.admin import FrontierAdmin

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]
PASSWORD = "pw-9k2-secret"  # must never appear in the output


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def scrapy(env: dict[str, str], *args: str,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``scrapy ARGS`` in the example project, with *stdin* as standard input."""
    return subprocess.run(scrapy_command(*args), cwd=EXAMPLE_PROJECT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


# -- standard input as "-" -------------------------------------------------------------------


def test_a_bare_dash_is_standard_input_for_the_console_script(redis_url):
    result = cli("--redis", redis_url, "push", "dash", "http://h.test/arg", "-",
                 stdin="http://h.test/in1\n# comment\nhttp://h.test/in2\n")
    assert result.returncode == 0, result.stderr
    assert "pushed 3, duplicates 0, rejected 0 (crawl 'dash')" in result.stdout
    assert "rejected" not in result.stderr
    assert FrontierAdmin(redis_url, "dash").status()["queued"] == 3


def test_a_bare_dash_is_standard_input_for_the_project_command(redis_url, worker_env):
    result = scrapy(worker_env, "fleet", "push", "docs", "-", "-s",
                    f"FLEET_REDIS_URL={redis_url}", stdin="http://h.test/a\nhttp://h.test/b\n")
    assert result.returncode == 0, result.stderr
    assert "pushed 2, duplicates 0, rejected 0 (crawl 'docs')" in result.stdout
    assert FrontierAdmin(redis_url, "docs").status()["queued"] == 2


def test_an_empty_url_argument_is_rejected_not_dropped(redis_url):
    result = cli("--redis", redis_url, "push", "empty", "ht tp://x", "http://ok.test/", "")
    assert result.returncode == 1, result.stderr
    assert "pushed 1, duplicates 0, rejected 2" in result.stdout
    assert "line 3: rejected: url must be a non-empty string" in result.stderr


def test_dash_twice_reads_standard_input_once(redis_url):
    result = cli("--redis", redis_url, "push", "dash2", "-", "-f", "-",
                 stdin="http://h.test/1\nhttp://h.test/2\n")
    assert result.returncode == 0, result.stderr
    assert "pushed 2, duplicates 0, rejected 0" in result.stdout


# -- a crawl Redis knows nothing of ----------------------------------------------------------


def test_status_of_a_crawl_without_state_says_so_and_exits_4(redis_url):
    result = cli("--redis", redis_url, "status", "no-such-crawl")
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stdout == ""
    assert re.fullmatch(
        r"error: Redis has no record of crawl 'no-such-crawl' \(key prefix 'fleet'\): nothing "
        r"was pushed to it, it was purged, or Redis lost its data \(restarted without "
        r"persistence, or flushed\) \(this Redis has been up for \d+ (s|min|h|days)\); check "
        r"the crawl id and the key prefix", result.stderr.strip()), result.stderr
    assert cli("--redis", redis_url, "dead", "no-such-crawl").returncode == 4
    assert cli("--redis", redis_url, "status", "no-such-crawl", "--json").returncode == 4
    assert cli("--redis", redis_url, "push", "now-known", "http://h.test/").returncode == 0
    known = cli("--redis", redis_url, "status", "now-known")
    assert known.returncode == 0 and "due 1" in known.stdout
    other_prefix = cli("--redis", redis_url, "--prefix", "other", "status", "now-known")
    assert other_prefix.returncode == 4 and "key prefix 'other'" in other_prefix.stderr


def test_status_after_redis_lost_its_data_does_not_say_nothing_was_pushed(redis_url):
    # issue 19: after Redis restarted without its data, status said "nothing was pushed and
    # no worker ran" of a crawl that had run; Redis cannot tell, so it says what may be
    import redis

    assert cli("--redis", redis_url, "push", "lost", "http://h.test/").returncode == 0
    client = redis.Redis.from_url(redis_url)
    client.flushdb()  # what a restart without persistence leaves
    client.close()
    result = cli("--redis", redis_url, "status", "lost")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "nothing was pushed and no worker ran" not in result.stderr
    assert "Redis has no record of crawl 'lost'" in result.stderr
    assert "or Redis lost its data (restarted without persistence, or flushed)" in result.stderr


def test_watching_a_crawl_without_state_writes_none_of_its_keys(redis_url):
    # top on a mistyped crawl id exits 4 like status; the sampler a monitor runs writes no key
    # of a crawl that has none (it used to leave four keys without a TTL behind)
    import redis

    from scrapy_fleet.keys.crawl import CrawlKeys
    from scrapy_fleet.monitoring.sampler import sample

    client = redis.Redis.from_url(redis_url)
    result = cli("--redis", redis_url, "top", "typo1", "--once")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "Redis has no record of crawl 'typo1'" in result.stderr
    assert sample(client, CrawlKeys("fleet", "typo1")) is False
    assert client.keys("*typo1*") == []
    # once the crawl has state, the sampler samples it (the push sampled this step already:
    # its series and sampling marks are taken away first)
    keys = CrawlKeys("fleet", "typo1")
    assert cli("--redis", redis_url, "push", "typo1", "http://h.test/").returncode == 0
    client.delete(keys.mon, *(keys.series(t) for t in ("10s", "1m", "10m")))
    assert sample(client, keys) is True
    assert client.exists(keys.series("10s")) == 1
    client.close()


def test_project_status_of_a_crawl_without_state_exits_4(redis_url, worker_env):
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "-s",
                                          f"FLEET_REDIS_URL={redis_url}"], worker_env)
    assert result.returncode == 4, result.stderr
    assert "Redis has no record of crawl 'docs'" in result.stderr


# -- something that is not Redis -------------------------------------------------------------


@pytest.mark.parametrize("action", [["status", "c"], ["push", "c", "http://h.test/"],
                                    ["dead", "c"], ["purge", "c", "--yes"]])
def test_a_url_that_is_not_redis_is_one_clear_line_and_exit_2(not_redis, action):
    url = f"redis://fleet:{PASSWORD}@127.0.0.1:{not_redis}/0"
    result = cli("--redis", url, *action)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: redis://fleet:***@127.0.0.1:{not_redis}/0 is not a "
                               "Redis server (FLEET_REDIS_URL): it answered in another "
                               "protocol (Protocol error"), lines[0]
    assert PASSWORD not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_project_command_with_a_url_that_is_not_redis(not_redis, worker_env):
    url = f"redis://:{PASSWORD}@127.0.0.1:{not_redis}/0"
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", "http://h.test/", "-s",
                                          f"FLEET_REDIS_URL={url}"], worker_env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: redis://:***@127.0.0.1:{not_redis}/0 is not a Redis "
                               "server (FLEET_REDIS_URL): it answered in another protocol")
    assert PASSWORD not in result.stderr + result.stdout


@pytest.mark.parametrize("query,option", [("decode_responses=True", "decode_responses"),
                                          ("encoding=utf-16", "encoding"),
                                          ("bogus=1", "bogus")])
def test_url_options_that_break_replies_are_a_usage_error(redis_url, query, option):
    result = cli("--redis", f"{redis_url}?{query}", "push", "opts", "http://h.test/")
    assert result.returncode == 2
    assert f"the URL option {option!r}" in result.stderr
    assert "Traceback" not in result.stderr
    assert FrontierAdmin(redis_url, "opts").status()["queued"] == 0


def test_protocol_3_in_the_url_works(redis_url):
    pushed = cli("--redis", f"{redis_url}?protocol=3", "push", "resp3", "http://h.test/1")
    assert pushed.returncode == 0, pushed.stderr
    status = cli("--redis", f"{redis_url}?protocol=3", "status", "resp3", "--json", "--hosts")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert (data["frontier"]["due"], data["frontier"]["seen"], data["hosts"][0]["host"]) == (
        1, 1, "h.test")


# -- FLEET_QUEUE_MAX=0 and unknown settings --------------------------------------------------


def test_queue_max_0_is_unbounded_for_the_project_push(redis_url, worker_env):
    urls = "".join(f"http://h.test/{n}\n" for n in range(5))
    result = scrapy(worker_env, "fleet", "push", "docs", "-", "--no-wait", "-s",
                    f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_QUEUE_MAX=0", stdin=urls)
    assert result.returncode == 0, result.stderr
    assert "pushed 5, duplicates 0, rejected 0" in result.stdout
    status = scrapy(worker_env, "fleet", "status", "docs", "-s", f"FLEET_REDIS_URL={redis_url}",
                    "-s", "FLEET_QUEUE_MAX=0")
    assert re.search(r"size +5 / unbounded", status.stdout), status.stdout


def test_an_unknown_setting_is_a_warning_naming_the_closest(redis_url, worker_env):
    result = scrapy(worker_env, "fleet", "push", "docs", "http://h.test/", "-s",
                    f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_QUEUE_MAXX=5")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        "warning: Unknown setting FLEET_QUEUE_MAXX ignored: did you mean FLEET_QUEUE_MAX? "
        "(`scrapy fleet settings` or `scrapy-fleet settings` lists every FLEET_* setting)"]


def test_a_setting_name_scrapy_ignores_for_its_case_is_a_warning(tmp_path, worker_env):
    # Scrapy reads only upper-case names of settings.py: FLEET_REDIS_URl would leave the
    # worker on the default Redis without a word (fresh-user trial)
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = caseproj.settings\n")
    (tmp_path / "caseproj").mkdir()
    (tmp_path / "caseproj" / "__init__.py").write_text("")
    (tmp_path / "caseproj" / "settings.py").write_text(
        'ADDONS = {"scrapy_fleet.Addon": 500}\nFLEET_REDIS_URl = "redis://127.0.0.1:1/0"\n'
        "fleet_idle_timout = 3\n")
    result = run_scrapy(tmp_path, ["fleet", "settings"], worker_env)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: Setting FLEET_REDIS_URl in caseproj.settings is ignored: Scrapy reads only "
        "names in upper case (did you mean FLEET_REDIS_URL?)",
        "warning: Setting fleet_idle_timout in caseproj.settings is ignored: Scrapy reads only "
        "names in upper case (did you mean FLEET_IDLE_TIMEOUT?)"]


# -- help, version, settings -----------------------------------------------------------------


def test_no_action_and_an_unknown_option_are_named_as_such(worker_env):
    bare = cli()
    assert bare.returncode == 2
    assert "error: an ACTION is required: one of push, status" in bare.stderr
    assert "proxies" in bare.stderr and "URL" not in bare.stderr.splitlines()[-1]
    project = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", "--bogus"], worker_env)
    assert project.returncode == 2
    assert "error: unrecognized arguments: --bogus" in project.stderr, project.stderr


def test_version_prints_the_package_version():
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"scrapy-fleet {version('scrapy-fleet')}"


def test_console_help_lists_actions_and_exit_statuses():
    result = cli("--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    for name, action in cli_module.ACTIONS.items():
        assert any(re.match(rf"  {name} +{re.escape(action.summary[:30])}", line)
                   for line in lines), name
        assert any(line.startswith(f"  scrapy-fleet {name}") for line in lines), name
    assert "exit statuses:" in lines
    for status, _ in cli_module.EXIT_STATUSES:
        assert any(re.match(rf" +{status}  \S", line) for line in lines), status
    assert max(len(line) for line in lines) <= 80


@pytest.mark.parametrize("args", [["fleet", "--help"], ["fleet", "status", "--help"]])
def test_project_help_keeps_one_usage_per_line(worker_env, args):
    result = run_scrapy(EXAMPLE_PROJECT, args, worker_env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  scrapy fleet status SPIDER [--json] [--hosts]" in lines
    assert "  scrapy fleet dead SPIDER [--limit N] [--json]" in lines
    assert "  scrapy fleet settings [--json]" in lines
    assert "exit statuses:" in lines
    assert any(re.match(r" +4  status, dead, failed, retry, top, recrawl: Redis has no "
                        r"record", line) for line in lines)
    # a help line ending in ':' would be taken for a heading by Scrapy's formatter
    assert any("acl: the crawl uses the proxy pool" in line for line in lines), result.stdout
    assert max(len(line) for line in lines) <= 80


def test_scrapy_command_list_names_every_action(worker_env):
    result = run_scrapy(EXAMPLE_PROJECT, [], worker_env)
    line = next(line for line in result.stdout.splitlines() if line.startswith("  fleet "))
    for name in cli_module.ACTIONS:
        assert re.search(rf"\b{name}\b", line), (name, line)


def _listed(text: str) -> dict[str, str]:
    """name -> "type; default X" line of a settings listing."""
    found = re.findall(r"^  (FLEET_[A-Z0-9_]+) +(.+)$", text, re.M)
    return dict(found)


def test_settings_listing_has_every_setting_with_type_and_default(worker_env):
    console = cli("settings")
    project = run_scrapy(EXAMPLE_PROJECT, ["fleet", "settings"], worker_env)
    assert console.returncode == 0 and project.returncode == 0, project.stderr
    assert console.stdout == project.stdout
    listed = _listed(console.stdout)
    assert list(listed) == [s.name for s in SETTINGS]
    for setting in SETTINGS:
        assert listed[setting.name] == f"{setting.type}; default {format_default(setting.default)}"
    assert setting.meaning in console.stdout
    as_json = json.loads(cli("settings", "--json").stdout)
    assert [row["name"] for row in as_json] == [s.name for s in SETTINGS]
    assert as_json[0]["default"] == SETTINGS[0].default


def test_settings_takes_no_crawl():
    result = cli("settings", "crawl")
    assert result.returncode == 2 and "settings takes no arguments" in result.stderr
    assert cli("status").returncode == 2 and "status needs a CRAWL_ID" in cli("status").stderr


def test_readme_lists_every_exit_status():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text("utf-8")
    section = readme.split("Exit statuses of `scrapy fleet ...`", 1)[1].split("\n\n", 1)[0]
    for status, _ in cli_module.EXIT_STATUSES:
        assert re.search(rf"(^|[;:] ){status} ", section, re.M), status


@pytest.mark.parametrize("project", [False, True])
def test_help_lists_the_proxies_action(worker_env, project):
    """A fresh-user trial: `proxies` (its own parser) was in neither --help."""
    result = (run_scrapy(EXAMPLE_PROJECT, ["fleet", "--help"], worker_env) if project
              else cli("--help"))
    assert result.returncode == 0, result.stderr
    assert "proxies list|add|remove|drain|reset" in result.stdout
    assert re.search(r"^  proxies +show and change the crawl's proxy pool", result.stdout, re.M)


def test_project_status_into_a_closed_pipe_is_quiet(redis_url, worker_env):
    """`scrapy fleet status SPIDER | head` ended in a BrokenPipeError traceback."""
    assert cli("--redis", redis_url, "push", "docs", "http://h.test/").returncode == 0
    import shlex

    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "scrapy", "fleet",
                                                 "status", "docs", "-s",
                                                 f"FLEET_REDIS_URL={redis_url}"])
    # the reader exits at once (long before the command, which starts Scrapy, writes)
    result = subprocess.run(f"{command} | true", shell=True, cwd=EXAMPLE_PROJECT,
                            env=worker_env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


# -- status: one read of the frontier ----------------------------------------------------------


def test_status_reads_the_frontier_once_with_the_same_figures(redis_url, redis_server):
    """One reader of the frontier: ``FrontierAdmin.status`` (``snapshot.read_counts``) and
    the snapshot make the same reads and give the same figures; ``status`` reads the frontier
    once (it read it twice: FrontierAdmin.status, then the snapshot), and its JSON is the
    snapshot's, with one name per figure (no ``totals`` beside ``counters``)."""
    from scrapy_fleet.failures.admin import failed_counts
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    pushed = cli("--redis", redis_url, "push", "once", "http://h.test/a", "http://h.test/b",
                 "http://other.test/c")
    assert pushed.returncode == 0, pushed.stderr
    admin = FrontierAdmin(redis_url, "once")
    client = redis_server.client()
    client.hset(admin.keys.failed_by, mapping={"http/500": 2, "http/404": 1})
    idle_since = admin.server_ms() - 4000
    client.set(admin.keys.idle_since, idle_since)
    client.hset(admin.keys.seeding, mapping={"holder": "w1", "done": 1})
    client.hset(admin.keys.stats, "not-a-number", "x")
    snap = read_snapshot(admin.client, admin.keys)
    counts = admin.status()
    read_at = admin.server_ms()
    # idle_seconds: Redis's clock at each read, minus idle_since (rounded to 0.1 s); the
    # counts after the snapshot, and before the clock read after them
    assert abs(snap["idle_seconds"] - (snap["at"] - idle_since / 1000)) <= 0.051
    assert snap["idle_seconds"] <= counts["idle_seconds"] <= round(
        (read_at - idle_since) / 1000, 1)
    fr = snap["frontier"]
    names = ("queued", "deferred", "leased", "parked", "dead", "size", "seen", "bloom_slices")
    assert tuple(counts[n] for n in names) == tuple(
        fr[n] for n in ("due", "deferred", "leased", "parked", "dead", "size", "seen",
                        "bloom_slices"))
    assert (counts["queued"], counts["size"], counts["seen"]) == (3, 3, 3)
    assert counts["start_requests"] == snap["start_requests"]["state"] == "done"
    assert counts["seeded_by"] == snap["start_requests"]["seeded_by"] == "w1"
    assert counts["counters"]["not-a-number"] == 0
    assert counts["counters"]["pushed"] == snap["counters"]["requests"]["pushed"] == 3
    assert (counts["stored_responses"], counts["stored_bytes"]) == (
        fr["stored"], fr["stored_bytes"]) == (0, 0)
    assert snap["failed_by"] == failed_counts(admin.client, admin.keys) == {
        "http/404": 1, "http/500": 2}
    admin.close()
    # the command: each of the frontier's counts read once (ZCARD of the deferred entries and
    # of the leases; the queued count is a GET: the previous layout's queue ZSET is gone), no
    # second TIME
    client.config_resetstat()
    shown = cli("--redis", redis_url, "status", "once", "--json")
    assert shown.returncode == 0, shown.stderr
    stats = client.info("commandstats")
    assert stats["cmdstat_zcard"]["calls"] == 2, stats
    assert stats["cmdstat_time"]["calls"] == 1, stats
    data = json.loads(shown.stdout)
    assert (data["frontier"]["due"], data["frontier"]["size"],
            data["counters"]["requests"]["pushed"]) == (3, 3, 3)
    assert data["failed_by"] == {"http/404": 1, "http/500": 2}
    assert data["start_requests"] == {"state": "done", "seeded_by": "w1"}
    assert abs(data["idle_seconds"] - (data["at"] - idle_since / 1000)) <= 0.051
    assert not {"totals", "failed", "queued", "delayed", "crawl_id"} & set(data)
    client.close()


def test_acl_prints_the_rules_of_the_crawl(redis_url):
    """``scrapy-fleet acl CRAWL_ID`` prints acl.acl_rule's rule of each role, for the crawl,
    its prefix, the proxy pool and a cluster URL; no Redis needed."""
    from scrapy_fleet import acl

    shown = cli("--redis", "redis://127.0.0.1:1/0", "--prefix", "p", "acl", "docs")
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if not line.startswith("# ")]
    assert lines == [f"ACL SETUSER fleet-{role} on >PASSWORD "
                     + acl.acl_rule(role, key_prefix="p", crawl_id="docs")
                     for role in ("worker", "monitor", "admin")]
    pool = cli("--redis", "redis+cluster://127.0.0.1:7000", "acl", "docs", "--role", "worker",
               "--pool", "shared")
    assert pool.returncode == 0, pool.stderr
    assert pool.stdout.splitlines()[1].endswith(acl.acl_rule(
        "worker", crawl_id="docs", cluster=True, proxies=True, pool="shared"))
    assert "~fleet:{proxypool:shared}:*" in pool.stdout and "+cluster|slots" in pool.stdout
    assert cli("acl").returncode == 2 and "acl takes one CRAWL_ID" in cli("acl").stderr


def test_a_command_does_not_load_scrapys_download_handlers(redis_url, worker_env):
    """A command checks FLEET_PROXY_BAN_POLICY by importing its class (the default,
    proxies/verdicts.py, too) but downloads nothing: Scrapy's HTTP/1.1 handler, whose import
    (TLS context factories, a deprecation shim walking the stack) is a large part of a
    command's start-up, is left to the workers' downloader."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "scrapy", "fleet",
                             "status", "docs", "-s", f"FLEET_REDIS_URL={redis_url}"],
                            cwd=EXAMPLE_PROJECT, env=worker_env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 4, result.stderr[-2000:]  # a crawl without state
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "scrapy_fleet.config" in imported
    assert "scrapy.core.downloader.handlers.http11" not in imported
    assert "scrapy.core.downloader.contextfactory" not in imported


@pytest.mark.parametrize("action", [["status", "docs"], ["push", "docs", "http://h.test/"],
                                    ["failed", "docs"]])
def test_a_bad_jsonl_path_is_refused_by_a_command(redis_url, worker_env, action):
    """FLEET_JSONL_PATH is checked with the fleet's settings (jsonl_settings.py, composed by
    FleetConfig), so a command refuses a path the workers would refuse, before any write."""
    result = run_scrapy(EXAMPLE_PROJECT, ["fleet", *action, "-s", f"FLEET_REDIS_URL={redis_url}",
                                          "-s", "FLEET_JSONL_PATH=out-%(bogus)s.jsonl"],
                        worker_env)
    assert result.returncode == 2, result.stderr
    assert "FLEET_JSONL_PATH='out-%(bogus)s.jsonl' is invalid: placeholders may be" in \
        result.stderr
    assert FrontierAdmin(redis_url, "docs").status()["queued"] == 0
