"""What one unit of a frontier call costs inside a Lua script: the floor of Redis time per page.

Each case is one EVALSHA that does N times (N = 1,000) the same unit of work of
lua/frontier.lua (a command with one key, a 512-byte GETRANGE, a hash field written in a
batched HSET, a Bloom bit set, a pushed link decoded by cmsgpack, ...) on a fresh
``redis-server``; its cost per unit is (usec of the call - usec of the same script without the
unit) / N, the median of --rounds calls (``INFO commandstats``, wall time inside Redis).

Then the floor of a page of the shape bench_capacity.py crawls (10 links, ~90 % duplicates, of
which the workers' cache leaves some out: --links-sent, default 6.4 as measured with 16 clients
and 100 hosts; one new link): the units a page needs at the least with the frontier's data
model, whatever the Lua around them — its Bloom lookups and new bits, its links decoded, its
acknowledgement's and its lease's records, its bucket entry in and out, its host's politeness
fields read and written — summed with these costs.  The call's fixed part (op-id cache, idle
bookkeeping, counters) and all Lua logic (validation, the host heap, the batching) come on top.

Usage: ``.venv/bin/python bench/bench_lua_costs.py [--rounds 15] [--links-sent 6.4]``
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import _harness as h
import msgpack

N = 1000
#: name -> (setup Lua run once per call, body with the unit, body without it); i is 1..N
CASES: dict[str, tuple[str, str, str]] = {
    "command, one key (EXISTS)": ("", "redis.call('EXISTS', KEYS[1])", ""),
    "GETRANGE of a 512-byte Bloom block": (
        "", "redis.call('GETRANGE', KEYS[2], (i % 3000) * 512, (i % 3000) * 512 + 511)", ""),
    "hash field read (HMGET of 100)": (
        "local f = {} for j = 1, 100 do f[j] = 'f' .. j end",
        "if i % 100 == 0 then redis.call('HMGET', KEYS[3], unpack(f)) end", ""),
    "hash field written, 200 B (HSET of 100)": (
        "local a = {} local v = string.rep('v', 200)",
        "a[#a + 1] = 'f' .. (i % 100) a[#a + 1] = v "
        "if #a == 200 then redis.call('HSET', KEYS[4], unpack(a)) a = {} end",
        "a[#a + 1] = 'f' .. (i % 100) a[#a + 1] = v if #a == 200 then a = {} end"),
    "hash field written and deleted, 200 B (HSET + HDEL of 100)": (
        "local a, f = {}, {} local v = string.rep('v', 200)",
        "a[#a + 1] = 'n' .. i a[#a + 1] = v f[#f + 1] = 'n' .. i "
        "if #f == 100 then redis.call('HSET', KEYS[5], unpack(a)) "
        "redis.call('HDEL', KEYS[5], unpack(f)) a, f = {}, {} end",
        "a[#a + 1] = 'n' .. i a[#a + 1] = v f[#f + 1] = 'n' .. i "
        "if #f == 100 then a, f = {}, {} end"),
    "sorted set member added and removed, 1,000 members (ZADD + ZREM of 100)": (
        "local a, m = {}, {}",
        "a[#a + 1] = i a[#a + 1] = 'n' .. i m[#m + 1] = 'n' .. i "
        "if #m == 100 then redis.call('ZADD', KEYS[6], unpack(a)) "
        "redis.call('ZREM', KEYS[6], unpack(m)) a, m = {}, {} end",
        "a[#a + 1] = i a[#a + 1] = 'n' .. i m[#m + 1] = 'n' .. i "
        "if #m == 100 then a, m = {}, {} end"),
    "list entry pushed and taken, 200 B (RPUSH + LRANGE + LTRIM)": (
        "local v = string.rep('e', 200)",
        "redis.call('RPUSH', KEYS[7], v) redis.call('LRANGE', KEYS[7], 0, 0) "
        "redis.call('LTRIM', KEYS[7], 1, -1)", ""),
    "Bloom bit set (BITFIELD SET u1, 160 per command)": (
        "local a = {}",
        "a[#a + 1] = 'SET' a[#a + 1] = 'u1' a[#a + 1] = (i * 997) % 1000000 a[#a + 1] = 1 "
        "if #a == 640 then redis.call('BITFIELD', KEYS[2], unpack(a)) a = {} end",
        "a[#a + 1] = 'SET' a[#a + 1] = 'u1' a[#a + 1] = (i * 997) % 1000000 a[#a + 1] = 1 "
        "if #a == 640 then a = {} end"),
    "pushed link decoded (cmsgpack.unpack, per link of 100)": (
        "", "if i % 100 == 0 then local r = cmsgpack.unpack(ARGV[1]) end", ""),
    "lease value parsed (string.match)": (
        "local s = '17961454226557850|0|h00042.example.org\\tw3'",
        "local t, sc, rest = string.match(s, '^(%d+)|([^|]*)|(.*)$')", ""),
}


def script(setup: str, body: str) -> str:
    return f"{setup}\nfor i = 1, {N} do {body} end\nreturn 1"


def links_arg() -> bytes:
    payload = b"\x85" + b"p" * 170  # ~ an encoded followed link (bench_codec.py: ~174 B)
    pushes = [[b"f" * 12, 0, payload, 1 + j % 16, b"h%05d.example.org" % (j % 100)]
              for j in range(100)]
    return msgpack.packb({"p": pushes}, use_bin_type=False)  # type: ignore[no-any-return]


def measure(r: Any, rounds: int) -> dict[str, float]:
    keys = [f"k{j}" for j in range(1, 8)]
    r.set("k2", b"\0" * (3000 * 512))
    r.zadd("k6", {f"m{j}": j for j in range(1000)})  # a skiplist, as a crawl's leases
    r.hset("k3", mapping={f"f{j}": "x" * 30 for j in range(1000)})
    arg = links_arg()
    out: dict[str, float] = {}
    for name, (setup, body, bare) in CASES.items():
        with_sha = r.script_load(script(setup, body))
        bare_sha = r.script_load(script(setup, bare))
        times = []
        for _ in range(rounds):
            per = []
            for sha in (with_sha, bare_sha):
                r.config_resetstat()
                r.evalsha(sha, len(keys), *keys, arg)
                per.append(r.info("commandstats")["cmdstat_evalsha"]["usec"])
            times.append((per[0] - per[1]) / N)
        out[name] = round(h.median(times), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--links-sent", type=float, default=6.4)
    args = p.parse_args()
    with h.workdir("fleet-luacosts-") as root, h.Redis(Path(root)) as server:
        r = server.client()
        cost = measure(r, args.rounds)
        r.close()
    for name, us in cost.items():
        print(f"{us:8.3f} µs  {name}")
    c = cost
    floor = {
        "Bloom lookups (one GETRANGE per link sent)":
            args.links_sent * c["GETRANGE of a 512-byte Bloom block"],
        "the new link's 10 Bloom bits":
            10 * c["Bloom bit set (BITFIELD SET u1, 160 per command)"],
        "links sent, decoded":
            args.links_sent * c["pushed link decoded (cmsgpack.unpack, per link of 100)"],
        "the new entry in its bucket and out (leased)":
            c["list entry pushed and taken, 200 B (RPUSH + LRANGE + LTRIM)"],
        "lease written (lease, data) and deleted when acknowledged (lease, data, expiries)":
            2 * c["hash field written and deleted, 200 B (HSET + HDEL of 100)"]
            + c["hash field read (HMGET of 100)"],
        "lease expiry index: added, removed":
            c["sorted set member added and removed, 1,000 members (ZADD + ZREM of 100)"],
        "politeness: the host's slot counts (host, worker) read and written, ready set":
            2 * c["hash field read (HMGET of 100)"]
            + 2 * c["hash field written, 200 B (HSET of 100)"]
            + c["sorted set member added and removed, 1,000 members (ZADD + ZREM of 100)"] / 2,
    }
    total = sum(floor.values())
    print(f"\nfloor of one page ({args.links_sent} links sent, 1 new):")
    for name, us in floor.items():
        print(f"{us:8.2f} µs  {name}")
    print(f"{total:8.2f} µs  in all (the issue's goal: 30 µs per page, Lua logic included)")
    h.emit_json({"machine": h.machine(), "unit_us": cost,
                 "floor_us": {k: round(v, 2) for k, v in floor.items()},
                 "floor_total_us": round(total, 2), "links_sent": args.links_sent})


if __name__ == "__main__":
    main()
