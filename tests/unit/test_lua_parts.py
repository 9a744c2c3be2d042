"""The Lua scripts as parts: one declaration of a call's keys gives both its KEYS order and its
Lua prologue, no part of a declared script names a key by position, every file has a header
and stays under 300 lines (issue 20, item 1)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from scrapy_fleet.keys import calls, crawl, fleet
from scrapy_fleet.lua import sources

FOLDER = resources.files("scrapy_fleet") / "lua"
DECLARED = {name: spec for name, spec in sources.SCRIPTS.items() if spec[1] is not None}


def lua_files() -> list[str]:
    return sorted(p.name for p in FOLDER.iterdir() if p.name.endswith(".lua"))


@pytest.mark.parametrize("script", sorted(DECLARED))
def test_the_prologue_binds_each_declared_name_to_the_key_call_keys_puts_there(script):
    names = DECLARED[script][1]
    assert len(set(names)) == len(names)
    built = (fleet.StartKeyKeys("s").call_keys() if script == "startkey.lua"
             else crawl.CrawlKeys("fleet", "c").call_keys(names, "OP", "PREV", "W"))
    bound = dict(re.findall(r"^  (\w+) = (.+?),?$", sources.prologue(names), re.M))
    assert list(bound) == list(names)
    position = 0
    for name in names:
        width = calls.key_width(name)
        expected = [f"KEYS[{position + i + 1}]" for i in range(width)]
        value = bound[name]
        assert value == (expected[0] if width == 1 else "{" + ", ".join(expected) + "}")
        position += width
    assert len(built) == position  # one key per position, in the declaration's order
    frontier = crawl.CrawlKeys("fleet", "c").frontier_keys("OP", "PREV", "W")
    if script == "frontier.lua":
        assert built == frontier
        assert frontier[names.index("op")] == "fleet:{c}:op:OP"
        assert frontier[names.index("prev_op")] == "fleet:{c}:op:PREV"
        assert frontier[names.index("worker_info")] == "fleet:{c}:worker:W"
        # the Bloom slices last: a call without pushes leaves them out
        assert names[-1] == "bloom_slices"
        lean = crawl.CrawlKeys("fleet", "c").frontier_keys("OP", "PREV", "W", slices=False)
        assert lean == frontier[:-calls.BLOOM_MAX_SLICES]
        assert frontier[-calls.BLOOM_MAX_SLICES:] == [
            crawl.CrawlKeys("fleet", "c").bloom_slice(n) for n in range(calls.BLOOM_MAX_SLICES)]


@pytest.mark.parametrize("script", sorted(DECLARED))
def test_no_part_of_a_declared_script_names_a_key_by_position(script):
    parts, _ = DECLARED[script]
    if script in sources.GROUPS:  # (the parts of a function the script's driver calls)
        _, members, body = sources.GROUPS[script]
        parts = (*parts, *members, body)
    for part in (*parts, script):
        text = (FOLDER / part).read_text("utf-8")
        assert "KEYS[" not in text, part
    if script != "frontier.lua":
        return  # (a shared part, lua/queue.lua, also names keys only the frontier call passes)
    # and every name the frontier call's parts read from K is declared
    used = set()
    for part in (*parts, script):
        used |= set(re.findall(r"\bK\.(\w+)", (FOLDER / part).read_text("utf-8")))
    assert used <= set(DECLARED[script][1]), used - set(DECLARED[script][1])


@pytest.mark.parametrize("name", lua_files())
def test_every_lua_file_has_a_header_and_at_most_300_lines(name):
    text = (FOLDER / name).read_text("utf-8")
    assert text.startswith("-- "), name
    assert len(text.splitlines()) <= 300, name
    assert "-- uses:" not in text and "scripts.py" not in text, name
