"""``scrapy fleet url`` on a large frontier (issue 34: <= 100 ms at the 99th percentile on
1,000,000 queued URLs, without a ledger), and ``host drop`` of a large host when it exists.

Pushes --urls URLs (default 1,000,000) over --hosts hosts (default 1,000: 1,000 entries a
host) with the push command's own code (``push_lines``), leases and acknowledges --done of
them (the "done" URLs, found by the second pass over every entry of the host),
then times --lookups lookups (``frontier/where.py`` ``locate``, the action's whole read) of
random queued URLs, of never-seen URLs and of done ones, and reports each kind's p50, p99 and
max beside the baseline of one HGET round trip measured in the same run.  Also counts that
every looked-up queued URL was found queued, and per lookup its round trips and the entries it
fingerprinted (``url_bloom_key`` calls: figures the machine's load does not move).

    .venv/bin/python bench/bench_lookup.py              # ~3-5 min on 2 loaded cores
    .venv/bin/python bench/bench_lookup.py --urls 200000 --hosts 200
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import _harness as h
import redis


class CountingRedis(redis.Redis):
    """A client that counts its round trips (a command, or a pipeline's execute): a figure of
    the lookup's cost that the machine's load does not move."""

    trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.trips += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(*args: Any, **kw: Any) -> Any:
            CountingRedis.trips += 1
            return execute(*args, **kw)
        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


def url(i: int, hosts: int) -> str:
    return f"http://h{i % hosts}.example.org/section/{i // hosts}/page-{i}.html?id={i}"


def percentiles(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {"p50": round(statistics.median(ms), 2),
            "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max": round(ms[-1], 2), "n": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--done", type=int, default=200)
    args = parser.parse_args()

    from scrapy_fleet.commands.push import default_fingerprinter, push_lines
    from scrapy_fleet.frontier import where
    from scrapy_fleet.frontier.admin import FrontierAdmin
    from scrapy_fleet.frontier.protocol import CallBatch
    from scrapy_fleet.frontier.where import locate

    keyed = where.url_bloom_key
    fingerprints = [0]  # URLs canonicalized and hashed by the lookups (a figure load does not move)

    def counted(u: str) -> bytes:
        fingerprints[0] += 1
        return keyed(u)
    where.url_bloom_key = counted  # type: ignore[assignment]

    fp = default_fingerprinter()
    figures: dict[str, Any] = {"machine": h.machine(), "urls": args.urls, "hosts": args.hosts}
    with h.workdir() as root, h.Redis(root) as server:
        client = CountingRedis.from_url(server.url)
        admin = FrontierAdmin(server.url, "look")
        t0 = time.perf_counter()
        report = push_lines(admin, ((i + 1, url(i, args.hosts)) for i in range(args.urls)), fp)
        figures["push_s"] = round(time.perf_counter() - t0, 1)
        # (a URL the filter takes for seen, a false positive, is a duplicate: not queued)
        assert report.pushed + report.duplicates == args.urls, report
        figures["false_positive_duplicates"] = report.duplicates
        done: list[str] = []
        while len(done) < args.done:
            leased = admin.call(CallBatch(take=min(100, args.done - len(done))), worker="w").leased
            admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in leased]), worker="w")
            from scrapy_fleet import codec

            done += [codec.decode_dict(e.payload)["url"] for e in leased]
        done_set = set(done)
        figures["used_memory_mb"] = round(client.info("memory")["used_memory"] / 2**20, 1)

        def timed(urls: list[str], want: str) -> dict[str, float]:
            ms, wrong = [], 0
            trips, fps = CountingRedis.trips, fingerprints[0]
            for u in urls:
                host = u.split("/")[2]
                t = time.perf_counter()
                row = locate(client, admin.keys, u, host, fp)
                ms.append((time.perf_counter() - t) * 1000)
                wrong += row["state"] != want
            return {**percentiles(ms), "wrong_state": wrong,
                    "round_trips": round((CountingRedis.trips - trips) / len(urls), 1),
                    "fingerprints": round((fingerprints[0] - fps) / len(urls), 1)}

        rng = random.Random(7)
        picks = [url(i, args.hosts) for i in rng.sample(range(args.urls), args.lookups * 2)]
        queued = [u for u in picks if u not in done_set][:args.lookups]
        never = [f"http://h{rng.randrange(args.hosts)}.example.org/none/{i}"
                 for i in range(args.lookups // 5)]
        rtt = []
        for _ in range(1000):
            t = time.perf_counter()
            client.hget(admin.keys.queue_index, "h1.example.org")
            rtt.append((time.perf_counter() - t) * 1000)
        figures["baseline_hget_ms"] = percentiles(rtt)
        figures["queued"] = timed(queued, "queued")
        figures["never_seen"] = timed(never, "never_seen")
        figures["done"] = timed(done[:args.lookups // 5], "done")
        base = figures["baseline_hget_ms"]["p50"] or 0.001
        for kind in ("queued", "never_seen", "done"):
            f = figures[kind]
            print(f"{kind:<11} p50 {f['p50']:7.2f} ms  p99 {f['p99']:7.2f} ms  max "
                  f"{f['max']:7.2f} ms  ({f['n']} lookups, {f['wrong_state']} in another "
                  f"state; p99 = {f['p99'] / base:.0f} x one HGET round trip; "
                  f"{f['round_trips']} round trips, {f['fingerprints']} entries "
                  "fingerprinted a lookup)")
        print(f"push of {args.urls} URLs over {args.hosts} hosts: {figures['push_s']} s; "
              f"Redis used {figures['used_memory_mb']} MB")
    h.emit_json(figures)


if __name__ == "__main__":
    main()
