"""Least privilege: the Redis commands each role of the fleet sends, the ACL rule that allows
exactly them, and a start-up check that names a missing permission.

Roles: ``worker`` (``scrapy crawl`` with the add-on, and ``push``: they run the frontier's
scripts), ``monitor`` (``status`` and ``dead``: reads only) and ``admin`` (``purge``: a worker
that may also SCAN and UNLINK; and every ``proxies`` action).  A crawl using the proxy pool
(``FLEET_PROXIES`` / ``FLEET_PROXY_POOL``) also needs, for its workers and admins, the
commands of ``lua/proxies.lua`` on the pool's keys ``PREFIX:{proxypool:POOL}:*``, which
carry the pool's hash tag, not the crawl's (``proxies=True`` below; the pool is probed with
a key of its own, since on a cluster it lives in another slot).

Redis checks the commands a Lua script calls against the calling user, one by one, when the
script reaches them: a user allowed EVALSHA but not, say, ZADD would fail halfway through a
script, after its first writes.  So a worker checks every
command it may need once, at start, with ``lua/acl_probe.lua`` (``redis.acl_check_cmd``,
Redis >= 7.0; ``ACL DRYRUN`` needs 7.2), and stops with one error naming the commands the
user lacks.  docs/deployment.md prints the rules.
"""

from __future__ import annotations

import re
from typing import Any

import redis

from scrapy_fleet import lua
from scrapy_fleet.errors import RedisPermissionError
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.fleet import ProxyPoolKeys, StartKeyKeys
from scrapy_fleet.lua import sources

#: entry scripts each role runs
_SCRIPTS = {"worker": ("frontier.lua", "push_lean.lua", "politeness.lua", "seeding.lua",
                       "bloom_add.lua", "beat.lua",
                       # sessions (issue 32): cookie jars, session pools (sessions/)
                       "cookies_read.lua", "cookies_merge.lua", "sessions.lua"),
            "monitor": (), "admin": ("frontier.lua", "push_lean.lua", "politeness.lua",
                                     "seeding.lua", "bloom_add.lua", "failed_retry.lua",
                                     "host_drop.lua",
                                     "sessions.lua",  # sessions --retire/--reset
                                     "control.lua")}  # pause, resume, host (issue 34)
#: the proxy pool's script (a worker: choose, report, seed; an admin: the ``proxies`` actions)
_POOL_SCRIPTS = ("proxies.lua",)
#: the script a scrapy-redis spider's worker runs on its start key (compat/feeder.py)
_START_KEY_SCRIPTS = ("startkey.lua",)
#: the roles that read start keys (a worker feeds them; an admin runs what a worker runs)
_START_KEY_ROLES = ("worker", "admin")
#: commands each role sends itself to the pool's keys (proxies/pool.py; ``proxies list``
#: reads the exits' URLs, credentials included: an admin's, never a monitor's)
_POOL_DIRECT = {"worker": ("evalsha", "script|load"),
                "admin": ("evalsha", "script|load", "hgetall", "hkeys", "hmget", "time")}
#: commands sent on every new connection (redis-py: CLIENT SETNAME for client_name; a failed
#: CLIENT SETINFO is ignored by redis-py, so it is not needed) and the liveness check
_CONNECTION = ("ping", "client|setname")
#: a probe line of each command: a full command line (Redis 7.0's acl_check_cmd does not
#: check the arity, and a line shorter than its command crashes the server in key lookup;
#: tests/e2e/test_acl.py checks every line against COMMAND INFO), "@K" standing for a crawl key
PROBE_LINES = {
    "evalsha": "evalsha 0000000000000000000000000000000000000000 0",
    "script|load": "script load return", "fcall": "fcall fleet 0",
    "function|load": "function load return", "cluster|slots": "cluster slots",
    "info": "info memory", "config|get": "config get maxmemory", "time": "time",
    "scan": "scan 0", "del": "del @K", "unlink": "unlink @K", "exists": "exists @K",
    "get": "get @K", "mget": "mget @K", "set": "set @K v", "incr": "incr @K",
    "getbit": "getbit @K 0",
    "setbit": "setbit @K 0 1", "hdel": "hdel @K f", "hexists": "hexists @K f",
    "hget": "hget @K f", "hgetall": "hgetall @K", "hincrby": "hincrby @K f 1",
    "hlen": "hlen @K", "hmget": "hmget @K f", "hset": "hset @K f v", "hscan": "hscan @K 0",
    "llen": "llen @K", "lpop": "lpop @K", "rpush": "rpush @K v", "zadd": "zadd @K 1 m",
    "zcard": "zcard @K", "zcount": "zcount @K 0 1", "zrange": "zrange @K 0 -1",
    "zrangebylex": "zrangebylex @K - +", "zrangebyscore": "zrangebyscore @K 0 1",
    "zrem": "zrem @K m", "zremrangebyscore": "zremrangebyscore @K 0 1", "zscore": "zscore @K m",
    "hsetnx": "hsetnx @K f v", "hstrlen": "hstrlen @K f", "pexpire": "pexpire @K 1000",
    "setrange": "setrange @K 0 v", "strlen": "strlen @K", "type": "type @K",
    "zincrby": "zincrby @K 1 m", "bitfield": "bitfield @K get u8 0",
    "bitfield_ro": "bitfield_ro @K get u1 0", "incrby": "incrby @K 1",
    "zrevrange": "zrevrange @K 0 -1", "hkeys": "hkeys @K", "getrange": "getrange @K 0 1",
    "zmscore": "zmscore @K m", "decrby": "decrby @K 1", "lpush": "lpush @K v",
    "lrange": "lrange @K 0 -1", "ltrim": "ltrim @K 0 -1",
    "watch": "watch @K", "multi": "multi", "exec": "exec",
    "hincrbyfloat": "hincrbyfloat @K f 1",
    # sitemap <lastmod> (lua/step_revisit.lua): a record read and tombstoned at its place
    "lindex": "lindex @K 0", "lset": "lset @K 0 v",
    # the recrawl's hosts (recrawl/budget.py, recrawl/view.py)
    "sadd": "sadd @K m", "sscan": "sscan @K 0",
    # session pools (sessions/pool.py: the pools' names, for status and sessions)
    "smembers": "smembers @K",
}
#: commands each role sends itself (outside scripts); fcall, function|load: the frontier call
#: and the lean push are functions of one library (lua/library.py), loaded by the first
#: client that finds it missing
_DIRECT: dict[str, tuple[str, ...]] = {
    # set, time: the start's checks of the crawl's spider and the worker id (identity.py)
    "worker": ("evalsha", "script|load", "fcall", "function|load", "hset", "hmget", "hgetall",
               "zrem", "zcard", "set", "time",
               # recrawl budgets (recrawl/budget.py): one transaction per sync, WATCHing the
               # crawl's marker, adds the moves to the hosts' HASHes and reads them back
               "watch", "multi", "exec", "exists", "hincrby", "hincrbyfloat", "hget", "sadd"),
    "monitor": ("zcard", "hlen", "hgetall", "zrange", "get", "hmget", "llen", "hscan",
                "time", "exists", "hget", "zrevrange", "zrangebyscore", "zcount", "info",
                # the recrawl's schedule read (recrawl/status.py, recrawl/view.py)
                "lrange", "lindex", "zscore", "sscan",
                # url, hosts, urls, crawls (commands/lookup.py): the Bloom filter's bits,
                # a host's presence, the crawl ids
                "getrange", "getbit", "hexists", "scan",
                # the session pools (commands/sessions.py: status, sessions)
                "smembers"),
    "admin": ("evalsha", "script|load", "fcall", "function|load", "hset", "hmget", "hgetall",
              "zrem", "zcard", "set", "hlen",
              "zrange", "get", "llen", "hscan", "time", "scan", "unlink"),
}
#: an admin runs the monitor's reads too (status, top, failed, dead)
_DIRECT["admin"] += tuple(c for c in _DIRECT["monitor"] if c not in _DIRECT["admin"])
#: read when allowed (the memory check at start); a worker without them skips that check
OPTIONAL = ("info", "config|get")
#: a cluster client reads the slot map with CLUSTER SLOTS
CLUSTER = ("cluster|slots",)

_CALL = re.compile(r"(?:redis\.p?call|call_many)\(\s*['\"]([A-Za-z_]+)['\"]")
#: a command a script calls with a computed argument list: named in a ``-- acl: CMD`` comment
_CALL_NOTE = re.compile(r"--\s*acl:\s*([A-Za-z_]+)")


def script_commands(role: str, pool: bool = False, start_keys: bool = False) -> list[str]:
    """Commands the role's Lua scripts call (read from the scripts' sources), lower case;
    *pool*: those of the proxy pool's script instead (none for a monitor); *start_keys*:
    those of lua/startkey.lua instead (none for a monitor)."""
    names: set[str] = set()
    scripts = (_POOL_SCRIPTS if role in _POOL_DIRECT else ()) if pool else _SCRIPTS[role]
    if start_keys:
        scripts = _START_KEY_SCRIPTS if role in _START_KEY_ROLES else ()
    for script in scripts:
        source = sources.source(script)
        names.update(m.lower() for m in (*_CALL.findall(source), *_CALL_NOTE.findall(source)))
    return sorted(names)


def _probe_lines(role: str, cluster: bool) -> dict[str, str]:
    """probe line -> command name (``name`` or ``name|subcommand``) for *role*.

    Raises:
        KeyError: a script calls a command without a line in PROBE_LINES (a test catches it).
    """
    names = [*_DIRECT[role], *script_commands(role), *(CLUSTER if cluster else ())]
    return {PROBE_LINES[name]: name for name in dict.fromkeys(names)}


def _pool_probe_lines(role: str) -> dict[str, str]:
    """probe line -> command name of what *role* sends to the proxy pool's keys (empty for
    a monitor, which never touches the pool)."""
    names = [*_POOL_DIRECT.get(role, ()), *script_commands(role, pool=True)]
    return {PROBE_LINES[name]: name for name in dict.fromkeys(names)}


def commands(role: str, cluster: bool = False, proxies: bool = False) -> list[str]:
    """Every command (``name`` or ``name|subcommand``) *role* needs, sorted; *proxies*: with
    those of the proxy pool (on its keys)."""
    pool = _pool_probe_lines(role).values() if proxies else ()
    return sorted({*_CONNECTION, *_probe_lines(role, cluster).values(), *pool})


def pool_commands(role: str) -> list[str]:
    """The commands *role* sends to the proxy pool's keys (direct and from lua/proxies.lua),
    sorted; empty for a monitor."""
    return sorted(_pool_probe_lines(role).values())


def start_key_patterns(start_keys: tuple[str, ...] | list[str]) -> str:
    """The ACL key patterns of scrapy-redis start keys (keys/fleet.py ``StartKeyKeys``): each key
    itself and its ``<tag>:fleet:*`` keys, glob characters escaped (Redis's ACL patterns are
    glob-style: ``*``, ``?``, ``[``, ``\\`` in a key name match literally only escaped)."""

    def escaped(name: str) -> str:
        return re.sub(r"([*?\[\]\\])", r"\\\1", name)

    return " ".join(f"~{escaped(k)} ~{escaped(StartKeyKeys(k).base)}:*"
                    for k in dict.fromkeys(start_keys))


def acl_rule(role: str, key_prefix: str = "fleet", crawl_id: str | None = None,
             cluster: bool = False, optional: bool = True, proxies: bool = False,
             pool: str | None = None, partitions: bool = False,
             start_keys: tuple[str, ...] = ()) -> str:
    """The ``ACL SETUSER <name> on >PASSWORD ...`` rule, without the first three words,
    that allows *role* exactly its commands on the keys of crawl *crawl_id* (None: every
    crawl under *key_prefix*).  *optional*: a worker may also run INFO and CONFIG GET (the
    memory check at start).  *proxies*: the crawl uses the proxy pool: the rule adds the
    pool's key pattern (pool *pool*, default the crawl's own, ``FLEET_PROXY_POOL``; every
    pool when both are None) and the pool's commands (:func:`pool_commands`; a monitor
    gets neither).  *partitions*: the crawl has FLEET_PARTITIONS > 1: the rule adds the
    pattern of its partitions' keys.  *start_keys*: the scrapy-redis start keys its spiders
    read (compat/feeder.py): a worker's and an admin's rule adds their patterns
    (:func:`start_key_patterns`) and the commands of lua/startkey.lua.  Redis applies a
    user's commands to all its key patterns alike."""
    extra = list(OPTIONAL) if optional and role != "monitor" else []
    use_start = bool(start_keys) and role in _START_KEY_ROLES
    if use_start:
        extra += script_commands(role, start_keys=True)
    use_pool = proxies and role in _POOL_DIRECT
    allowed = " ".join(f"+{name}" for name in dict.fromkeys(  # (an admin has INFO already)
        (*commands(role, cluster, use_pool), *extra)))
    base = f"{key_prefix}:{{*}}" if crawl_id is None else CrawlKeys(key_prefix, crawl_id).base
    patterns = f"~{base}:*"
    if partitions:  # FLEET_PARTITIONS > 1 (issue 21): the partitions' tags {<crawl>/<p>.<salt>}
        crawls = "*" if crawl_id is None else crawl_id
        patterns += f" ~{key_prefix}:{{{crawls}/*}}:*"
    if use_pool:
        name = pool or crawl_id
        pool_base = (f"{key_prefix}:{{proxypool:*}}" if name is None
                     else ProxyPoolKeys(key_prefix, name).base)
        patterns += f" ~{pool_base}:*"
    if use_start:
        patterns += " " + start_key_patterns(start_keys)
    return f"resetkeys {patterns} resetchannels -@all {allowed}"


def _denied_error(denied: list[str], role: str, cluster: bool,
                  pool: ProxyPoolKeys | None) -> RedisPermissionError:
    lines = {**_probe_lines(role, cluster), **_pool_probe_lines(role)}
    names = sorted({lines.get(line, line) for line in denied})
    where = "the crawl's keys" if pool is None else f"the proxy pool's keys ({pool.base}:*)"
    needs = (f"{_a(role)} needs {', '.join(commands(role, cluster))}" if pool is None else
             f"{_a(role)} using the proxy pool needs {', '.join(pool_commands(role))} on its "
             "keys")
    return RedisPermissionError(
        f"the Redis user of FLEET_REDIS_URL may not run {', '.join(names)} on {where}; "
        f"{needs} (docs/deployment.md gives the ACL rule)")


def _translate(exc: redis.ResponseError, role: str, keys: CrawlKeys | ProxyPoolKeys
               ) -> RedisPermissionError:
    if "keys" in str(exc):
        what = (f"crawl {keys.crawl_id!r}" if isinstance(keys, CrawlKeys)
                else f"proxy pool {keys.pool!r}")
        return RedisPermissionError(
            f"the Redis user of FLEET_REDIS_URL may not access the keys of {what}: {exc} "
            f"(its key pattern must match {keys.base}:*; docs/deployment.md gives the ACL "
            "rule)")
    needs = (f"{', '.join(commands(role))}" if isinstance(keys, CrawlKeys) else
             f"{', '.join(pool_commands(role))} on the keys of proxy pool {keys.pool!r}")
    return RedisPermissionError(
        f"the Redis user of FLEET_REDIS_URL lacks a permission: {exc} ({_a(role)} needs "
        f"{needs}; docs/deployment.md gives the ACL rule)")


def _a(role: str) -> str:
    return f"an {role}" if role[0] in "aeiou" else f"a {role}"


def _probes(keys: CrawlKeys | None, role: str, cluster: bool,
            pool: ProxyPoolKeys | None) -> list[tuple[CrawlKeys | ProxyPoolKeys, str, list[str]]]:
    """(keys, the key the probe runs on, its lines): the crawl's, then the pool's."""
    out: list[tuple[CrawlKeys | ProxyPoolKeys, str, list[str]]] = []
    if keys is not None:
        out.append((keys, keys.stats, list(_probe_lines(role, cluster))))
    if pool is not None and _pool_probe_lines(role):
        out.append((pool, pool.stats, list(_pool_probe_lines(role))))
    return out


def _probe_refused(exc: redis.ResponseError, role: str,
                   target: CrawlKeys | ProxyPoolKeys) -> None:
    """The probe itself failed: NOPERM (the user may not run it there) raises
    :class:`RedisPermissionError`; a Redis without ``redis.acl_check_cmd`` (< 7.0) returns
    (nothing is checked); any other error is raised as it is."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        raise _translate(exc, role, target) from exc
    if "acl_check_cmd" not in str(exc):
        raise exc


def _judge(denied: list[bytes], role: str, cluster: bool,
           target: CrawlKeys | ProxyPoolKeys) -> None:
    """Raise :class:`RedisPermissionError` naming the probe lines the user may not run."""
    if denied:
        raise _denied_error([d.decode() for d in denied], role, cluster,
                            target if isinstance(target, ProxyPoolKeys) else None)


def check_sync(client: Any, keys: CrawlKeys | None, role: str, cluster: bool = False,
               pool: ProxyPoolKeys | None = None) -> None:
    """Run the probe on the crawl's keys (*keys*; None: none) and, with *pool*, on the proxy
    pool's keys; raise :class:`RedisPermissionError` naming what the user lacks (the crawl's
    first: one error).

    A ``monitor`` is not probed: the probe is a script, and a read-only user must not run
    scripts (they may write); its reads fail one by one, before anything is written, with
    Redis's NOPERM error naming the command.  A Redis without ACLs (< 6) or without
    ``redis.acl_check_cmd`` (< 7) is not checked.
    """
    if role == "monitor":
        return
    script = lua.load(client, "acl_probe.lua")
    for target, key, lines in _probes(keys, role, cluster, pool):
        try:
            denied = script(keys=[key], args=lines)
        except redis.ResponseError as exc:
            _probe_refused(exc, role, target)
            return
        _judge(denied, role, cluster, target)


async def check_async(client: Any, keys: CrawlKeys | None, role: str, cluster: bool = False,
                      pool: ProxyPoolKeys | None = None) -> None:
    """The asyncio twin of :func:`check_sync`."""
    if role == "monitor":
        return
    script = lua.load(client, "acl_probe.lua")
    for target, key, lines in _probes(keys, role, cluster, pool):
        try:
            denied = await script(keys=[key], args=lines)
        except redis.ResponseError as exc:
            _probe_refused(exc, role, target)
            return
        _judge(denied, role, cluster, target)
