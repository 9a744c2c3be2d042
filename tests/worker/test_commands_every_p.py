"""The crawl commands run one path for every P (commands/partitioned.py, issue 33): the same
cases at P = 1 and P = 3, in process (``cli.run_action``, as ``scrapy fleet`` calls it with
the project's FLEET_PARTITIONS) against a real redis-server; what P > 1 adds is the
``(3 partitions)`` suffix and ``<p>:<id>`` ids."""

from __future__ import annotations

import argparse
from dataclasses import asdict

import msgpack
import pytest
import redis
from scrapy import Request
from support import hosts_in_partition

from scrapy_fleet import codec
from scrapy_fleet.commands import cli
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of

EVERY_P = [1, 3]


def run(redis_url: str, action: str, *args: str, crawl: str, parts: int,
        wait_replicas: int = 0) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="*")
    cli.add_action_arguments(parser)
    opts = parser.parse_args(list(args))
    admin = FrontierAdmin(redis_url, crawl, wait_replicas=wait_replicas)
    try:
        return cli.run_action(action, admin, opts.urls, opts, lambda r: r.url.encode(),
                              label=f"crawl {crawl!r}", partitions=parts)
    finally:
        admin.close()


def suffix(parts: int) -> str:
    return f" ({parts} partitions)" if parts > 1 else ""


@pytest.mark.parametrize("parts", EVERY_P)
def test_a_push_not_acknowledged_by_the_replicas_asked_for_warns_at_every_p(
        redis_url, capsys, parts):
    """``push --wait-replicas 1`` on a server without replicas: every call the push made (one
    per partition its lines went to) is counted in the warning.  At P > 1 the lean push
    ignored --wait-replicas: no WAIT, no warning, a push a failover could lose unsaid."""
    hosts = [h for p in range(parts) for h in hosts_in_partition(p, parts)[:1]]
    urls = [f"http://{h}/page" for h in hosts]
    assert run(redis_url, "push", *urls, crawl="waits", parts=parts, wait_replicas=1) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"pushed {len(urls)}, duplicates 0, rejected 0 (crawl 'waits')"
    assert f"warning: {parts} push call(s) were not acknowledged by 1 replica(s)" in err, err
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "waits")
    pushed = [int(client.hget(k.stats, "pushed") or 0) for k in keys.all_partitions(parts)]
    assert pushed == [1] * parts


def _record(client: redis.Redis, keys: CrawlKeys, parts: int, rid: str, url: str, host: str,
            at_ms: int, parent: str = "") -> str:
    """A failed request *rid* of *host* as lua/failed.lua keeps it (with its time and
    request), in its partition; its id as shown."""
    p = partition_of(host, parts)
    k = keys.partition(p, parts)
    rec = FailureRecord(url=url, method="GET", reason="http/500", status=500, attempts=3,
                        worker="w1", host=host, parent=parent, at=at_ms,
                        data=codec.encode(Request(url)))
    client.hset(k.failed, rid, msgpack.packb(asdict(rec), use_bin_type=False))
    client.zadd(k.failed_at, {rid: at_ms})
    return f"{p}:{rid}" if parts > 1 else rid


@pytest.mark.parametrize("parts", EVERY_P)
def test_failed_lists_every_partitions_records_oldest_first_with_time_and_parent(
        redis_url, capsys, parts):
    """``failed`` shows each record's time and the page that found it at every P (P > 1 left
    both out), the records of every partition merged oldest first."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "fails")
    for k in keys.all_partitions(parts):  # (the crawl exists)
        client.hset(k.stats, "pages", 1)
    hosts = [h for p in range(parts) for h in hosts_in_partition(p, parts)[:1]]
    t0 = 1_796_000_000_000
    ids = [_record(client, keys, parts, f"r{i}", f"http://{h}/x", h, t0 + 1000 * i,
                   "http://start.test/")
           for i, h in enumerate(reversed(hosts))]
    assert run(redis_url, "failed", crawl="fails", parts=parts) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ids
    assert all(" at 2026-" in line and line.endswith("found by http://start.test/")
               for line in lines[:-1]), lines
    assert lines[-1] == f"{len(ids)} of {len(ids)} failed request(s) shown{suffix(parts)}"


@pytest.mark.parametrize("parts", EVERY_P)
def test_retry_then_purge_read_and_delete_every_partition(redis_url, capsys, parts):
    """``retry --all`` puts each partition's records back, counted once; ``purge --yes``
    names the keys it deletes and leaves nothing of the crawl."""
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("fleet", "again")
    hosts = [h for p in range(parts) for h in hosts_in_partition(p, parts)[:1]]
    assert run(redis_url, "push", *[f"http://{h}/a" for h in hosts], crawl="again",
               parts=parts) == 0
    for i, h in enumerate(hosts):
        _record(client, keys, parts, f"r{i}", f"http://{h}/failed", h, 1_796_000_000_000 + i)
    capsys.readouterr()
    assert run(redis_url, "retry", "--all", crawl="again", parts=parts) == 0
    crawl = "crawl 'again'" + (f", {parts} partitions" if parts > 1 else "")
    assert capsys.readouterr().out == f"retried {len(hosts)} failed request(s) ({crawl})\n"
    queued = [int(client.get(k.queue_count) or 0) for k in keys.all_partitions(parts)]
    assert queued == [2] * parts
    assert run(redis_url, "purge", "--yes", crawl="again", parts=parts) == 0
    out = capsys.readouterr().out
    assert out.startswith("purged ") and out.endswith(f"keys of crawl 'again'{suffix(parts)}\n")
    assert client.keys("*again*") == []
