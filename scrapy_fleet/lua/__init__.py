"""Lua scripts of the fleet, kept as files in this package (``scrapy_fleet/lua/``) and run by SHA.

An entry script may start with ``-- uses: lib.lua, ...``; the named library files are
prepended once, at load.  :func:`load` registers each script with a redis-py client, which
sends EVALSHA and reloads the script after ``NOSCRIPT`` (a restarted Redis has no scripts).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

#: entry script -> library files it needs (prepended in this order)
_LIBRARIES: dict[str, tuple[str, ...]] = {
    "frontier.lua": ("common.lua", "bloom.lua", "hosts.lua", "failed.lua", "monitoring.lua",
                     "frontier_batch.lua", "frontier_lease.lua"),
    "failed_retry.lua": ("common.lua", "hosts.lua", "failed.lua"),
    "politeness.lua": ("common.lua", "hosts.lua"),
    "bloom_add.lua": ("common.lua", "bloom.lua"),
    "seeding.lua": ("common.lua", "hosts.lua"),
    "sample.lua": ("common.lua", "monitoring.lua"),
    "proxies.lua": ("common.lua", "hosts.lua"),
}


@cache
def source(name: str) -> str:
    """Full Lua source of entry script *name* (libraries prepended)."""
    folder = resources.files("scrapy_fleet") / "lua"
    parts = [(folder / lib).read_text("utf-8") for lib in _LIBRARIES.get(name, ())]
    parts.append((folder / name).read_text("utf-8"))
    return "\n".join(parts)


def load(client: Any, name: str) -> Any:
    """Register script *name* with a redis-py client (sync or asyncio); returns the Script."""
    return client.register_script(source(name))
