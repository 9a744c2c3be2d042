"""Lua scripts of the fleet, kept as files in this package (``scrapy_fleet/lua/``) and run by SHA.

A script is made of parts: the files :data:`SCRIPTS` names, in order (each defines locals only:
a function or a table of functions, its header says which, the keys and arguments it uses,
what it writes and its bound of work per call), then the entry file itself.  A script whose
KEYS are declared in :mod:`scrapy_fleet.keys` (``FRONTIER_CALL``...) gets a generated
prologue first: ``local K = {name = KEYS[i], ...}``, the names and order of that declaration,
which :meth:`scrapy_fleet.keys.CrawlKeys.call_keys` follows too, so no key position is written
by hand.  A script may also name a *group* of parts put inside one function (``GROUPS``: its
name, its parts, then its body file): Lua creates the closures of a function's body only when
the function runs, so the parts a call needs only when it has work (the frontier call's
steps) cost nothing to a call without any (every EVALSHA runs the whole chunk).
:func:`load` registers a script with a redis-py client, which sends EVALSHA and
reloads the script after ``NOSCRIPT`` (a restarted Redis has no scripts); the scripts of
``library.FUNCTIONS`` (the frontier call, the lean push) are instead functions of one Redis
Functions library built from the same files (lua/library.py: every part defined once, at
FUNCTION LOAD), called by FCALL.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from scrapy_fleet import keys

#: the frontier call's parts every call runs, in order (lua/frontier.lua is the driver)
FRONTIER_PARTS = ("common.lua", "queue.lua", "failed.lua", "monitoring.lua", "step_check.lua",
                  "step_recover.lua",  # recovery (issue 30): used by step_begin
                  "step_begin.lua",
                  "step_control.lua",  # crawl control (issue 34): used by the driver, step_idle
                  "step_revisit.lua",  # recrawl (issue 22): used by step_ack, step_idle
                  "step_idle.lua", "step_reply.lua")
#: the frontier call's steps, inside one function (frontier_steps, lua/frontier_steps.lua its
#: body) that the driver calls only when the call has work
FRONTIER_STEPS = ("adaptive.lua", "hosts.lua", "bloom.lua", "bloom_write.lua",
                  "frontier_state.lua", "step_reclaim.lua", "step_release.lua", "step_push.lua",
                  "step_ack.lua", "step_lease.lua",
                  "step_adapt.lua")  # adaptive politeness (issue 35)

#: entry script -> (parts put before it, its KEYS declaration or None: positional KEYS)
SCRIPTS: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "frontier.lua": (FRONTIER_PARTS, keys.FRONTIER_CALL),
    "failed_retry.lua": (("common.lua", "queue.lua", "failed.lua"), keys.RETRY_CALL),
    "sample.lua": (("common.lua", "queue.lua", "monitoring.lua"), keys.SAMPLE_CALL),
    "politeness.lua": (("common.lua", "adaptive.lua", "hosts.lua"), keys.POLITENESS_CALL),
    "bloom_add.lua": (("common.lua", "bloom.lua", "bloom_write.lua"), keys.BLOOM_ADD_CALL),
    "seeding.lua": (("common.lua",), keys.SEEDING_CALL),
    # a scrapy-redis spider's start key (compat/feeder.py)
    "startkey.lua": ((), keys.START_KEY_CALL),
    "beat.lua": (("common.lua",), keys.BEAT_CALL),
    "proxies.lua": (("common.lua", "proxies_pool.lua"), None),
    "acl_probe.lua": ((), None),
    # partitions (issue 21, frontier/partitions.py)
    "push_lean.lua": (("common.lua", "queue.lua", "bloom.lua", "bloom_write.lua", "failed.lua",
                       "step_revisit.lua"),  # sitemap <lastmod>: revisit_lastmod_due
                      keys.PUSH_LEAN_CALL),
    "partition_probe.lua": ((), keys.PROBE_CALL),
    # crawl control (issue 34): the commands' writes (commands/control.py)
    "control.lua": ((), keys.CONTROL_CALL),
    # sessions (issue 32): fleet cookie jars (sessions/jar.py)
    "cookies_read.lua": (("common.lua",), None),
    "cookies_merge.lua": (("common.lua",), None),
}

#: entry script -> (function name, its parts, its body file): put after the script's parts, as
#: ``local function NAME(c)`` holding the parts and the body (a group's parts may use the
#: script's parts; the script's parts see only the function)
GROUPS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "frontier.lua": ("frontier_steps", FRONTIER_STEPS, "frontier_steps.lua"),
}


def key_fields(names: tuple[str, ...]) -> str:
    """``name = KEYS[i]`` per declared key name (a list of them for a name standing for
    several keys, the Bloom slices), in the declaration's order."""
    fields, i = [], 1
    for name in names:
        width = keys.key_width(name)
        if width == 1:
            fields.append(f"{name} = KEYS[{i}]")
        else:
            fields.append(f"{name} = {{" + ", ".join(f"KEYS[{i + j}]" for j in range(width))
                          + "}")
        i += width
    return ",\n  ".join(fields)


def prologue(names: tuple[str, ...]) -> str:
    """The Lua lines binding each declared key name to its ``KEYS[i]`` (a name standing for
    several keys, the Bloom slices, to a list of them), and the crawl layout version."""
    return ("-- KEYS of this call by name (generated by lua/__init__.py from keys.py's "
            "declaration)\n"
            f"local K = {{\n  {key_fields(names)}\n}}\n"
            f"local CRAWL_LAYOUT = '{keys.LAYOUT_VERSION}'\n")


def parts(name: str, flat: bool = False) -> list[str]:
    """The sources of *name*'s parts, then of its group (not its prologue, not the entry
    file).  *flat*: the group's parts before its function, which then holds its body only
    (a Functions library defines every part once, when it is loaded: lua/library.py)."""
    folder = resources.files("scrapy_fleet") / "lua"
    found = [(folder / part).read_text("utf-8") for part in SCRIPTS.get(name, ((), None))[0]]
    if name in GROUPS:
        function, members, body = GROUPS[name]
        inside = (body,) if flat else (*members, body)
        if flat:
            found.extend((folder / part).read_text("utf-8") for part in members)
        found.append(f"local function {function}(c)")
        found.extend((folder / part).read_text("utf-8") for part in inside)
        found.append(f"end  -- {function}")
    return found


def entry(name: str) -> str:
    """The source of entry file *name* itself."""
    return (resources.files("scrapy_fleet") / "lua" / name).read_text("utf-8")


@cache
def source(name: str) -> str:
    """Full Lua source of entry script *name* (its prologue and parts first)."""
    found = parts(name)
    declared = SCRIPTS.get(name, ((), None))[1]
    if declared is not None:
        found.insert(0, prologue(declared))
    found.append(entry(name))
    return "\n".join(found)


def load(client: Any, name: str) -> Any:
    """Script *name* for a redis-py client (sync or asyncio), called as
    ``script(keys=[...], args=[...])``: a function of the Functions library (FCALL,
    lua/library.py) for the scripts it holds, else a registered Script (EVALSHA)."""
    from scrapy_fleet.lua import library

    if name in library.FUNCTIONS:
        return library.bind(client, name)
    return client.register_script(source(name))
