"""Redis memory per tracked URL of the recrawl schedule, and the Redis time of a revisit
against a first visit (issue 22's goals: <= 200 B per tracked URL with a 50-byte URL, its
request and validators, measured for 1,000,000 tracked URLs; a revisit's per-page Redis time
no more than a first visit's).

A fresh ``redis-server`` (no persistence).  Phase 1, first visits: ``--urls`` distinct
50-byte URLs over ``--hosts`` hosts are pushed (through the Bloom filter), leased and
acknowledged, each acknowledgement carrying its revisit record (a realistic state: an ETag
of 20 bytes, a Last-Modified, a signature, 3 observations; intervals spread over 1 h .. 30 d,
or ``--due`` seconds for all), with the frontier call of the workers
(``FrontierAdmin.call``), in batches of ``--batch``.  Reported: ``used_memory`` after minus
before, less the Bloom filter's keys (``MEMORY USAGE``), per tracked URL; and the schedule's
keys alone (``MEMORY USAGE`` of each slot and the index) per URL.
Phase 2 (``--revisit``): first, the baseline: as many URLs of another crawl pushed, leased
and acknowledged without a revisit record (a crawl without recrawl); then every slot made due,
each URL's revisit leased and acknowledged with a new record.  Redis time is ``INFO
commandstats``' usec of the scripts (``fcall``, ``fcall_ro``, ``evalsha``, ``eval``: the
frontier call is an FCALL of the Functions library since session 12, an EVALSHA before), per
page, for each phase, and the commands the scripts ran per page (``*_commands_per_page``:
INFO commandstats counts the commands a script calls; unlike the usec, not moved by the
machine's load).

``--lastmod`` (sitemap <lastmod>, docs/recrawl.md): the pushes carry a lastmod, as a
SitemapSpider's do, so the crawl indexes every record (``rvx:*``, reported apart:
``place_index_per_url``); phase 3 pushes ``--lastmod-due`` known URLs again with a newer
lastmod (each made due at once) and as many with an older one, in batches of ``--batch``:
script usec per such push.  The acknowledgements carry each record's Bloom key and fetch time
as the workers send them.

Usage: ``.venv/bin/python bench/bench_recrawl_memory.py [--urls 1000000] [--hosts 1000]
[--revisit] [--lastmod [--lastmod-due 10000]]``
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import _harness as h
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams
from scrapy_fleet.recrawl.record import revisit_record
from scrapy_fleet.recrawl.schedule import State

try:  # the last outcome kept in the state (issue 31); absent from main before it
    from scrapy_fleet.recrawl.schedule import UNCHANGED
except ImportError:  # (running main's package beside: PYTHONPATH=<main's tree>)
    UNCHANGED = None

#: the commands a script runs by (INFO commandstats names)
SCRIPT_COMMANDS = ("cmdstat_fcall", "cmdstat_fcall_ro", "cmdstat_evalsha", "cmdstat_eval")


def url(i: int, hosts: int) -> str:
    # 50 bytes: "http://h00042.example.org/docs/page/000001234.html"
    return f"http://h{i % hosts:05d}.example.org/docs/page/{i:09d}.html"


def evalsha_usec(client: Any) -> int:
    """usec Redis spent in scripts so far (:data:`SCRIPT_COMMANDS`)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(name, {}).get("usec", 0)) for name in SCRIPT_COMMANDS)


def script_work(client: Any) -> int:
    """Commands run so far other than the scripts' own calls and INFO: those the scripts
    called (INFO commandstats counts them too) plus the bench's few direct ones; a count
    that does not move with the machine's load, beside the usec that do."""
    stats = client.info("commandstats")
    return sum(int(v.get("calls", 0)) for name, v in stats.items()
               if name not in SCRIPT_COMMANDS and name != "cmdstat_info")


def state_for(i: int, rnd: random.Random) -> State:
    """A realistic state: its last outcome an unchanged 2xx where the package keeps one."""
    last: dict[str, Any] = {} if UNCHANGED is None else {"last": UNCHANGED}
    return State(fetched=1796180000 + i % 86400, interval=86400,
                 signature=rnd.getrandbits(64) - 2**63, etag=f'"{i:08x}-63a2b7c8e9"',
                 last_modified="Wed, 02 Dec 2026 03:39:42 GMT",
                 history=[-86400, 43200, -172800], gone=0, **last)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rnd = random.Random(1)
    with h.workdir() as root, h.Redis(root) as server:
        client = server.client()
        admin = FrontierAdmin(server.url, "mem", params=FrontierParams(lease_timeout=600))
        keys = admin.keys
        admin.call(CallBatch(), worker="w")  # the crawl's marker and layout
        before = int(client.info("memory")["used_memory"])
        usec0 = evalsha_usec(client)
        work0 = script_work(client)
        t0 = time.monotonic()
        for start in range(0, args.urls, args.batch):
            n = min(args.batch, args.urls - start)
            pushes = []
            for i in range(start, start + n):
                u = url(i, args.hosts)
                pushes.append((bloom_key(u.encode()), 0, codec.encode(Request(u)), 0,
                               f"h{i % args.hosts:05d}.example.org", 0,
                               1796000000 if args.lastmod else 0))
            # (a Bloom false positive is a duplicate: lease what was pushed)
            n = admin.call(CallBatch(pushes=pushes), worker="w").pushed
            got: list[Any] = []
            empty = 0
            while len(got) < n:
                more = admin.call(CallBatch(take=min(500, n - len(got))), worker="w").leased
                empty = 0 if more else empty + 1  # (a call may meet only emptied hosts)
                if empty > 5:
                    raise RuntimeError("nothing leased")
                got.extend(more)
            acks = []
            for e in got:
                req = codec.decode_dict(e.payload)
                interval = args.due or rnd.uniform(3600, 30 * 86400)
                acks.append((e.entry_id, e.token, b"", [], 0, revisit_record(
                    e.payload, state_for(len(acks), rnd).to_meta(), interval,
                    req["url"].split("/")[2], 0, bloom_key(req["url"].encode()))))
            admin.call(CallBatch(acks=acks), worker="w")
        first_s = time.monotonic() - t0
        first_usec = evalsha_usec(client) - usec0
        first_work = script_work(client) - work0
        after = int(client.info("memory")["used_memory"])
        bloom = sum(int(client.memory_usage(k, samples=0) or 0)
                    for k in client.scan_iter(match=keys.bloom_prefix + "*"))
        bloom += int(client.memory_usage(keys.bloom_meta, samples=0) or 0)
        slots = [m.decode() for m in client.zrange(keys.revisit_index, 0, -1)]
        schedule = sum(int(client.memory_usage(keys.revisit_slot(s), samples=0) or 0)
                       for s in slots) + int(client.memory_usage(keys.revisit_index,
                                                                 samples=0) or 0)
        places = sum(int(client.memory_usage(k, samples=0) or 0)
                     for k in client.scan_iter(match=keys.revisit_place_prefix + "*",
                                               count=1000))
        places += int(client.memory_usage(keys.revisit_popped, samples=0) or 0)
        tracked = int(client.get(keys.revisit_count) or 0)
        out: dict[str, Any] = {
            "urls": args.urls, "hosts": args.hosts, "tracked": tracked, "slots": len(slots),
            "used_memory_delta_per_url": round((after - before) / tracked, 1),
            "bloom_per_url": round(bloom / tracked, 1),
            "used_memory_less_bloom_per_url": round((after - before - bloom) / tracked, 1),
            "schedule_keys_per_url": round(schedule / tracked, 1),
            "place_index_per_url": round(places / tracked, 1),
            "first_visit_script_usec_per_page": round(first_usec / args.urls, 1),
            "first_visit_commands_per_page": round(first_work / args.urls, 2),
            "first_visit_seconds": round(first_s, 1),
        }
        if args.lastmod and args.lastmod_due:
            out.update(lastmod_phase(admin, client, args, rnd))
        if args.revisit:
            (out["no_recrawl_script_usec_per_page"],
             out["no_recrawl_commands_per_page"]) = baseline(server.url, client, args)
            # every slot due now (the schedule's index is the only thing that says when)
            client.zadd(keys.revisit_index, dict.fromkeys(slots, 0))
            usec1 = evalsha_usec(client)
            work1 = script_work(client)
            done = 0
            while done < tracked:
                got = []
                while len(got) < args.batch:
                    more = admin.call(CallBatch(take=min(500, args.batch - len(got))),
                                      worker="w").leased
                    if not more:
                        break
                    got.extend(more)
                if not got:
                    break
                acks = [(e.entry_id, e.token, b"", [], 0, revisit_record(
                    e.payload, state_for(i, rnd).to_meta(), 86400,
                    codec.decode_dict(e.payload)["url"].split("/")[2], 0,
                    bloom_key(codec.decode_dict(e.payload)["url"].encode())))
                    for i, e in enumerate(got)]
                admin.call(CallBatch(acks=acks), worker="w")
                done += len(got)
            out["revisited"] = done
            out["revisit_commands_per_page"] = round(
                (script_work(client) - work1) / max(done, 1), 2)
            out["revisit_script_usec_per_page"] = round(
                (evalsha_usec(client) - usec1) / max(done, 1), 1)
        return out


def baseline(redis_url: str, client: Any, args: argparse.Namespace) -> tuple[float, float]:
    """Script usec and commands (:func:`script_work`) per page of a crawl without recrawl
    ("base"): ``--urls`` URLs pushed, leased and acknowledged with no revisit record, in
    batches of ``--batch``."""
    admin = FrontierAdmin(redis_url, "base", params=FrontierParams(lease_timeout=600))
    admin.call(CallBatch(), worker="w")  # the crawl's marker and layout, as phase 1's
    usec0 = evalsha_usec(client)
    work0 = script_work(client)
    for start in range(0, args.urls, args.batch):
        n = min(args.batch, args.urls - start)
        pushes = []
        for i in range(start, start + n):
            u = url(i, args.hosts)
            pushes.append((bloom_key(u.encode()), 0, codec.encode(Request(u)), 0,
                           f"h{i % args.hosts:05d}.example.org", 0, 0))
        n = admin.call(CallBatch(pushes=pushes), worker="w").pushed
        got: list[Any] = []
        empty = 0
        while len(got) < n:
            more = admin.call(CallBatch(take=min(500, n - len(got))), worker="w").leased
            empty = 0 if more else empty + 1
            if empty > 5:
                raise RuntimeError("nothing leased")
            got.extend(more)
        admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got]),
                   worker="w")
    return (round((evalsha_usec(client) - usec0) / args.urls, 1),
            round((script_work(client) - work0) / args.urls, 2))


def lastmod_phase(admin: FrontierAdmin, client: Any, args: argparse.Namespace,
                  rnd: random.Random) -> dict[str, Any]:
    """Known URLs pushed again with a sitemap lastmod: newer than their last fetch (made due
    at once), then older (nothing done); evalsha usec per push of each kind."""
    sample = rnd.sample(range(args.urls), min(args.lastmod_due, args.urls))
    out: dict[str, Any] = {}
    for kind, lastmod in (("older", 1796000000), ("newer", 1900000000)):
        usec0 = evalsha_usec(client)
        for start in range(0, len(sample), args.batch):
            pushes = []
            for i in sample[start:start + args.batch]:
                u = url(i, args.hosts)
                pushes.append((bloom_key(u.encode()), 0, codec.encode(Request(u)), 0,
                               f"h{i % args.hosts:05d}.example.org", 0, lastmod))
            admin.call(CallBatch(pushes=pushes), worker="w")
        out[f"lastmod_{kind}_script_usec_per_push"] = round(
            (evalsha_usec(client) - usec0) / len(sample), 1)
    stats = client.hgetall(admin.keys.stats)
    out["lastmod_due"] = int(stats.get(b"revisit_lastmod_due", 0))
    out["lastmod_older"] = int(stats.get(b"revisit_lastmod_older", 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--due", type=float, default=0.0,
                        help="every URL's interval (0: spread 1 h .. 30 d; --revisit: 1 h)")
    parser.add_argument("--revisit", action="store_true")
    parser.add_argument("--lastmod", action="store_true",
                        help="pushes carry a sitemap lastmod: every record is indexed")
    parser.add_argument("--lastmod-due", type=int, default=0,
                        help="with --lastmod: known URLs pushed again with a newer lastmod")
    args = parser.parse_args()
    if args.revisit and not args.due:
        args.due = 3600.0  # made due at once for phase 2
    figures = {"machine": h.machine(), **run(args)}
    h.emit_json(figures)


if __name__ == "__main__":
    main()
