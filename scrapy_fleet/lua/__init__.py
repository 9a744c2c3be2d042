"""Lua scripts of the fleet, kept as files in this package (``scrapy_fleet/lua/``) and run by SHA.

A script is made of parts: the files :data:`SCRIPTS` names, in order (each defines locals only:
a function or a table of functions, its header says which, the keys and arguments it uses,
what it writes and its bound of work per call), then the entry file itself.  A script whose
KEYS are declared in :mod:`scrapy_fleet.keys.calls` (``FRONTIER_CALL``...) gets a generated
prologue first: ``local K = {name = KEYS[i], ...}``, the names and order of that declaration,
which :meth:`scrapy_fleet.keys.crawl.CrawlKeys.call_keys` follows too, so no key position is written
by hand.  A script may also name a *group* of parts put inside one function (``GROUPS``: its
name, its parts, then its body file): Lua creates the closures of a function's body only when
the function runs, so the parts a call needs only when it has work (the frontier call's
steps) cost nothing to a call without any (every EVALSHA runs the whole chunk).
The scripts' declarations and the functions putting a source together are in lua/sources.py.
:func:`load` registers a script with a redis-py client, which sends EVALSHA and
reloads the script after ``NOSCRIPT`` (a restarted Redis has no scripts); the scripts of
``library.FUNCTIONS`` (the frontier call, the lean push) are instead functions of one Redis
Functions library built from the same files (lua/library.py: every part defined once, at
FUNCTION LOAD), called by FCALL.
"""

from __future__ import annotations

from typing import Any

from scrapy_fleet.lua import library
from scrapy_fleet.lua.sources import source


def load(client: Any, name: str) -> Any:
    """Script *name* for a redis-py client (sync or asyncio), called as
    ``script(keys=[...], args=[...])``: a function of the Functions library (FCALL,
    lua/library.py) for the scripts it holds, else a registered Script (EVALSHA)."""
    if name in library.FUNCTIONS:
        return library.bind(client, name)
    return client.register_script(source(name))
