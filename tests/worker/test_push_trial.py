"""What a new user hit with `push` and `scrapy fleet` (issue 30, "Tried as a new user"): a
byte-order mark, lines already queued in a full frontier, a command outside any project,
a full Redis, callbacks that are not callbacks, requests no worker can send."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import run_scrapy

from scrapy_fleet.frontier.admin import FrontierAdmin

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
