"""What a new user hit with `push` and `scrapy fleet` (issue 30, "Tried as a new user"): a
byte-order mark, lines already queued in a full frontier, a command outside any project,
a full Redis, callbacks that are not callbacks, requests no worker can send."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from scrapy import Request
from support import (
    TEST_PROJECT,
    run_scrapy,
    scrapy_command,
    start_worker,
    stop_process,
    tail,
    wait_all,
    wait_until,
)

from scrapy_fleet import codec
from scrapy_fleet.failures.admin import failed_records
from scrapy_fleet.frontier.admin import FrontierAdmin
from testsite import generate_site

CLI = [sys.executable, "-m", "scrapy_fleet.commands.cli"]


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=60)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode(errors="replace"),
                                       result.stderr.decode(errors="replace"))


# -- item 6: a UTF-8 byte-order mark -------------------------------------------------------------


def test_a_byte_order_mark_at_the_start_of_a_file_or_stdin_is_dropped(redis_url,
                                                                     tmp_path: Path):
    urls = tmp_path / "bom.txt"
    urls.write_bytes(b"\xef\xbb\xbfhttp://h.test/1\r\nhttp://h.test/2\r\n")
    result = cli("--redis", redis_url, "push", "bom", "-f", str(urls))
    assert result.returncode == 0, result.stderr
    assert "pushed 2, duplicates 0, rejected 0" in result.stdout
    piped = cli("--redis", redis_url, "push", "bom", "-",
                stdin=b'\xef\xbb\xbf{"url": "http://h.test/3"}\nhttp://h.test/1\n')
    assert piped.returncode == 0, piped.stderr
    assert "pushed 1, duplicates 1, rejected 0" in piped.stdout
    # only at the start: a mark inside a line is the line's, refused as such
    inner = tmp_path / "inner.txt"
    inner.write_bytes(b"http://h.test/4\n\xef\xbb\xbfhttp://h.test/5\n")
    later = cli("--redis", redis_url, "push", "bom", "-f", str(inner))
    assert later.returncode == 1
    assert "line 2: rejected: url has no scheme" in later.stderr
    assert FrontierAdmin(redis_url, "bom").size() == 4


# -- item 10: duplicates in a full frontier ------------------------------------------------------


def test_lines_already_queued_count_as_duplicates_in_a_full_frontier(redis_url):
    first = cli("--redis", redis_url, "--queue-max", "3", "push", "fulldup",
                "http://h.test/a", "http://h.test/b", "http://h.test/c")
    assert first.returncode == 0, first.stderr
    again = cli("--redis", redis_url, "--queue-max", "3", "push", "fulldup", "--no-wait",
                "http://h.test/a", "http://h.test/b", "http://h.test/new",
                "http://h.test/c")
    assert again.returncode == 3
    # (one call: line 4, after the first line refused, is judged too: a duplicate)
    assert "pushed 0, duplicates 3, rejected 0" in again.stdout
    assert "not pushed from line 3 on" in again.stderr
    assert FrontierAdmin(redis_url, "fulldup").size() == 3


# -- item 4: outside any project ------------------------------------------------------------------


def test_scrapy_fleet_outside_a_project_says_there_is_no_project(worker_env, tmp_path: Path):
    for args in (["fleet", "status", "x"], ["fleet", "push", "x", "http://h.test/"],
                 ["fleet", "settings"]):
        result = run_scrapy(tmp_path, args, worker_env)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert lines == ["error: not inside a Scrapy project (no scrapy.cfg in this folder or "
                         "a parent, and SCRAPY_SETTINGS_MODULE unset): run `scrapy fleet` in "
                         "the project's folder, or use `scrapy-fleet --redis URL ACTION "
                         "CRAWL_ID`, which needs no project"], result.stderr


# -- item 2: a push into a full Redis -------------------------------------------------------------


@pytest.fixture
def full_redis(redis_url):
    """The test Redis over its maxmemory with noeviction: every write is refused with OOM."""
    client = redis.Redis.from_url(redis_url)
    for chunk in range(25):  # ~5 MB in small fields
        client.hset("filler", mapping={f"{chunk}-{i}": b"x" * 200 for i in range(1000)})
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 2_000_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("probe", b"1")
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.delete("filler")
        client.close()


OOM_LINE = ("error: not pushed from line 1 on: Redis is out of memory (maxmemory): nothing was "
            "pushed; push again once Redis has room")


@pytest.mark.parametrize("known", [False, True], ids=["new-crawl", "known-crawl"])
@pytest.mark.parametrize("flag", [["--no-wait"], ["--timeout", "1"]])
def test_a_push_into_a_full_redis_gives_up_with_status_3(redis_url, worker_env, known, flag,
                                                         request):
    crawl = "fetch"
    args = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    if known:  # a crawl that exists: its claims are there, the push's writes are refused
        first = run_scrapy(TEST_PROJECT, ["fleet", "push", crawl, "http://h.test/0", *args],
                           worker_env)
        assert first.returncode == 0, first.stderr
    request.getfixturevalue("full_redis")
    console = cli("--redis", redis_url, "push", crawl, "http://h.test/1", *flag)
    project = run_scrapy(TEST_PROJECT, ["fleet", "push", crawl, "http://h.test/1", *flag,
                                        *args], worker_env)
    for result in (console, project):
        assert result.returncode == 3, result.stderr
        assert "Traceback" not in result.stderr
        assert f"pushed 0, duplicates 0, rejected 0 (crawl '{crawl}')" in result.stdout
        assert OOM_LINE in result.stderr


def test_a_push_into_a_full_redis_waits_until_it_has_room(redis_url, worker_env, full_redis):
    args = ["-s", f"FLEET_REDIS_URL={redis_url}"]
    proc = subprocess.Popen(scrapy_command("fleet", "push", "fetch", "http://h.test/w", *args),
                            cwd=TEST_PROJECT, env=worker_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        errors = lambda: int(full_redis.info("stats").get("total_error_replies", 0))  # noqa
        before = errors()
        wait_until(lambda: errors() >= before + 2, 60, "Redis refusing the push's writes")
        assert proc.poll() is None  # waiting, not crashed
        full_redis.delete("filler")  # memory is freed: the push goes on
        out, err = proc.communicate(timeout=60)
    finally:
        stop_process(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "Redis is out of memory (OOM, maxmemory): waiting for memory" in err
    assert "pushed 1, duplicates 0, rejected 0 (crawl 'fetch')" in out
    assert FrontierAdmin(redis_url, "fetch").size() == 1
    assert full_redis.get("fleet:{fetch}:spider") is not None  # the crawl's spider recorded


# -- item 5: a callback that is no callback, at the worker ----------------------------------------


@pytest.fixture
def small_site(site_factory, tmp_path):
    generate_site(tmp_path / "www", 3, 1)
    return site_factory(tmp_path / "www")


def test_an_entry_whose_callback_is_no_callback_is_recorded_as_failed(
        redis_url, worker_env, small_site, tmp_path):
    """Entries written without `push`'s checks (an older push, another producer): the worker
    fetches none of them, acknowledges each with a failure record, counts and logs it."""
    urls = [small_site.url + f"site/p/{i}.html" for i in range(3)]
    names = ["__init__", "nope", None]
    admin = FrontierAdmin(redis_url, "fetch")
    entries = []
    for url, name in zip(urls, names, strict=True):
        d = {**Request(url).to_dict(), "callback": name, codec.PUSHED_FIELD: True}
        entries.append((b"", 0, codec.encode_dict(d), 0, "127.0.0.1"))
    assert admin.push(entries).pushed == 3
    log = tmp_path / "worker.log"
    worker = start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "LOG_LEVEL": "INFO"},
        worker_env, log)
    assert wait_all([worker], 120) == [0], tail(log)
    out = log.read_text(errors="replace")
    assert [r["path"] for r in small_site.requests()] == ["/site/p/2.html"]
    rows = {rec.url: rec for _, rec in failed_records(admin.client, admin.keys, None)}
    assert set(rows) == set(urls[:2])
    assert {rec.reason for rec in rows.values()} == {"spider/CallbackError"}
    assert "callback '__init__'" in rows[urls[0]].message
    assert "a special method of Python" in rows[urls[0]].message
    assert "the spider has no such method" in rows[urls[1]].message
    assert out.count("recorded as failed: spider/CallbackError") == 2, out
    assert "'fleet/failed/noted/spider/CallbackError': 2" in out, out
    assert admin.status()["dead"] == 0 and admin.size() == 0


# -- item 9: a request that fails before its download never holds its host ---------------------


def test_a_request_refused_by_the_downloader_fails_alone_and_holds_no_host(
        redis_url, worker_env, small_site, tmp_path):
    """Entries written without `push`'s checks: a URL with credentials (the downloader's
    ValueError) and a meta download_timeout of "abc" (its TypeError) are recorded as failed
    with their reason; the host is not put on hold, so its good page is fetched at once."""
    port = small_site.url.split(":")[2].rstrip("/")
    bad = [f"http://user:pass@127.0.0.1:{port}/site/p/0.html",
           small_site.url + "site/p/1.html?t"]
    good = small_site.url + "site/p/2.html"
    admin = FrontierAdmin(redis_url, "fetch")
    specs = [Request(bad[0]), Request(bad[1], meta={"download_timeout": "abc"}), Request(good)]
    entries = [(b"", 0, codec.encode_dict({**r.to_dict(), codec.PUSHED_FIELD: True}), 0,
                "127.0.0.1") for r in specs]
    assert admin.push(entries).pushed == 3
    log = tmp_path / "worker.log"
    worker = start_worker(TEST_PROJECT, "fetch", {
        "FLEET_REDIS_URL": redis_url, "FLEET_IDLE_TIMEOUT": 1, "LOG_LEVEL": "INFO",
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1}, worker_env, log)
    assert wait_all([worker], 120) == [0], tail(log)
    out = log.read_text(errors="replace")
    rows = {rec.url: rec.reason for _, rec in failed_records(admin.client, admin.keys, None)}
    assert rows == {bad[0]: "download/ValueError", bad[1]: "download/TypeError"}
    assert [r["path"] for r in small_site.requests()] == ["/site/p/2.html"]
    assert "host on hold" not in out, out
    assert "'fleet/politeness/request_errors': 2" in out, out
    assert "fleet/politeness/failures" not in out, out
