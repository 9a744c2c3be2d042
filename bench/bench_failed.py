"""What recording a failed request costs: an acknowledgement that carries a failure record
(lua/failed.lua) vs a plain acknowledgement, in the same frontier call shape, one run.

Each round pushes ``--entries`` entries, leases them 16 at a time and acknowledges each batch
in one ``frontier.lua`` call, either plainly (baseline) or with a failure record per entry;
rounds alternate (plain, failed / failed, plain ...).  Figures: the median time per
acknowledgement of each kind and their ratio (failed / plain), and the Redis memory per kept
failed record (``used_memory`` after the failed round minus after the plain round, divided
by the entries; ``FLEET_FAILED_MAX`` above the entries, so none is trimmed).

Usage: ``.venv/bin/python bench/bench_failed.py [--rounds 4] [--entries 2000]``
"""

from __future__ import annotations

import argparse
import time

import _harness as h

from scrapy_fleet import codec
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams

BATCH = 16


def one_round(url: str, crawl: str, entries: int, failed: bool) -> tuple[float, int]:
    """Seconds per acknowledgement, and Redis's used_memory after the round (bytes)."""
    admin = FrontierAdmin(url, crawl, params=FrontierParams(failed_max=entries + 1))
    admin.client.flushall()
    pushes = []
    for i in range(entries):
        u = f"https://docs.example.org/3/library/page-{i}.html"
        pushes.append((b"", 0, codec.encode_dict({"url": u}), 0, "docs.example.org"))
    for start in range(0, entries, 500):
        admin.push(pushes[start:start + 500])
    spent = 0.0
    done = 0
    while done < entries:
        leased = admin.call(CallBatch(take=BATCH), worker="bench").leased
        acks = []
        for e in leased:
            if failed:
                u = codec.decode_dict(e.payload)["url"]
                record = FailureRecord(url=u, method="GET", reason="http/500",
                                       message="HTTP status 500 not handled", status=500,
                                       attempts=3, worker="bench:1", host="docs.example.org")
                acks.append((e.entry_id, e.token, record.encode()))
            else:
                acks.append((e.entry_id, e.token))
        started = time.perf_counter()
        admin.call(CallBatch(acks=acks), worker="bench")
        spent += time.perf_counter() - started
        done += len(leased)
    after = int(admin.client.info("memory")["used_memory"])
    admin.close()
    return spent / entries, after


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--entries", type=int, default=2000)
    opts = parser.parse_args()
    plain: list[float] = []
    failed: list[float] = []
    memory: dict[bool, list[float]] = {False: [], True: []}
    with h.workdir() as root, h.Redis(root) as redis:
        for r in range(opts.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for kind in order:
                per_ack, mem = one_round(redis.url, "bench", opts.entries, kind)
                (failed if kind else plain).append(per_ack * 1e6)
                memory[kind].append(mem)
    ratio = h.median(failed) / h.median(plain)
    per_record = (h.median(memory[True]) - h.median(memory[False])) / opts.entries
    print(f"plain ack:  {h.median(plain):.1f} us per acknowledgement {h.fmt_list(plain)}")
    print(f"failed ack: {h.median(failed):.1f} us per acknowledgement {h.fmt_list(failed)}")
    print(f"ratio failed / plain: {ratio:.2f}; Redis memory per failed record: "
          f"{per_record:.0f} bytes (used_memory after failed acks - after plain acks)")
    h.emit_json({"plain_us_per_ack": round(h.median(plain), 1),
                 "failed_us_per_ack": round(h.median(failed), 1),
                 "ratio": round(ratio, 2), "bytes_per_record": round(per_record),
                 "entries": opts.entries, "rounds": opts.rounds, **h.machine()})


if __name__ == "__main__":
    main()
