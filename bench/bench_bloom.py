"""Memory and false-positive rate of the fleet's scalable Bloom filter in Redis.

1. Capacity 1,000,000 at error rate 0.001: insert 1,000,000 fingerprints with the fleet's own
   ``bloom_add.lua`` (batches of ``--batch``), report the slice keys' STRLEN and
   ``MEMORY USAGE`` against the formula (``bloom.slice_params``: 14,377,588 bits = 1.80 MB),
   then check 1,000,000 fresh fingerprints with a read-only script (the same ``bloom.lua``
   library + a check-only entry defined here) and count how many report "seen".
2. Baseline: a Redis SET holding the same 1,000,000 fingerprints as 20-byte SHA-1 digests
   (what a SET-based dupefilter keeps), ``MEMORY USAGE ... SAMPLES 0``.
3. Growth: capacity 100,000, insert the same 1,000,000, so the filter grows to several
   slices; compound false-positive rate on 1,000,000 fresh fingerprints and memory.

Fingerprints are Scrapy-like 20-byte SHA-1 digests of distinct URLs, turned into 12-byte
Bloom keys by ``bloom.bloom_key`` exactly as the worker does.

Usage: ``.venv/bin/python bench/bench_bloom.py [--n 1000000] [--batch 2000]``
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
import uuid
from importlib import resources
from typing import Any

import _harness as h
import msgpack
import redis

from scrapy_fleet import lua
from scrapy_fleet.frontier.bloom import bloom_key, slice_params
from scrapy_fleet.keys.calls import BLOOM_MAX_SLICES
from scrapy_fleet.keys.crawl import CrawlKeys

ERROR_RATE = 0.001
OP_TTL_MS = 60_000

#: Read-only check, appended to scrapy_fleet/lua/common.lua + bloom.lua (locals only).
CHECK_LUA = """
-- bench only: count how many fingerprints the filter reports as seen, without adding them
-- KEYS: 1 bloom meta, 2.. slices   ARGV: 1 capacity, 2 error rate, 3.. fingerprints
local slice_keys = {}
for i = 2, #KEYS do slice_keys[#slice_keys + 1] = KEYS[i] end
local bloom = bloom_open(KEYS[1], slice_keys, tonumber(ARGV[1]), tonumber(ARGV[2]))
local seen = 0
for i = 3, #ARGV do
  if bloom_contains(bloom, ARGV[i]) then seen = seen + 1 end
end
return seen
"""


def sha1s(prefix: str, n: int) -> list[bytes]:
    return [hashlib.sha1(f"https://example.com/{prefix}/{i}.html".encode()).digest()
            for i in range(n)]


class Filter:
    """One crawl's Bloom filter, driven through the fleet's scripts."""

    def __init__(self, client: redis.Redis, crawl_id: str, capacity: int) -> None:
        self.client = client
        self.keys = CrawlKeys("fleet", crawl_id)
        self.capacity = capacity
        self.slices = [self.keys.bloom_slice(i) for i in range(BLOOM_MAX_SLICES)]
        self._add = lua.load(client, "bloom_add.lua")
        folder = resources.files("scrapy_fleet") / "lua"
        lib = "\n".join((folder / name).read_text("utf-8") for name in ("common.lua", "bloom.lua"))
        self._check = client.register_script(lib + "\n" + CHECK_LUA)
        self._prev = "-"

    def add(self, fps: list[bytes], batch: int) -> int:
        new = 0
        for i in range(0, len(fps), batch):
            op = uuid.uuid4().hex
            reply = self._add(
                keys=[self.keys.op(op), self.keys.op(self._prev), self.keys.bloom_meta,
                      *self.slices],
                args=[self.capacity, ERROR_RATE, OP_TTL_MS, *fps[i:i + batch]])
            self._prev = op
            new += sum(msgpack.unpackb(reply))
        return new

    def count_seen(self, fps: list[bytes], batch: int) -> int:
        seen = 0
        for i in range(0, len(fps), batch):
            seen += int(self._check(keys=[self.keys.bloom_meta, *self.slices],
                                    args=[self.capacity, ERROR_RATE, *fps[i:i + batch]]))
        return seen

    def memory(self) -> dict[str, Any]:
        raw = self.client.hgetall(self.keys.bloom_meta)
        meta = {k.decode(): v.decode() for k, v in raw.items()}
        n_slices = int(meta.get("slices", 0))
        rows = []
        for i in range(n_slices):
            key = self.slices[i]
            expected = slice_params(int(meta["n0"]), float(meta["p"]), i)
            rows.append({"slice": i, "count": int(meta.get(f"c{i}", 0)),
                         "capacity": expected.capacity, "hashes": expected.hashes,
                         "formula_bytes": expected.bytes,
                         "strlen": int(self.client.strlen(key)),
                         "memory_usage": int(self.client.memory_usage(key, samples=0) or 0)})
        meta_mem = int(self.client.memory_usage(self.keys.bloom_meta, samples=0) or 0)
        return {"slices": rows, "n_slices": n_slices, "meta_bytes": meta_mem,
                "formula_bytes": sum(r["formula_bytes"] for r in rows),
                "strlen": sum(r["strlen"] for r in rows),
                "memory_usage": sum(r["memory_usage"] for r in rows) + meta_mem}


def mb(n: float) -> str:
    return f"{n / 1e6:6.2f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="fingerprints inserted")
    parser.add_argument("--batch", type=int, default=2000, help="fingerprints per script call")
    parser.add_argument("--small-capacity", type=int, default=100_000)
    args = parser.parse_args(argv)
    n = args.n

    t0 = time.monotonic()
    inserted = sha1s("seen", n)
    fresh = sha1s("fresh", n)
    keys_in = [bloom_key(fp) for fp in inserted]
    keys_fresh = [bloom_key(fp) for fp in fresh]
    print(f"{n:,} + {n:,} fingerprints prepared in {time.monotonic() - t0:.1f} s")

    fig: dict[str, Any] = {"bench": "bloom", **h.machine(), "n": n, "error_rate": ERROR_RATE}
    with h.workdir() as root, h.Redis(root) as server:
        client = server.client()
        for label, capacity in (("full", n), ("grown", args.small_capacity)):
            flt = Filter(client, f"bench-{label}", capacity)
            t = time.monotonic()
            new = flt.add(keys_in, args.batch)
            add_s = time.monotonic() - t
            t = time.monotonic()
            seen = flt.count_seen(keys_fresh, 5000)
            check_s = time.monotonic() - t
            mem = flt.memory()
            fig[label] = {"capacity": capacity, "added_new": new,
                          "insert_false_positives": n - new,
                          "fp_rate": seen / n, "fresh_seen": seen,
                          "insert_per_s": round(n / add_s), "check_per_s": round(n / check_s),
                          **{k: mem[k] for k in ("n_slices", "formula_bytes", "strlen",
                                                  "memory_usage", "meta_bytes")},
                          "slices": mem["slices"]}
            client.delete(*(k for k in client.scan_iter(match=flt.keys.op_prefix + "*")))

        # the baseline: a SET of the same 20-byte SHA-1 fingerprints
        before = client.info("memory")["used_memory"]
        t = time.monotonic()
        pipe = client.pipeline(transaction=False)
        for i in range(0, n, 10_000):
            pipe.sadd("bench:set", *inserted[i:i + 10_000])
        pipe.execute()
        set_s = time.monotonic() - t
        after = client.info("memory")["used_memory"]
        fig["set"] = {"members": int(client.scard("bench:set")),
                      "memory_usage": int(client.memory_usage("bench:set", samples=0) or 0),
                      "used_memory_delta": after - before, "insert_per_s": round(n / set_s)}
        client.close()

    full, grown, st = fig["full"], fig["grown"], fig["set"]
    fig["bloom_vs_set"] = round(full["memory_usage"] / st["memory_usage"], 4)
    theory_fp_grown = sum(ERROR_RATE * 0.5 ** i for i in range(grown["n_slices"] - 1))
    print(f"\nScalable Bloom filter, error rate {ERROR_RATE}, {n:,} fingerprints inserted "
          f"through bloom_add.lua in batches of {args.batch}")
    for label, title in (("full", "capacity"), ("grown", "capacity")):
        f = fig[label]
        print(f"  {title} {f['capacity']:>9,}: {f['n_slices']} slice(s); formula "
              f"{mb(f['formula_bytes'])}, STRLEN {mb(f['strlen'])}, MEMORY USAGE "
              f"{mb(f['memory_usage'])} (meta hash {f['meta_bytes']} B)")
        for s in f["slices"]:
            print(f"      slice {s['slice']}: {s['count']:>9,} / {s['capacity']:>9,} fps, "
                  f"k={s['hashes']:2d}, formula {mb(s['formula_bytes'])}, STRLEN "
                  f"{mb(s['strlen'])}, MEMORY USAGE {mb(s['memory_usage'])}")
        print(f"      false positives on {n:,} fresh URLs: {f['fresh_seen']:,} = "
              f"{f['fp_rate']:.5f}; duplicates reported while inserting {n:,} distinct: "
              f"{f['insert_false_positives']:,}; {f['insert_per_s']:,} inserts/s, "
              f"{f['check_per_s']:,} checks/s")
    print(f"      (growth bound: compound rate of the full slices "
          f"{theory_fp_grown:.5f} + the open slice's share; never above {2 * ERROR_RATE})")
    print(f"  Redis SET of {st['members']:,} 20-byte SHA-1 fingerprints: MEMORY USAGE "
          f"{mb(st['memory_usage'])} (used_memory grew {mb(st['used_memory_delta'])})")
    print(f"  Bloom (capacity {n:,}) / SET memory: {fig['bloom_vs_set']:.3f} "
          f"(1 / {1 / fig['bloom_vs_set']:.1f})")
    bits = -math.log(ERROR_RATE) / math.log(2) ** 2
    print(f"  formula: {bits:.2f} bits = {bits / 8:.2f} bytes per fingerprint at {ERROR_RATE}")
    print()
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
