"""Replay recorded frontier calls on a fresh redis-server per tree: Redis time per call and page.

bench_capacity.py measures a live fleet of synthetic clients; on a machine shared with other
work its figures move with the load (±20 % between runs here).  This bench takes the clients
out of the measurement: the same recorded calls run, one after another, against a fresh
``redis-server`` for each tree, in alternating rounds, so two versions of lua/frontier.lua are
compared on identical work (noise ~3 % here).

``record FILE [--clients 16] [--hosts 100] [--seconds 6]``: one cell of bench_capacity.py (its
synthetic clients and seeds, this tree), with every frontier.lua call also written to FILE:
msgpack records ``[time s, KEYS, ARGV[1], ARGV[2][, ARGV[3]]]`` (bench_capacity.Recorder).

``replay FILE --baseline DIR [--rounds 3] [--skip 50]``: per round, this tree then the
baseline's, each on a fresh server, each tree's call sent as its clients send it: FCALL of its
Functions library (lua/library.py) with the recorded ARGV[1] split as ``protocol.call_argv``
splits it (ARGV[3], the constants; fields equal to their defaults left out), or EVALSHA of
``lua.source("frontier.lua")`` for a tree without one.  Two things of a recording are the
server's and cannot be replayed as they are:
* fencing tokens come from the server's clock, and which entries a call leases depends on the
  order the calls ran in: a replayed call's acknowledgements, downloads over, extensions,
  releases and dead letters name, in order, the entries that *this replay* leased to the same
  worker (the recorded ids are replaced), so every acknowledgement holds its lease, as it did;
* the Bloom filter's generation id is the server's TIME when it was created: after the first
  call (which creates it) it is set to the one the recording's calls carry, so that their
  links left out as known duplicates are accepted.
* the previous op a call names is its client's (frontier/call.py): the op of the client's
  previous call, unless that call failed or cached no reply (lua/step_reply.lua, ``nc``),
  and then the op that call named; so each tree's replay names what its own client would,
  whichever tree recorded the calls (client_order).
The first ``--skip`` calls (seeding, warm-up) run unmeasured.  Reported per tree: FCALL's
or EVALSHA's ``usec`` per call (INFO commandstats: wall time inside Redis, the commands the
script runs included), min and median over the rounds; redis-server CPU (utime + stime) per
call; pages acknowledged per call (from the replies) and so µs per page; the ratio of the
minima to this tree's; the longest call and the calls over 2 ms (``SLOWLOG`` at >= 1 ms), of
the round with the fewest.

``identity FILE --baseline DIR``: every recorded call, on a fresh server per tree, with the
server's clock pinned to the call's recorded time (``redis.call('TIME')`` of each tree's source
reads a key the replay sets before each call: fencing tokens, expiries and every time written
are then the same in both trees); each call's KEYS are rebuilt by each tree's own
``CrawlKeys.frontier_keys`` (two layouts of KEYS are each called as their client calls them).
Compared: every reply (bytes, or the error), then every key of the final data (its type and
content; a cached reply decoded).  Keys only one tree writes by design are named
(``--only-this``: this tree's layout version key).  Names changed on purpose are mapped before
the comparison: ``--key-renamed OLD=NEW`` (a baseline key name's ending, e.g.
``:delayed=:deferred``) and ``--field-renamed OLD=NEW`` (a field of the baseline's reply map,
in replies and reply caches, e.g. ``delayed=dn``); replies are then compared decoded.  The
replies are also compared as the client reads them: a reply of a call that cached none
(``nc``) leaves out its empty lists and zero counts; and the reply caches (``:op:`` keys) are
counted apart from the other keys (after a client's last call that cached no reply, its
previous cached call's reply stays where a tree caching every call keeps that last one's).

Usage: ``.venv/bin/python bench/bench_replay.py record /tmp/calls-16x100 --clients 16
--hosts 100`` then ``.venv/bin/python bench/bench_replay.py replay /tmp/calls-16x100
--baseline ../base``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import _harness as h
import bench_capacity as bc
import msgpack

ENTRY_LISTS = (b"a", b"s", b"x", b"r", b"d")  # the call's lists of [entry id, token, ...]


#: run with a tree on PYTHONPATH: its frontier call as its clients send it
CODE = r"""
import json, sys
from scrapy_fleet import lua
out = {"source": lua.source("frontier.lua"), "library": None}
try:
    from scrapy_fleet.lua import library
    from scrapy_fleet.frontier.protocol import FrontierParams, call_constants
except ImportError:  # (a tree running it by EVALSHA, its whole argument in ARGV[1])
    pass
else:
    out.update(library=library.library()[1], function=library.function_name("frontier.lua"),
               constants=sorted(call_constants(FrontierParams())))
sys.stdout.write(json.dumps(out))
"""


def frontier_code(tree: Path, cwd: Path) -> dict[str, Any]:
    """The frontier call of *tree* as its clients send it: ``source`` (EVALSHA), and when the
    tree has a Functions library (lua/library.py) ``library`` (its code), ``function`` (the
    frontier call's name) and ``constants`` (the fields its clients send in ARGV[3])."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    return json.loads(subprocess.run(  # type: ignore[no-any-return]
        [h.PYTHON, "-c", CODE], env=env, cwd=cwd, check=True, capture_output=True,
        text=True).stdout)


#: ARGV[1]'s fields a client leaves out when they hold this (protocol.call_argv)
LEFT_OUT = {b"ld": 0, b"bg": b"", b"mk": b"", b"a": [], b"r": [], b"d": [], b"x": [], b"s": [],
            b"p": [], b"u": []}


def split_arg(arg: bytes, constants: list[bytes]) -> tuple[bytes, bytes]:
    """A recorded ARGV[1] (every field) as ARGV[1] and ARGV[3] of protocol.call_argv."""
    req = msgpack.unpackb(arg, raw=True, strict_map_key=False)
    cst = {k: req.pop(k) for k in constants if k in req}
    for k, v in LEFT_OUT.items():
        if k in req and req[k] == v:
            del req[k]
    if req.get(b"mk"):
        req.pop(b"mc", None)
    return msgpack.packb(req, use_bin_type=False), msgpack.packb(cst, use_bin_type=False)


#: the fields a reply of a call that cached no reply (nc) leaves out, as the client reads them
#: (frontier/protocol.py CallResult; lua/step_reply.lua)
UNCACHED_LEFT_OUT = {b"leased": [], b"lost": [], b"pf": [], b"rf": [], b"pd": [], b"new": 0,
                     b"dup": 0, b"acked": 0, b"released": 0, b"reclaimed": 0, b"dead": 0,
                     b"parked": 0, b"deferred": 0, b"resumed": 0, b"refused": 0,
                     b"full": False}

PIN_TIME_KEY = "__bench_time"  # (not a crawl key: left out of the comparison)
PIN_TIME = """local function bench_pinned_time()
  local us = tonumber(redis.call('GET', '__bench_time'))
  return {string.format('%d', math.floor(us / 1000000)), string.format('%d', us % 1000000)}
end
"""


def pinned(source: str) -> str:
    """*source* (a script, or a library: after its first line) with the server's clock read
    from PIN_TIME_KEY (microseconds)."""
    assert "redis.call('TIME')" in source
    source = source.replace("redis.call('TIME')", "bench_pinned_time()")
    if source.startswith("#!lua"):
        first, rest = source.split("\n", 1)
        return first + "\n" + PIN_TIME + rest
    return PIN_TIME + source


def key_template(tree: Path, cwd: Path, prefix: str, crawl: str) -> list[str]:
    """The frontier call's KEYS of *tree* for op "@OP@", previous op "@PREV@", worker "@W@"."""
    code = ("import json, sys\ntry:\n    from scrapy_fleet.keys.crawl import CrawlKeys\n"
            "except ImportError:  # (a tree from before keys/ was a package)\n"
            "    from scrapy_fleet.keys import CrawlKeys\n"
            f"print(json.dumps(CrawlKeys({prefix!r}, {crawl!r})"
            ".frontier_keys('@OP@', '@PREV@', '@W@')))")
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([h.PYTHON, "-c", code], env=env, cwd=cwd, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def call_names(keys: list[str]) -> tuple[str, str, str, str, str]:
    """(prefix, crawl id, op id, previous op id, worker id) of a recorded call's KEYS (found by
    their names, whatever their order)."""
    stats = next(k for k in keys if k.endswith(":stats"))
    m = re.fullmatch(r"(.*):\{(.*)\}:stats", stats)
    assert m, stats
    base = stats[:-len(":stats")]
    ops = [k[len(base) + 4:] for k in keys if k.startswith(base + ":op:")]
    worker = next((k[len(base) + 8:] for k in keys if k.startswith(base + ":worker:")), "")
    return m.group(1), m.group(2), ops[0], ops[1], worker


def read_calls(path: Path) -> list[list[Any]]:
    with path.open("rb") as f:
        calls = list(msgpack.Unpacker(f, raw=False, strict_map_key=False))
    calls.sort(key=lambda c: c[0])
    return calls


def client_order(calls: list[list[Any]]) -> dict[str, str]:
    """op id -> the op id of the same client's call just before it (the recorded previous op
    of a client's first call).  A client's calls are linked by the previous op each names
    (the first call of each names none of the recording's), whatever tree recorded them: a
    tree whose client names the same previous op again after a call that cached no reply
    (lua/step_reply.lua, ``nc``) links them too.  Each tree's replay then names, as its
    client would, the previous call of the client whose reply it cached (Replay)."""
    ops = [call_names(c[1])[2:4] for c in calls]
    known = {op for op, _ in ops}
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for op, prev in ops:
        if prev in known:
            parent[root(op)] = root(prev)
    last: dict[str, str] = {}
    order: dict[str, str] = {}
    for op, prev in ops:
        group = root(op)
        if op not in order:  # (a repeated op id: the first call's)
            order[op] = last.get(group, prev)
        last[group] = op
    return order


def recorded_generation(calls: list[list[Any]]) -> bytes | None:
    """The Bloom generation id most calls carry (field bg of ARGV[1])."""
    seen: dict[bytes, int] = {}
    for c in calls:
        g = msgpack.unpackb(c[2], raw=True, strict_map_key=False).get(b"bg")
        if g:
            seen[g] = seen.get(g, 0) + 1
    return max(seen, key=lambda g: seen[g]) if seen else None


class Replay:
    """One replay on one server: recorded calls with their entries mapped to this replay's."""

    def __init__(self, r: Any, code: dict[str, Any], generation: bytes | None,
                 template: list[str] | None = None, pin: bool = False,
                 order: dict[str, str] | None = None) -> None:
        """*code*: frontier_code's (its ``library`` or ``source`` pinned when *pin*): the
        tree's library is loaded and called by FCALL, with ARGV[3], when it has one.
        *order*: client_order's; with a *template*, each call names as its previous op the
        one its client would name in this replay: the client's previous call, or when that
        one cached no reply (``nc``) or failed, the op that call named (frontier/call.py)."""
        self.r, self.generation = r, generation
        self.order = order or {}
        self.alias: dict[str, str] = {}  # op of a call that cached no reply -> its previous op
        self.uncached = 0  #: replies of calls that cached none (``nc``)
        self.function: str | None = code.get("function") if code.get("library") else None
        self.constants = [c.encode() for c in code.get("constants") or []]
        if self.function:
            r.function_load(pinned(code["library"]) if pin else code["library"], replace=True)
        else:
            self.sha = r.script_load(pinned(code["source"]) if pin else code["source"])
        #: this tree's KEYS for "@OP@" "@PREV@" "@W@" (None: the recorded KEYS as they are)
        self.template, self.pin = template, pin
        self.replies: list[Any] = []  # (pin) each call's reply bytes, or its error
        self.held: dict[bytes, list[list[Any]]] = {}  # worker -> [[id, token]] leased here
        self.calls = self.errors = self.acked = self.lost = 0
        self.first = True

    def remap(self, arg: bytes) -> tuple[bytes, bytes]:
        req = msgpack.unpackb(arg, raw=True, strict_map_key=False)
        worker = req.get(b"w") or b""
        mine = self.held.setdefault(worker, [])
        mapped: dict[Any, list[Any]] = {}
        for name in ENTRY_LISTS:
            for e in req.get(name) or []:
                if e[0] not in mapped:
                    # a recorded entry with no counterpart keeps its id: a stale entry, as lost
                    mapped[e[0]] = mine[len(mapped)] if len(mapped) < len(mine) else e[:2]
                e[0], e[1] = mapped[e[0]][0], mapped[e[0]][1]
        done = {e[0] for name in (b"a", b"r", b"d") for e in req.get(name) or []}
        self.held[worker] = [e for e in mine if e[0] not in done]
        return msgpack.packb(req, use_bin_type=False), worker

    def call(self, record: list[Any]) -> None:
        at, keys, arg, monitor, *more = record
        if more:  # (recorded with ARGV[3]: the whole argument in ARGV[1] again, as call_args)
            arg = msgpack.packb({**msgpack.unpackb(more[0], raw=True, strict_map_key=False),
                                 **msgpack.unpackb(arg, raw=True, strict_map_key=False)},
                                use_bin_type=False)
        op = prev = ""
        if self.template is not None:
            _, _, op, prev, worker_id = call_names(keys)
            prev = self.order.get(op, prev)
            while prev in self.alias:
                prev = self.alias[prev]
            keys = [k.replace("@OP@", op).replace("@PREV@", prev).replace("@W@", worker_id)
                    for k in self.template]
        arg, worker = self.remap(arg)
        self.calls += 1
        if self.pin:
            self.r.set(PIN_TIME_KEY, int(at * 1e6))
        try:
            if self.function:
                arg1, cst = split_arg(arg, self.constants)
                reply = self.r.fcall(self.function, len(keys), *keys, arg1, monitor, cst)
            else:
                reply = self.r.evalsha(self.sha, len(keys), *keys, arg, monitor)
        except Exception as exc:  # (counted and reported: a replay that errs is no figure)
            self.errors += 1
            self.replies.append(f"error: {exc}")
            if op and op != prev:
                self.alias[op] = prev  # (it wrote nothing: its client names prev again)
            return
        self.replies.append(reply)
        out = msgpack.unpackb(reply, raw=True, strict_map_key=False)
        if out.get(b"nc"):
            self.uncached += 1
            if op and op != prev:
                self.alias[op] = prev
        self.held.setdefault(worker, []).extend([e[0], e[1]] for e in out.get(b"leased") or [])
        self.acked += out.get(b"acked") or 0
        self.lost += len(out.get(b"lost") or [])
        if self.first and self.generation:
            meta = next(k for k in keys if k.endswith(":bloom:meta"))
            self.r.hset(meta, "g", self.generation)
        self.first = False


def script_stats(r: Any) -> dict[str, int]:
    """usec and calls of FCALL and EVALSHA since the last CONFIG RESETSTAT."""
    st = r.info("commandstats")
    ran = [st[name] for name in ("cmdstat_fcall", "cmdstat_evalsha") if name in st]
    return {"usec": sum(int(x["usec"]) for x in ran), "calls": sum(int(x["calls"]) for x in ran)}


def replay_once(code: dict[str, Any], calls: list[list[Any]], skip: int,
                generation: bytes | None, root: Path,
                template: list[str] | None = None) -> dict[str, float]:
    with h.Redis(root) as server:
        r = server.client()
        rp = Replay(r, code, generation, template, order=client_order(calls))
        for record in calls[:skip]:
            rp.call(record)
        acked0 = rp.acked
        r.config_set("slowlog-log-slower-than", 1000)
        r.config_set("slowlog-max-len", 100000)
        r.slowlog_reset()
        r.config_resetstat()
        cpu0 = bc.redis_cpu(server.proc.pid)  # type: ignore[union-attr]
        for record in calls[skip:]:
            rp.call(record)
        cpu = bc.redis_cpu(server.proc.pid) - cpu0  # type: ignore[union-attr]
        st = script_stats(r)
        n = max(int(st["calls"]), 1)
        pages = max(rp.acked - acked0, 1)
        slow = [int(e["duration"]) for e in r.slowlog_get(100000)]
        r.close()
        return {"usec_per_call": st["usec"] / n, "cpu_us_per_call": cpu * 1e6 / n,
                "pages_per_call": pages / n, "exec_us_per_page": st["usec"] / pages,
                "errors": rp.errors, "lost": rp.lost, "uncached": rp.uncached,
                "longest_us": max(slow, default=0),
                "over_2ms": sum(1 for d in slow if d > 2000)}


def data_of(r: Any) -> dict[bytes, Any]:
    """Every key of a server (but PIN_TIME_KEY): its type and content, a cached reply
    (``:op:`` keys) decoded."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter(count=1000)):
        if key == PIN_TIME_KEY.encode():
            continue
        t = r.type(key)
        if t == b"string":
            v: Any = r.get(key)
            if b":op:" in key:
                v = msgpack.unpackb(v, raw=True, strict_map_key=False)
        elif t == b"hash":
            v = sorted(r.hgetall(key).items())
        elif t == b"list":
            v = r.lrange(key, 0, -1)
        elif t == b"zset":
            v = r.zrange(key, 0, -1, withscores=True)
        elif t == b"set":
            v = sorted(r.smembers(key))
        else:
            v = repr(t)
        out[key] = (t, v)
    return out


def identity_once(code: dict[str, Any], template: list[str], calls: list[list[Any]],
                  generation: bytes | None, root: Path) -> tuple[list[Any], dict[bytes, Any]]:
    with h.Redis(root) as server:
        r = server.client()
        rp = Replay(r, code, generation, template, pin=True, order=client_order(calls))
        for record in calls:
            rp.call(record)
        data = data_of(r)
        r.close()
        return rp.replies, data


def identity(args: argparse.Namespace) -> None:
    calls = read_calls(Path(args.file))
    generation = recorded_generation(calls)
    prefix, crawl, *_ = call_names(calls[0][1])
    trees = {"this": h.REPO_ROOT, "base": args.baseline.resolve()}
    got = {}
    with h.workdir("fleet-identity-") as root:
        for name, tree in trees.items():
            got[name] = identity_once(frontier_code(tree, root),
                                      key_template(tree, root, prefix, crawl), calls,
                                      generation, root / name)
    (this_replies, this_data), (base_replies, base_data) = got["this"], got["base"]
    base_replies, base_data = renamed(base_replies, base_data, args.key_renamed,
                                      args.field_renamed)
    same_bytes = sum(1 for a, b in zip(this_replies, base_replies, strict=True) if a == b)

    def decoded(x: Any) -> Any:
        return msgpack.unpackb(x, raw=True, strict_map_key=False) if isinstance(x, bytes) else x

    def as_read(x: Any) -> Any:
        # a reply as the client reads it: one that cached no reply (nc, lua/step_reply.lua)
        # leaves out its empty lists and zero counts, which CallResult reads so
        d = decoded(x)
        if isinstance(d, dict) and d.get(b"nc"):
            d = {**UNCACHED_LEFT_OUT, **d}
            del d[b"nc"]
        return d

    same_value = sum(1 for a, b in zip(this_replies, base_replies, strict=True)
                     if decoded(a) == decoded(b))
    same_read = sum(1 for a, b in zip(this_replies, base_replies, strict=True)
                    if as_read(a) == as_read(b))
    uncached = sum(1 for x in this_replies if isinstance(x, bytes) and decoded(x).get(b"nc"))
    errors = sum(1 for x in base_replies if isinstance(x, str))
    only = {k.encode() for k in (args.only_this or [])}
    this_keys = {k for k in this_data if not any(k.endswith(o) for o in only)}
    differ = sorted(k for k in this_keys | set(base_data) if this_data.get(k) != base_data.get(k))
    # reply caches (``:op:`` keys): after a client's last call that cached none, its previous
    # cached call's stays where a tree caching every call keeps that last one's
    caches = [k for k in differ if b":op:" in k]
    differ = [k for k in differ if b":op:" not in k]
    leased = sum(len(decoded(x).get(b"leased") or []) for x in base_replies
                 if isinstance(x, bytes))
    kinds: dict[str, int] = {}
    for x in base_replies:
        if isinstance(x, bytes):
            d = decoded(x)
            for name in ("new", "dup", "acked", "released", "reclaimed", "dead", "parked",
                         "deferred", "resumed", "refused"):
                kinds[name] = kinds.get(name, 0) + int(d.get(name.encode()) or 0)
            kinds["lost"] = kinds.get("lost", 0) + len(d.get(b"lost") or [])
    figures = {"calls": len(calls), "replies_identical_bytes": same_bytes, "in_replies": kinds,
               "replies_identical_decoded": same_value, "errors_in_both": errors,
               "replies_identical_as_read": same_read, "replies_uncached_this": uncached,
               "reply_caches_differing": len(caches),
               "leases_in_replies": leased, "keys_compared": len(base_data),
               "keys_only_this_by_design": sorted(k.decode() for k in set(this_data) - this_keys),
               "keys_differing": [k.decode(errors="replace") for k in differ[:20]],
               "n_keys_differing": len(differ),
               "hash_fields_differing": fields_differing(this_data, base_data, differ)}
    print(f"{len(calls)} calls replayed with the clock pinned: replies identical {same_bytes} "
          f"(bytes), {same_value} (decoded), {same_read} (as the client reads them; {uncached} "
          f"of this tree's cached no reply) of {len(base_replies)} ({errors} errors in the "
          f"baseline, {leased} leases); data: {len(base_data)} keys compared, "
          f"{len(differ)} differ (and {len(caches)} reply caches); only in this tree by design: "
          f"{figures['keys_only_this_by_design']}; the replies hold {kinds}", flush=True)
    h.emit_json(figures)


def renamed(replies: list[Any], data: dict[bytes, Any], keys: list[str],
            fields: list[str]) -> tuple[list[Any], dict[bytes, Any]]:
    """The baseline's replies and data with the names changed on purpose mapped to this
    tree's: key name endings (``OLD=NEW``) and reply map fields (``OLD=NEW``, in the replies,
    re-packed, and in the decoded reply caches)."""
    key_map = [tuple(x.encode().split(b"=", 1)) for x in keys]
    field_map = dict(tuple(x.encode().split(b"=", 1)) for x in fields)
    if not key_map and not field_map:
        return replies, data

    def fix(reply: dict[bytes, Any]) -> dict[bytes, Any]:
        return {field_map.get(k, k): v for k, v in reply.items()}
    out_replies = [msgpack.packb(fix(msgpack.unpackb(x, raw=True, strict_map_key=False)),
                                 use_bin_type=False) if isinstance(x, bytes) and field_map
                   else x for x in replies]
    out_data: dict[bytes, Any] = {}
    for key, (t, v) in data.items():
        for old, new in key_map:
            if key.endswith(old):
                key = key[:len(key) - len(old)] + new
        if b":op:" in key and isinstance(v, dict):
            v = fix(v)
        out_data[key] = (t, v)
    return out_replies, out_data


def fields_differing(this: dict[bytes, Any], base: dict[bytes, Any],
                     differ: list[bytes]) -> dict[str, list[str]]:
    """For each differing key that is a hash in both trees: the fields whose values differ
    (or that one tree alone has)."""
    out: dict[str, list[str]] = {}
    for key in differ:
        a, b = this.get(key), base.get(key)
        if a is None or b is None or a[0] != b"hash" or b[0] != b"hash":
            continue
        fa, fb = dict(a[1]), dict(b[1])
        out[key.decode(errors="replace")] = sorted(
            f.decode(errors="replace") for f in fa.keys() | fb.keys() if fa.get(f) != fb.get(f))
    return out


def record_mix(args: argparse.Namespace) -> None:
    """Frontier calls of every kind, from a seeded random mix of 4 workers and the push helper
    on one fresh server (this tree's FrontierAdmin, recorded as bench_capacity records): the
    bounds (FLEET_QUEUE_MAX, FLEET_HOST_QUEUE_MAX: refusals, parking, deferrals), a host
    concurrency cap and interval, acknowledgements with links and failure records, downloads
    over, extensions, releases, dead letters, stale tokens, expired leases (short leases and
    pauses), pushes with a delay, heartbeats and counter deltas, calls without events (a
    heartbeat alone: lua/step_reply.lua caches no reply)."""
    import random
    import time

    from scrapy_fleet.frontier.admin import FrontierAdmin
    from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams

    path = Path(args.file).resolve()
    path.unlink(missing_ok=True)
    bc.record_calls(str(path))
    rng = random.Random(args.seed)
    params = FrontierParams(lease_timeout=0.3, max_leases=2, queue_max=300, host_queue_max=40,
                            host_concurrency=3, host_interval=0.002, defer_delay=0.05)
    urls = [f"http://h{i % 23}.test/{i}" for i in range(3000)]

    def push_entry(url: str, group: int, delay: int = 0) -> tuple[Any, ...]:
        fp = hashlib.blake2b(url.encode(), digest_size=12).digest()
        return (fp, rng.randint(-2, 2), url.encode() * 3, group, url.split("/")[2], delay)

    with h.workdir("fleet-mix-") as root, h.Redis(root) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        helper = FrontierAdmin(url, "mix", params=params)
        workers = {f"w{i}": FrontierAdmin(url, "mix", params=params) for i in range(4)}
        held: dict[str, list[Any]] = {w: [] for w in workers}
        helper.push([push_entry(u, 0) for u in urls[:200]])
        for n in range(args.calls):
            if rng.random() < 0.05:
                helper.push([push_entry(rng.choice(urls), 0, rng.choice([0, 0, 30]))
                             for _ in range(rng.randint(1, 30))])
                continue
            w = rng.choice(list(workers))
            mine = held[w]
            rng.shuffle(mine)
            batch = CallBatch(take=rng.choice([0, 1, 2, 4, 8]), beat=True)
            for e in mine[:rng.randint(0, 4)]:
                batch.downloaded.append((e.entry_id, e.token))
            done = mine[:rng.randint(0, min(len(mine), 5))]
            for e in done:
                r = rng.random()
                if r < 0.08:
                    batch.releases.append((e.entry_id, e.token))
                elif r < 0.1:
                    batch.dead.append((e.entry_id, e.token, "cannot decode"))
                else:
                    token = e.token if rng.random() > 0.03 else e.token - 1  # a stale one
                    if rng.random() < 0.1:
                        record = msgpack.packb({"reason": "http_500", "url": "x"},
                                               use_bin_type=False)
                        batch.acks.append((e.entry_id, token, record))
                    else:
                        batch.acks.append((e.entry_id, token))
                    k = len(batch.acks)
                    batch.pushes += [push_entry(rng.choice(urls), k)
                                     for _ in range(rng.randint(0, 12))]
            batch.extends += [(e.entry_id, e.token) for e in mine[len(done):]
                              if rng.random() < 0.3]
            beat: dict[str, Any] = {"hb": {"st": "crawling", "l": len(mine), "pg": n},
                                    "da": 15000, "fa": 120000}
            if batch.acks or rng.random() < 0.5:  # (else a heartbeat alone)
                beat.update(cs=n + 1, c={"pages": len(batch.acks)}, hp=[["h1.test", 1, 0]])
            monitor = msgpack.packb(beat, use_bin_type=False)
            result = workers[w].call(batch, worker=w, monitor=monitor)
            gone = {e[0] for e in [*batch.acks, *batch.releases, *batch.dead]} | set(result.lost)
            held[w] = [e for e in mine if e.entry_id not in gone] + list(result.leased)
            if rng.random() < 0.03:
                time.sleep(0.35)  # leases expire: reclaimed by the next calls
    print(f"recorded {len(read_calls(path))} calls of the mix", flush=True)


def record(args: argparse.Namespace) -> None:
    path = Path(args.file).resolve()
    path.unlink(missing_ok=True)
    os.environ["BENCH_CAPTURE"] = str(path)
    with h.workdir("fleet-record-") as root:
        cell = bc.run_cell("new", h.REPO_ROOT, args.clients, args.hosts, args.seconds, root,
                           args.seeds)
    print(f"recorded {len(read_calls(path))} calls of c={args.clients} h={args.hosts}: "
          f"{cell['pages']} pages, {cell['exec_us_per_page']} µs/page live", flush=True)


def run_rounds(calls: list[list[Any]], trees: dict[str, Path], rounds: int, skip: int,
               ) -> dict[str, list[dict[str, float]]]:
    """Per round, each tree's replay on a fresh server (KEYS rebuilt by each tree's own
    CrawlKeys)."""
    generation = recorded_generation(calls)
    prefix, crawl, *_ = call_names(calls[0][1])
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with h.workdir("fleet-replay-") as root:
        sources = {name: frontier_code(tree, root) for name, tree in trees.items()}
        templates = {name: key_template(tree, root, prefix, crawl)
                     for name, tree in trees.items()}
        for k in range(rounds):
            for name in trees:
                results[name].append(replay_once(sources[name], calls, skip, generation,
                                                 root / f"{name}-{k}", templates[name]))
    return results


def compare(path: Path, trees: dict[str, Path], rounds: int, skip: int) -> dict[str, float]:
    """Minimum FCALL/EVALSHA µs per call of trees "this" and "base" over *rounds*, and their ratio
    (for bench_fixed.py)."""
    results = run_rounds(read_calls(path), trees, rounds, skip)
    this = min(x["usec_per_call"] for x in results["this"])
    base = min(x["usec_per_call"] for x in results["base"])
    cpu_this = min(x["cpu_us_per_call"] for x in results["this"])
    cpu_base = min(x["cpu_us_per_call"] for x in results["base"])
    return {"this": round(this, 1), "base": round(base, 1), "ratio": round(this / base, 3),
            "cpu_this": round(cpu_this, 1), "cpu_base": round(cpu_base, 1),
            "cpu_ratio": round(cpu_this / cpu_base, 3),
            "errors": max(x["errors"] for rows in results.values() for x in rows)}


def replay(args: argparse.Namespace) -> None:
    calls = read_calls(Path(args.file))
    trees = {"this": h.REPO_ROOT}
    if args.baseline:
        trees["base"] = args.baseline.resolve()
    results = run_rounds(calls, trees, args.rounds, args.skip)
    print(f"{len(calls)} calls, {len(calls) - args.skip} measured, {args.rounds} rounds")
    base_min = min(x["usec_per_call"] for x in results["this"])
    figures: dict[str, Any] = {"machine": h.machine(), "calls": len(calls), "trees": {}}
    for name, rows in results.items():
        usec = [x["usec_per_call"] for x in rows]
        row = {"tree": str(trees[name]), "usec_per_call_min": round(min(usec), 1),
               "usec_per_call_median": round(h.median(usec), 1),
               "cpu_us_per_call_median": round(h.median([x["cpu_us_per_call"] for x in rows]), 1),
               "pages_per_call": round(h.median([x["pages_per_call"] for x in rows]), 2),
               "exec_us_per_page_min": round(min(x["exec_us_per_page"] for x in rows), 1),
               "ratio_to_this": round(min(usec) / base_min, 3),
               "errors": max(x["errors"] for x in rows), "lost": max(x["lost"] for x in rows),
               "uncached": max(x.get("uncached", 0) for x in rows),
               # the longest call and the calls over 2 ms: of the round with the fewest (the
               # other rounds add what the machine's load adds)
               "longest_us": min(x["longest_us"] for x in rows),
               "over_2ms": min(x["over_2ms"] for x in rows)}
        figures["trees"][name] = row
        print(f"{name:>5}: {row['usec_per_call_min']} µs/call (median "
              f"{row['usec_per_call_median']}), CPU {row['cpu_us_per_call_median']} µs/call, "
              f"{row['pages_per_call']} pages/call, {row['exec_us_per_page_min']} µs/page, "
              f"x{row['ratio_to_this']} this tree's, longest {row['longest_us']} µs, "
              f"{row['over_2ms']} over 2 ms, errors {row['errors']}, lost {row['lost']}, "
              f"uncached {row['uncached']}", flush=True)
    h.emit_json(figures)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    rec = sub.add_parser("record", help="record one bench_capacity cell's frontier calls")
    rec.add_argument("file")
    rec.add_argument("--clients", type=int, default=16)
    rec.add_argument("--hosts", type=int, default=100)
    rec.add_argument("--seconds", type=float, default=6.0)
    rec.add_argument("--seeds", type=int, default=2000)
    rep = sub.add_parser("replay", help="replay recorded calls on this tree and a baseline")
    rep.add_argument("file")
    rep.add_argument("--baseline", type=Path, default=None)
    rep.add_argument("--rounds", type=int, default=3)
    rep.add_argument("--skip", type=int, default=50)
    mix = sub.add_parser("record-mix", help="record a seeded mix of every kind of call")
    mix.add_argument("file")
    mix.add_argument("--calls", type=int, default=3000)
    mix.add_argument("--seed", type=int, default=20)
    ide = sub.add_parser("identity", help="replies and data of this tree and a baseline, "
                                          "clock pinned")
    ide.add_argument("file")
    ide.add_argument("--baseline", type=Path, required=True)
    ide.add_argument("--only-this", nargs="*", default=[":layout"],
                     help="key name endings only this tree writes by design")
    ide.add_argument("--key-renamed", nargs="*", default=[],
                     help="OLD=NEW: a baseline key name ending this tree names NEW")
    ide.add_argument("--field-renamed", nargs="*", default=[],
                     help="OLD=NEW: a field of the baseline's reply this tree names NEW")
    args = p.parse_args()
    if args.action == "record":
        record(args)
    elif args.action == "record-mix":
        record_mix(args)
    elif args.action == "identity":
        identity(args)
    else:
        replay(args)


if __name__ == "__main__":
    main()
