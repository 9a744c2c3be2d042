"""The push helper: line validation, exit statuses, both command forms, status and purge."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from support import EXAMPLE_PROJECT, TEST_PROJECT, free_port, run_scrapy

from scrapy_fleet import codec
from scrapy_fleet.commands.push import default_fingerprinter, push_lines
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def test_console_script_pushes_good_lines_around_bad_ones(redis_url, tmp_path: Path):
    urls = tmp_path / "urls.txt"
    urls.write_text("\n".join([
        "http://h.test/1",
        "# a comment",
        "not-a-url",
        '{"url": "http://h.test/2", "priority": 5}',
        "",
        '{"url": "http://h.test/3", "bogus": 1}',
        "http://h.test/1",
    ]) + "\n")
    result = cli("--redis", redis_url, "push", "crawl1", "http://h.test/0", "-f", str(urls))
    assert result.returncode == 1
    assert "line 4: rejected: url has no scheme" in result.stderr
    assert "line 7: rejected: unknown field(s): bogus" in result.stderr
    assert "pushed 3, duplicates 1, rejected 2" in result.stdout
    status = FrontierAdmin(redis_url, "crawl1").status()
    assert status["queued"] == 3


def test_json_words_and_strings_take_the_json_path_of_a_real_push(redis_url, tmp_path: Path):
    """Through the push helper (whose plain-URL fast path once took every line not starting
    with { or [): null, true and a number are refused as JSON, a quoted URL is pushed."""
    lines = tmp_path / "json.txt"
    lines.write_text('null\n"http://h.test/q"\ntrue\n12\nhttp://h.test/plain\n')
    result = cli("--redis", redis_url, "push", "words", "-f", str(lines))
    assert result.returncode == 1
    assert ("line 1: rejected: a JSON line must be an object (a request) or a string (its "
            "URL), not null") in result.stderr
    assert "line 3: rejected: a JSON line must be an object" in result.stderr
    assert "line 4: rejected: a JSON line must be an object" in result.stderr
    assert "url has no scheme" not in result.stderr
    assert "pushed 2, duplicates 0, rejected 3" in result.stdout
    assert FrontierAdmin(redis_url, "words").status()["queued"] == 2


def test_lines_that_are_not_utf8_are_rejected_alone(redis_url, tmp_path: Path):
    data = tmp_path / "mixed.txt"
    data.write_bytes(b"http://h.test/ok1\nhttp://h.test/\xfb\xfe\xff\nhttp://h.test/ok2\n")
    result = cli("--redis", redis_url, "push", "bytes", "-f", str(data))
    assert result.returncode == 1
    assert "line 2: rejected: line is not valid UTF-8" in result.stderr
    assert "pushed 2, duplicates 0, rejected 1" in result.stdout
    assert "Traceback" not in result.stderr


def test_console_script_reads_stdin_and_exits_0_when_all_good(redis_url):
    result = cli("--redis", redis_url, "push", "crawl2", "-f", "-",
                 stdin="http://h.test/a\nhttp://h.test/b\n")
    assert result.returncode == 0, result.stderr
    assert "pushed 2, duplicates 0, rejected 0" in result.stdout
    status = cli("--redis", redis_url, "status", "crawl2", "--json")
    data = json.loads(status.stdout)
    fr = data["frontier"]
    assert (fr["due"], fr["leased"], fr["dead"], fr["seen"]) == (2, 0, 0, 2)


def test_missing_redis_is_a_clear_error():
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = cli("--redis", url, "push", "c", "http://h.test/")
    assert result.returncode == 2
    assert f"cannot reach Redis at {url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_redis_url_is_a_usage_error():
    result = cli("--redis", "http://nope", "status", "c")
    assert result.returncode == 2
    assert "--redis='http://nope' is invalid" in result.stderr


def test_project_command_push_status_purge(redis_url, worker_env):
    args = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    pushed = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", "http://h.test/x",
                                          "http://h.test/y", *args], worker_env)
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed 2, duplicates 0, rejected 0 (crawl 'docs')" in pushed.stdout
    status = run_scrapy(EXAMPLE_PROJECT, ["fleet", "status", "docs", *args], worker_env)
    assert "due 2 " in status.stdout and "seen 2" in status.stdout, status.stdout
    declined = run_scrapy(EXAMPLE_PROJECT, ["fleet", "purge", "docs", *args], worker_env)
    assert declined.returncode == 1 and "purge cancelled" in declined.stdout
    assert FrontierAdmin(redis_url, "docs").status()["queued"] == 2
    purged = run_scrapy(EXAMPLE_PROJECT, ["fleet", "purge", "docs", "--yes", *args], worker_env)
    assert purged.returncode == 0 and "purged" in purged.stdout
    assert FrontierAdmin(redis_url, "docs").status()["queued"] == 0
    bad_cb = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs",
                                          '{"url": "http://h.test/cb", "callback": "nope"}',
                                          *args], worker_env)
    assert bad_cb.returncode == 1
    assert "callback 'nope': the spider has no such method" in bad_cb.stderr
    unknown = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "nope", "http://h.test/", *args],
                         worker_env)
    assert unknown.returncode == 2 and "no spider named 'nope'" in unknown.stderr


def test_project_push_checks_cb_kwargs_against_the_callback(redis_url, worker_env):
    # a cb_kwargs the callback cannot take would fail in every worker (TypeError): refused at
    # push time, like an unknown callback (fresh-user trial); **kwargs takes anything
    args = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    line = '{"url": "http://h.test/k", "cb_kwargs": {"extra": 1}}'
    refused = run_scrapy(TEST_PROJECT, ["fleet", "push", "fetch", line, *args], worker_env)
    assert refused.returncode == 1, refused.stderr
    assert ("line 1: rejected: cb_kwargs do not fit callback 'parse': got an unexpected "
            "keyword argument 'extra'") in refused.stderr
    accepted = run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", line, *args], worker_env)
    assert accepted.returncode == 0, accepted.stderr
    assert "pushed 1, duplicates 0, rejected 0" in accepted.stdout


def test_project_command_uses_the_crawl_id_setting(redis_url, worker_env):
    args = ["-s", f"FLEET_REDIS_URL={redis_url}", "-s", "FLEET_CRAWL_ID=docs-2026"]
    run_scrapy(EXAMPLE_PROJECT, ["fleet", "push", "docs", "http://h.test/z", *args], worker_env)
    assert FrontierAdmin(redis_url, "docs-2026").status()["queued"] == 1
    assert FrontierAdmin(redis_url, "docs").status()["queued"] == 0


def test_acl_user_password_and_unix_socket_urls(redis_server, tmp_path):
    """redis:// with user and password (ACL) and unix:// sockets reach the same frontier."""
    client = redis_server.client()
    client.execute_command("ACL", "SETUSER", "fleetuser", "on", ">s3cret", "~*", "&*", "+@all")
    try:
        url = f"redis://fleetuser:s3cret@127.0.0.1:{redis_server.port}/0"
        ok = cli("--redis", url, "push", "acl", "http://h.test/1")
        assert ok.returncode == 0, ok.stderr
        assert FrontierAdmin(redis_server.url, "acl").status()["queued"] == 1
        bad = cli("--redis", f"redis://fleetuser:wrong@127.0.0.1:{redis_server.port}/0",
                  "status", "acl")
        assert bad.returncode == 2
        assert "refused the credentials" in bad.stderr
        assert "wrong" not in bad.stderr  # the password never appears
        assert "fleetuser:***@" in bad.stderr
    finally:
        client.execute_command("ACL", "DELUSER", "fleetuser")
        client.delete(*client.keys("fleet:{acl}:*"))
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock),
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        result = cli("--redis", f"unix://{sock}?db=0", "push", "sock", "http://h.test/u")
        assert result.returncode == 0, result.stderr
        status = json.loads(cli("--redis", f"unix://{sock}", "status", "sock", "--json").stdout)
        assert status["frontier"]["due"] == 1
    finally:
        proc.terminate()
        proc.wait(10)


def test_priority_beyond_the_limit_is_a_usage_error_and_the_script_refuses_it(redis_url):
    result = cli("--redis", redis_url, "push", "prio", "http://a.test/", "--priority",
                 str(2**40))
    assert result.returncode == 2 and "--priority must be within" in result.stderr
    admin = FrontierAdmin(redis_url, "prio")
    entry = (b"k" * 12, 2**40, codec.encode_dict({"url": "http://a.test/"}), 0, "a.test")
    with pytest.raises(redis.ResponseError, match="bad push entry"):
        admin.push([entry])
    assert admin.size() == 0 and admin.status()["seen"] == 0  # checked before any write


def test_a_queue_member_the_script_did_not_write_is_skipped_not_fatal(redis_url):
    admin = FrontierAdmin(redis_url, "junk")
    admin.push([(b"k" * 12, 0, codec.encode_dict({"url": "http://a.test/1"}), 0, "a.test")])
    client = redis.Redis.from_url(redis_url)
    # a bucket entry without an id, at the head of a better bucket than the pushed one's
    client.rpush(admin.keys.bucket("a.test", 1), "junk")
    client.hset(admin.keys.queue_index, "a.test", f"{10**15 - 1:016d} {10**15:016d}")
    got = []
    for _ in range(3):
        got += admin.call(CallBatch(take=5), worker="w").leased
    assert [codec.decode_dict(e.payload)["url"] for e in got] == ["http://a.test/1"]
    assert admin.status()["counters"]["bad_queue_members"] == 1


def test_a_host_at_its_bound_makes_the_push_wait_politely_and_time_out(redis_url):
    admin = FrontierAdmin(redis_url, "hostfull",
                          params=FrontierParams(queue_max=100, host_queue_max=2))
    lines = [(n, f"http://a.test/{n}") for n in range(1, 4)] + [(4, "http://b.test/")]
    calls = []
    real_push = admin.push

    def push(entries: list) -> object:
        calls.append(len(entries))
        if len(calls) > 50:  # an endless retry fails here instead of hanging the test
            raise AssertionError(f"push retried without end: {calls[:20]}...")
        return real_push(entries)

    admin.push = push  # type: ignore[method-assign]
    report = push_lines(admin, lines, default_fingerprinter(), timeout=1.0, poll=0.25)
    assert (report.stopped_full, report.full_reason, report.first_unpushed_line) == (
        True, "host", 3)
    assert report.full_host == "a.test"
    assert report.pushed == 3  # a.test/1, a.test/2 and b.test
    assert len(calls) <= 8  # one try per poll, not a busy loop


def test_pushed_entries_are_counted_under_the_crawls_host_key(redis_url):
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "hk")
    client.hset(keys.config, mapping={"queue_max": 0, "low_watermark": 0.9,
                                      "host_queue_max": 0, "host_key": "domain"})
    result = cli("--redis", redis_url, "push", "hk", "http://a.example.co.uk/",
                 "http://b.example.co.uk/")
    assert result.returncode == 0, result.stderr
    assert client.hgetall(keys.hostq) == {b"example.co.uk": b"2"}


def test_console_push_uses_the_host_bound_the_workers_stored(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.hset(CrawlKeys("fleet", "hb").config, mapping={
        "queue_max": 0, "low_watermark": 0.9, "host_queue_max": 2, "host_key": "host"})
    result = cli("--redis", redis_url, "push", "hb", "--no-wait",
                 *(f"http://a.test/{n}" for n in range(4)))
    assert result.returncode == 3
    assert "not pushed from line 3 on: its host is at its bound (FLEET_HOST_QUEUE_MAX=2)" in \
        result.stderr
    assert FrontierAdmin(redis_url, "hb").size() == 2


def test_status_and_dead_letters_survive_values_not_written_by_the_fleet(redis_url):
    admin = FrontierAdmin(redis_url, "garbage")
    client = redis.Redis.from_url(redis_url)
    keys = admin.keys
    client.hset(keys.dead, "x1", b"\xc1 not msgpack")
    client.hset(keys.stats, mapping={"acked": "many", "pushed": 3})
    client.set(keys.idle_since, "yesterday")
    dead = list(admin.dead_letters())
    assert [(d["entry_id"], d["reason"]) for d in dead] == [
        ("x1", "unreadable dead letter (not written by the fleet)")]
    status = admin.status()
    assert status["counters"] == {"acked": 0, "pushed": 3}
    assert status["idle_seconds"] is None
    assert cli("--redis", redis_url, "dead", "garbage").returncode == 0
    assert cli("--redis", redis_url, "status", "garbage").returncode == 0


def test_console_script_refuses_a_prefix_with_a_hash_tag(redis_url):
    result = cli("--redis", redis_url, "--prefix", "{bad}", "status", "x")
    assert result.returncode == 2 and "--prefix" in result.stderr


def test_the_host_bound_message_names_the_host(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.hset(CrawlKeys("fleet", "hn").config, mapping={
        "queue_max": 0, "low_watermark": 0.9, "host_queue_max": 1, "host_key": "host"})
    result = cli("--redis", redis_url, "push", "hn", "--no-wait", "http://b.test/",
                 "http://a.test/1", "http://a.test/2", "http://c.test/")
    assert result.returncode == 3
    assert ("not pushed from line 3 on: its host is at its bound (FLEET_HOST_QUEUE_MAX=1): "
            "host 'a.test'") in result.stderr


def test_a_push_cut_off_by_redis_says_what_was_pushed_and_where_to_resume(tmp_path):
    """Redis killed in the middle of a push: the error names the count pushed and the first
    line that may not be (trial: it said only "cannot reach Redis")."""
    from scrapy_fleet.commands.push import default_fingerprinter, push_lines
    from scrapy_fleet.errors import RedisUnavailableError
    from testsite.processes import RedisServer

    server = RedisServer(tmp_path / "r")
    server.start()
    admin = FrontierAdmin(server.url, "cut")

    def lines():
        for n in range(1, 2001):
            if n == 750:
                server.kill()  # batches of 100: 600 or 700 are pushed by now
            yield n, f"http://h{n % 7}.test/p/{n}"

    try:
        with pytest.raises(RedisUnavailableError) as caught:
            push_lines(admin, lines(), default_fingerprinter())
    finally:
        admin.close()
        server.stop()
    message = str(caught.value)
    pushed, first = map(int, re.search(r"; (\d+) pushed and 0 duplicates before \(lines before "
                                       r"(\d+)\); line \2 and those", message).groups())
    assert pushed == first - 1 and first in (601, 701), message
    assert f"with --dont-filter, push from line {first}: up to 100 of them twice" in message
