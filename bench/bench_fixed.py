"""The frontier call's fixed part: Redis time of a call with no acks, no links, take 0.

Every worker call pays it (reply cache, marker, idle bookkeeping, heartbeat and counters), so
it is the floor under a fleet's Redis time per call.  Per tree (this one and ``--baseline``,
in alternating rounds, each on a fresh ``redis-server``): a crawl is seeded (``--entries``
queued requests over ``--hosts`` hosts, ``--leased`` of them leased by another worker), then
one worker makes ``--calls`` empty calls as its pump does between pages (a heartbeat in
ARGV[2], a fresh op id naming its previous one).  Reported: EVALSHA ``usec`` per call (INFO
commandstats: the script's own time and the commands it runs), the Redis commands per call,
min and median over the rounds, and the ratio of this tree's minimum to the baseline's.

Each tree's call is sent as its client sends it: FCALL of its Functions library
(lua/library.py) where it has one, else EVALSHA; the time is FCALL's or EVALSHA's.
``--evalsha`` also measures this tree's call as one EVALSHA of ``lua.source`` (every call
defining the parts again), beside its FCALL.

``--cuts`` measures where this tree's empty call spends its time instead: FCALL of a function
doing nothing with the call's KEYS, then the library's function cut after each part of its
entry file (the key table alone, the first MGET, the checks, ...), and the full call with one
of its commands run 20 times more (that command's own cost), all on one server, in
alternating rounds (minimum per variant).

``--replay FILE`` also replays recorded worker calls (bench_replay.py, same rounds) and prints
their ratio beside it, so both of issue 20's figures come from one run.

Usage: ``.venv/bin/python bench/bench_fixed.py --baseline ../base [--replay /tmp/calls]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import _harness as h

#: run in a child process whose PYTHONPATH is the tree measured: its own keys, argument
#: packing and Lua (so two layouts of KEYS are each called as their own client calls them)
CHILD = r"""
import json, sys, uuid
import msgpack, redis
from scrapy_fleet import lua
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.frontier.protocol import CallBatch, CallResult, FrontierParams, call_args
try:
    from scrapy_fleet.frontier.protocol import call_argv
except ImportError:  # (a tree sending the whole argument in ARGV[1])
    call_argv = None

port, calls, entries, hosts, leased, evalsha, pid = (int(x) for x in sys.argv[1:8])
#: under callgrind (--instructions): the parent zeroes the server's counters when told "zero"
#: and reads them when told "dump" (each answered by a line on stdin); no SLOWLOG then (its
#: entry per command would be counted in the call's instructions)
counted = len(sys.argv) > 8 and sys.argv[8] == "1"


def tell(what):
    print(what, flush=True)
    sys.stdin.readline()



def server_cpu():
    # utime + stime of the redis-server, seconds (not inflated when the machine's load
    # preempts it, unlike the commandstats' wall time)
    import os
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

r = redis.Redis(port=port)
# as the tree's client calls it: a function of its library (FCALL) where the tree has one,
# else EVALSHA; with evalsha, this tree's source by EVALSHA instead
script = (r.register_script(lua.source("frontier.lua")) if evalsha
          else lua.load(r, "frontier.lua"))
k = CrawlKeys("fleet", "fixed")
params = FrontierParams(host_concurrency=4, host_interval=0.05)
prev = {"": "-", "w-busy": "-", "w-idle": "-"}


marks = {}  # a worker's crawl marker, required from its second call on (as FrontierCall)


def argv(batch, worker, monitor):  # the call's ARGV as the tree's client sends it
    if call_argv is None:
        return [call_args(batch, worker, params, marks.get(worker, "")), monitor]
    arg, constants = call_argv(batch, worker, params, marks.get(worker, ""))
    return [arg, monitor, constants]


def follow(worker, op, reply):
    # as FrontierCall: the next call names this one, unless it cached no reply (nc: a call
    # without events, lua/step_reply.lua), and then the same previous op as this one did
    # (a variant of --cuts cut short replies 1)
    if not isinstance(reply, bytes) or not msgpack.unpackb(reply, raw=True).get(b"nc"):
        prev[worker] = op


def keys_of(op, worker, batch):  # the call's KEYS as the tree's client sends them
    try:  # (without the Bloom slices when it pushes nothing, in a tree that leaves them out)
        return k.frontier_keys(op, prev[worker], worker, slices=bool(batch.pushes))
    except TypeError:
        return k.frontier_keys(op, prev[worker], worker)


def call(batch, worker, monitor=b""):
    op = uuid.uuid4().hex
    keys = keys_of(op, worker, batch)
    reply = script(keys=keys, args=argv(batch, worker, monitor))
    follow(worker, op, reply)
    if worker and worker not in marks:
        marks[worker] = CallResult.from_reply(reply).marker
    return reply


pushes = [[i.to_bytes(12, "big"), 0, b"x" * 200, 0, "h%d.example" % (i % hosts)]
          for i in range(entries)]
for at in range(0, len(pushes), 500):
    call(CallBatch(pushes=pushes[at:at + 500]), "")
call(CallBatch(take=leased), "w-busy")
hb = msgpack.packb({"hb": {"st": "crawling", "l": 0, "dl": 0, "pg": 0, "it": 0, "er": 0,
                           "sv": "2.19", "fv": "0.1", "h": "m1", "pid": 1, "sa": 1.0,
                           "ro": "all"}, "da": 15000, "fa": 120000}, use_bin_type=False)
call(CallBatch(beat=True), "w-idle", hb)
r.config_resetstat()
# every call's own duration too (SLOWLOG at 0 µs): the mean of the faster half is what the
# machine's load inflates least (a call preempted mid-way is among the slower half)
if not counted:
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", calls + 10)
    r.slowlog_reset()
else:
    tell("zero")
cpu0 = server_cpu()
for _ in range(calls):
    call(CallBatch(beat=True), "w-idle", hb)
cpu = server_cpu() - cpu0
if counted:
    tell("dump")
took = sorted(int(e["duration"]) for e in r.slowlog_get(calls + 10)
              if bytes(e["command"]).split(b" ", 1)[0].upper() in (b"FCALL", b"EVALSHA")) or [0]
r.config_set("slowlog-log-slower-than", 10000)
st = r.info("commandstats")
ran = [st[name] for name in ("cmdstat_fcall", "cmdstat_evalsha") if name in st]
ev = {"usec": sum(x["usec"] for x in ran), "calls": sum(x["calls"] for x in ran) or 1}
others = sum(int(v["calls"]) for name, v in st.items()
             if name not in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_config",
                             "cmdstat_info", "cmdstat_slowlog"))
half = took[:max(len(took) // 2, 1)]
print(json.dumps({"usec": ev["usec"] / ev["calls"], "commands": others / ev["calls"],
                  "cpu_us": cpu * 1e6 / calls, "fast_half_us": sum(half) / len(half)}))
"""


#: the --cuts child: one server, the crawl seeded as above, then each variant of the call
#: (this tree's Functions library with the frontier function's entry file cut or added to)
CUTS = CHILD.split("r.config_resetstat()")[0] + r"""
from scrapy_fleet.lua import library, sources
rounds = int(sys.argv[8])
name, code = library.library()
driver = sources.entry("frontier.lua")
assert code.count(driver) == 1
cut_at = {"head": "if head[1] then\n  return head[1]\nend\n",
          "check": "if not c then return redis.error_reply(err) end\n",
          "begin": "begin_call(c)\n", "has_work": "keep_next_due(c)\n",
          "idle": "step_idle(c)\n", "monitor": "c.workers_first)\n"}
variants = {"keys": code.replace(driver, "return 1")}
for cut, mark in cut_at.items():
    variants[cut] = code.replace(driver, driver[:driver.index(mark) + len(mark)] + "return 1")
variants["full"] = code
# each command of the empty call, 20 times more, before the call's own return
more = {"MGET": "redis.call('MGET', K.op, K.marker, K.queue_count, K.idle_since, "
                "K.revisit_count, K.next_due, K.workers_first)",
        "HMGET (heartbeat)": "redis.pcall('HMGET', K.worker_info, 'seen', 'cs', 'hd')",
        "HMGET (mon)": "redis.pcall('HMGET', K.mon, 's1', 's2', 's3', 't0', 'lw')",
        "TIME": "redis.call('TIME')", "LLEN": "redis.call('LLEN', K.parked)",
        "ZCARD": "redis.call('ZCARD', K.leases)",
        "HMGET (stats)": "redis.call('HMGET', K.stats, 'response_queue_bytes', "
                         "'response_queue_deferred', 'response_queue_deferred_bytes')",
        "HGET": "redis.call('HGET', K.hostq, '~parse')", "HLEN": "redis.call('HLEN', K.hold)",
        "ZADD": "redis.call('ZADD', K.workers, 1, 'w-idle')",
        "ZREMRANGEBYSCORE": "redis.call('ZREMRANGEBYSCORE', K.workers, '-inf', 0)",
        # (on K.op, not yet written: K.prev_op is the chain of reply caches, lua/step_reply.lua)
        "DEL": "redis.call('DEL', K.op)",
        "SET": "redis.call('SET', K.op, string.rep('x', 300), 'PX', 300000)",
        "PEXPIRE": "redis.call('PEXPIRE', K.prev_op, 300000)"}
tail = "return step_reply(c)"
assert driver.endswith(tail + "\n")
for cmd, line in more.items():
    variants["+20 " + cmd] = code.replace(driver, driver[:len(driver) - len(tail) - 1]
                                          + "for _ = 1, 20 do " + line + " end\n" + tail + "\n")
# FCALL of a function doing nothing, with the call's KEYS (no key table)
variants["fcall"] = code
r.function_load("#!lua name=fleetcut\nredis.register_function('fleetcut_one', "
                "function() return 1 end)", replace=True)
fname = library.function_name("frontier.lua")
best = {}
for _ in range(rounds):
    for cut, source in variants.items():
        r.function_load(source, replace=True)
        called = "fleetcut_one" if cut == "fcall" else fname
        call(CallBatch(beat=True), "w-idle", hb)  # (prev names this worker's last op)
        for n in range(20 + calls):
            if n == 20:
                r.config_resetstat()
            op = uuid.uuid4().hex
            keys = keys_of(op, "w-idle", CallBatch(beat=True))
            follow("w-idle", op, r.fcall(called, len(keys), *keys,
                                         *argv(CallBatch(beat=True), "w-idle", hb)))
        ev = r.info("commandstats")["cmdstat_fcall"]
        best[cut] = min(best.get(cut, 1e9), ev["usec"] / ev["calls"])
print(json.dumps(best))
"""


def cuts(root: Path, args: argparse.Namespace) -> dict[str, float]:
    """µs per FCALL of each variant of this tree's empty call (CUTS), minimum of the rounds."""
    with h.Redis(root) as server:
        env = dict(os.environ, PYTHONPATH=str(h.REPO_ROOT))
        pid = server.proc.pid  # type: ignore[union-attr]
        out = subprocess.run([h.PYTHON, "-c", CUTS, str(server.port), str(args.calls),
                              str(args.entries), str(args.hosts), str(args.leased), "0",
                              str(pid), str(args.rounds)],
                             env=env, cwd=root, check=True, capture_output=True,
                             text=True).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions_once(tree: Path, root: Path, args: argparse.Namespace) -> dict[str, float]:
    """The empty call's instructions: the same child against a redis-server under callgrind,
    its counters zeroed just before the calls and read just after; the server's idle Ir per
    second (measured over 3 s just after, the crawl still there) times the calls' span is
    taken off, and reported."""
    with h.CallgrindRedis(root) as server:
        env = dict(os.environ, PYTHONPATH=str(tree))
        child = subprocess.Popen(
            [h.PYTHON, "-c", CHILD, str(server.port), str(args.calls), str(args.entries),
             str(args.hosts), str(args.leased), "0", str(server.pid), "1"],
            env=env, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        got: dict[str, float] = {}
        t0 = 0.0
        for line in child.stdout:
            if line.strip() == "zero":
                server.zero()
                t0 = time.monotonic()
            elif line.strip() == "dump":
                span = time.monotonic() - t0
                ir = server.count()
                idle = server.idle_rate()
                got = {"ir_raw": ir / args.calls, "idle_ir_per_s": idle,
                       "ir": (ir - idle * span) / args.calls, "span_s": span}
            else:
                got.update(json.loads(line))
                continue
            child.stdin.write("\n")
            child.stdin.flush()
        if child.wait() != 0 or "ir" not in got:
            raise RuntimeError(f"child of {tree} failed ({child.returncode})")
        return got


def fixed_once(tree: Path, root: Path, args: argparse.Namespace,
               evalsha: bool = False) -> dict[str, float]:
    with h.Redis(root) as server:
        env = dict(os.environ, PYTHONPATH=str(tree))
        pid = server.proc.pid  # type: ignore[union-attr]
        out = subprocess.run([h.PYTHON, "-c", CHILD, str(server.port), str(args.calls),
                              str(args.entries), str(args.hosts), str(args.leased),
                              str(int(evalsha)), str(pid)],
                             env=env, cwd=root, check=True, capture_output=True,
                             text=True).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions(trees: dict[str, Path], args: argparse.Namespace,
                 figures: dict[str, Any]) -> None:
    """--instructions: per tree, the empty call's instructions (Ir) under callgrind, rounds
    alternating the trees; their ratio to this tree's; the machine's ns per instruction
    (each tree's redis-server CPU per call of the rounds above over its Ir per call),
    which converts the Ir into this machine's µs."""
    got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with h.workdir("fleet-fixed-ir-") as root:
        for k in range(args.instructions):
            for name, tree in trees.items():
                got[name].append(instructions_once(tree, root / f"{name}-{k}", args))
    out: dict[str, Any] = {}
    for name, runs in got.items():
        ir = [x["ir"] for x in runs]
        timed = figures["fixed"][name]
        out[name] = {"ir_per_call": round(h.median(ir)),
                     "ir_spread": round((max(ir) - min(ir)) / h.median(ir), 4),
                     "ir_raw_per_call": round(h.median([x["ir_raw"] for x in runs])),
                     "idle_ir_per_s": round(h.median([x["idle_ir_per_s"] for x in runs])),
                     "ns_per_ir_cpu": round(timed["cpu_us_min"] * 1000 / h.median(ir), 3),
                     "ns_per_ir_usec": round(timed["usec_min"] * 1000 / h.median(ir), 3)}
    this = out["this"]
    for name, row in out.items():
        row["ratio_this_over"] = round(this["ir_per_call"] / row["ir_per_call"], 4)
        print(f"instructions per empty call, {name}: {row['ir_per_call']} Ir (spread "
              f"{row['ir_spread']:.2%} over {args.instructions} rounds; raw "
              f"{row['ir_raw_per_call']}, idle {row['idle_ir_per_s']} Ir/s taken off); "
              f"this over it x{row['ratio_this_over']}; ns/Ir of the timed rounds: "
              f"{row['ns_per_ir_cpu']} (CPU), {row['ns_per_ir_usec']} (usec)", flush=True)
    ns = h.median([row["ns_per_ir_usec"] for row in out.values()])
    figures["instructions"] = out
    figures["instructions_us_at_median_ns_per_ir"] = {
        name: round(row["ir_per_call"] * ns / 1000, 1) for name, row in out.items()}
    print(f"at {ns} ns/Ir (median over the trees, usec): "
          f"{figures['instructions_us_at_median_ns_per_ir']} µs per empty call", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument("--leased", type=int, default=20)
    p.add_argument("--replay", type=Path, default=None, help="recorded calls (bench_replay)")
    p.add_argument("--evalsha", action="store_true",
                   help="also this tree's call by EVALSHA of its whole source")
    p.add_argument("--cuts", action="store_true",
                   help="where this tree's empty call spends its time (cut variants), only")
    p.add_argument("--also", type=Path, action="append", default=[],
                   help="one more baseline tree (named by its directory), repeatable")
    p.add_argument("--instructions", type=int, default=0, metavar="ROUNDS",
                   help="also that many rounds per tree with the redis-server under callgrind:"
                        " its instructions per empty call")
    args = p.parse_args()
    if args.cuts:
        with h.workdir("fleet-cuts-") as root:
            got = cuts(root, args)
        base = got["full"]
        for name, usec in got.items():
            extra = (f"  ({(usec - base) / 20:+.2f} µs per command)" if name.startswith("+")
                     else "")
            print(f"{name:24s} {usec:8.1f} µs{extra}", flush=True)
        h.emit_json({"machine": h.machine(), "cuts": got})
        return
    trees = {"this": h.REPO_ROOT, "base": args.baseline.resolve(),
             **{path.resolve().name: path.resolve() for path in args.also}}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    if args.evalsha:
        rows["evalsha"] = []
    with h.workdir("fleet-fixed-") as root:
        for k in range(args.rounds):
            for name, tree in trees.items():
                rows[name].append(fixed_once(tree, root / f"{name}-{k}", args))
            if args.evalsha:
                rows["evalsha"].append(fixed_once(h.REPO_ROOT, root / f"evalsha-{k}", args,
                                                  True))
    figures: dict[str, Any] = {"machine": h.machine(), "fixed": {}}
    for name, got in rows.items():
        usec = [x["usec"] for x in got]
        fast = [x["fast_half_us"] for x in got]
        figures["fixed"][name] = {"usec_min": round(min(usec), 1),
                                  "usec_median": round(h.median(usec), 1),
                                  "fast_half_us_median": round(h.median(fast), 2),
                                  "cpu_us_min": round(min(x["cpu_us"] for x in got), 1),
                                  "commands_per_call": round(got[0]["commands"], 1)}
    this, base = figures["fixed"]["this"], figures["fixed"]["base"]
    ratio = round(this["usec_min"] / base["usec_min"], 3)
    figures["fixed_ratio"] = ratio
    figures["fixed_cpu_ratio"] = round(this["cpu_us_min"] / base["cpu_us_min"], 3)
    figures["fixed_fast_half_ratio"] = round(this["fast_half_us_median"]
                                             / base["fast_half_us_median"], 3)
    print(f"empty call: this {this['usec_min']} µs (median {this['usec_median']}, "
          f"{this['commands_per_call']} commands), base {base['usec_min']} µs (median "
          f"{base['usec_median']}, {base['commands_per_call']} commands): x{ratio}; "
          f"redis-server CPU per call: this {this['cpu_us_min']} µs, base "
          f"{base['cpu_us_min']} µs: x{figures['fixed_cpu_ratio']}; each call's own time, "
          f"mean of the faster half (SLOWLOG), median of the rounds: this "
          f"{this['fast_half_us_median']} µs, base {base['fast_half_us_median']} µs: "
          f"x{figures['fixed_fast_half_ratio']}", flush=True)
    if args.evalsha:
        ev = figures["fixed"]["evalsha"]
        print(f"this tree's call by EVALSHA of its source: {ev['usec_min']} µs (median "
              f"{ev['usec_median']}, CPU {ev['cpu_us_min']}): "
              f"x{round(this['usec_min'] / ev['usec_min'], 3)} for the library's FCALL "
              f"(CPU x{round(this['cpu_us_min'] / ev['cpu_us_min'], 3)})", flush=True)
    if args.instructions:
        instructions(trees, args, figures)
    if args.replay:
        import bench_replay as br

        rep = br.compare(args.replay, trees, args.rounds, skip=50)
        figures["replay"] = rep
        print(f"replayed worker calls: this {rep['this']} µs/call, base {rep['base']} µs/call:"
              f" x{rep['ratio']}; redis-server CPU per call: this {rep['cpu_this']} µs, base "
              f"{rep['cpu_base']} µs: x{rep['cpu_ratio']}", flush=True)
    h.emit_json(figures)


if __name__ == "__main__":
    main()
