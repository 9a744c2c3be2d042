"""The tests' own helpers where a wrong one makes crawl tests flaky: reading the item files
of workers that are still writing them (support.read_items).

test_cluster_master_failover_mid_crawl_itemises_every_page polls the workers' JSON-lines
files while they crawl (wait_items); a read that lands inside a worker's ``write(2)`` of a
line straddling a 4 KiB page boundary sees the line up to the boundary only (Linux makes a
buffered write visible a page at a time), and parsing that half line raised
JSONDecodeError (or UnicodeDecodeError inside a multi-byte character) in the middle of a
passing crawl.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from support import read_items

PAGE = 4096


def _line(n: int, title: str = "t") -> bytes:
    return (json.dumps({"url": f"http://127.0.0.1/site/p/{n}.html", "title": title},
                       ensure_ascii=False) + "\n").encode()


def _file_cut_at_a_page_boundary(path: Path, title: str, mid_char: bool = False) -> int:
    """Lines as JsonLinesPipeline writes them, the file cut at the first page boundary,
    which falls inside a line (*mid_char*: inside a multi-byte UTF-8 character of it): what
    a reader sees during that line's write.  Returns how many lines are whole before it."""
    for pad in range(256):
        data = _line(0, title + " " * pad)
        n = 1
        while len(data) <= PAGE:
            data += _line(n, title)
            n += 1
        inside_line = data[PAGE - 1:PAGE] != b"\n"
        inside_char = data[PAGE] & 0xC0 == 0x80  # a UTF-8 continuation byte
        if inside_line and (inside_char or not mid_char):
            path.write_bytes(data[:PAGE])
            return data[:PAGE].count(b"\n")
    raise AssertionError("no padding puts the page boundary where asked")


@pytest.mark.parametrize(("title", "mid_char"), [("ascii", False), ("Ünïcödé ½ — ✓ " * 3, True)],
                         ids=["ascii", "inside-a-utf8-character"])
def test_a_line_being_written_is_left_for_a_later_read(tmp_path: Path, title: str,
                                                       mid_char: bool) -> None:
    whole = _file_cut_at_a_page_boundary(tmp_path / "out.jsonl", title, mid_char)
    assert whole > 0
    items = read_items([tmp_path / "out.jsonl", tmp_path / "missing.jsonl"], growing=True)
    assert [i["url"] for i in items] == [f"http://127.0.0.1/site/p/{n}.html"
                                         for n in range(whole)]
    assert items[-1]["title"] == title
    assert (tmp_path / "out.jsonl").stat().st_size == PAGE


def test_a_torn_line_in_a_finished_file_is_an_error(tmp_path: Path) -> None:
    _file_cut_at_a_page_boundary(tmp_path / "out.jsonl", "t")
    with pytest.raises(ValueError):
        read_items([tmp_path / "out.jsonl"])  # every writer has exited: a torn write


def _append(path: str, count: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for n in range(count):
        os.write(fd, _line(n, "x" * 150))  # one write(2) per line, as JsonLinesPipeline
    os.close(fd)


def test_reads_during_real_appends_only_grow_and_end_whole(tmp_path: Path) -> None:
    """A real writer process appends while the test reads: every read parses, the count
    never goes back, and the last read has every line."""
    path = tmp_path / "out.jsonl"
    count = 5000
    writer = multiprocessing.get_context("spawn").Process(target=_append,
                                                          args=(str(path), count))
    writer.start()
    seen = [0]
    while writer.is_alive():
        now = len(read_items([path], growing=True))
        assert now >= seen[-1]
        seen.append(now)
    writer.join()
    assert writer.exitcode == 0
    assert len(read_items([path], growing=True)) == len(read_items([path])) == count
