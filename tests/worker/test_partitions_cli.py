"""The commands on a partitioned crawl (FLEET_PARTITIONS > 1, issue 21) where the P = 1 commands
say more: a crawl Redis does not hold (exit 4, one line), the ``failed`` line of ``status``,
``purge``'s warning about live workers.  In process (``cli.run_action``, as ``scrapy fleet``
calls it with the project's FLEET_PARTITIONS) against a real redis-server."""

from __future__ import annotations

import argparse
import json

import pytest
import redis

from scrapy_fleet.commands import cli
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys

NO_RECORD = "error: Redis has no record of crawl 'gone' (key prefix 'fleet')"


def run(redis_url: str, action: str, *args: str, crawl: str = "gone", parts: int = 4,
        fingerprint=lambda r: b"") -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="*")
    cli.add_action_arguments(parser)
    opts = parser.parse_args(list(args))
    return cli.run_action(action, FrontierAdmin(redis_url, crawl), opts.urls, opts,
                          fingerprint, label=f"crawl {crawl!r}", partitions=parts)


@pytest.mark.parametrize("action,args", [("status", []), ("status", ["--json"]),
                                         ("top", ["--once"]), ("dead", []), ("failed", []),
                                         ("retry", ["--all"])])
def test_a_crawl_redis_does_not_hold_exits_4_in_one_line(redis_url, capsys, action, args):
    assert run(redis_url, action, *args) == 4
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(NO_RECORD), err
    assert redis.Redis.from_url(redis_url).keys("*gone*") == []


def test_purge_of_a_purged_crawl_has_nothing_to_purge(redis_url, capsys):
    assert run(redis_url, "push", "http://h.test/a", "http://h.test/b") == 0
    assert run(redis_url, "purge", "--yes") == 0
    capsys.readouterr()
    assert run(redis_url, "purge", "--yes") == 0
    assert capsys.readouterr().out == "nothing to purge for crawl 'gone'\n"
    assert run(redis_url, "status") == 4
    assert capsys.readouterr().err.startswith(NO_RECORD)


def test_status_shows_the_failed_line_and_purge_warns_of_live_workers(redis_url, capsys):
    assert run(redis_url, "push", "http://h.test/a", crawl="kept") == 0
    client = redis.Redis.from_url(redis_url)
    parts = CrawlKeys("fleet", "kept").all_partitions(4)
    client.hset(parts[0].failed_by, "http/500", 2)
    client.hset(parts[2].failed_by, "http/500", 1)
    capsys.readouterr()
    assert run(redis_url, "status", crawl="kept") == 0
    assert "  failed   3 (http/500 3)\n" in capsys.readouterr().out
    # a worker's heartbeat in one partition (its home), as its calls write it
    now_ms = int(client.time()[0]) * 1000
    client.zadd(parts[3].workers, {"w7": now_ms})
    assert run(redis_url, "purge", "--yes", crawl="kept") == 0
    out, err = capsys.readouterr()
    assert "warning: 1 worker(s) called this crawl in the last 60 s (w7)" in err, err
    assert "purged" in out
    assert client.keys("*kept*") == []


def test_purge_works_whatever_the_callers_partitions_the_others_refuse(redis_url, capsys):
    """The P-mismatch line says to purge: purge takes the crawl's own P (and says so), every
    other command refuses the wrong P in that one line, which is then not circular."""
    client = redis.Redis.from_url(redis_url)
    assert run(redis_url, "push", "http://a.test/1", "http://b.test/1", crawl="four") == 0
    assert run(redis_url, "push", "http://a.test/1", crawl="one", parts=1) == 0
    capsys.readouterr()
    mismatch = ("error: FLEET_PARTITIONS=2 does not match crawl 'four', created with "
                "FLEET_PARTITIONS=4: set it to that value, or purge the crawl to start it "
                "again\n")
    assert run(redis_url, "status", crawl="four", parts=2) == 2
    assert capsys.readouterr().err == mismatch
    assert run(redis_url, "purge", "--yes", crawl="four", parts=2) == 0
    out, err = capsys.readouterr()
    assert out.startswith("crawl 'four' was created with FLEET_PARTITIONS=4 "
                          "(FLEET_PARTITIONS=2 here): purging its 4 partitions\n"), out
    assert "(4 partitions)" in out and err == ""
    assert client.keys("*four*") == []
    # a P = 1 crawl, purged from a project with FLEET_PARTITIONS = 4
    assert run(redis_url, "purge", "--yes", crawl="one", parts=4) == 0
    out = capsys.readouterr().out
    assert out.startswith("crawl 'one' was created with FLEET_PARTITIONS=1 "
                          "(FLEET_PARTITIONS=4 here): purging its 1 partition\n"), out
    assert client.keys("*one*") == []


def test_status_hosts_lists_the_hosts_of_every_partition(redis_url, capsys):
    """status --hosts on a partitioned crawl: each host's politeness row, whatever partition
    holds it (before: the P > 1 status ignored --hosts)."""
    from scrapy_fleet.keys.partition import partition_of

    hosts = {f"h{i}.test": i + 1 for i in range(6)}
    assert len({partition_of(h, 4) for h in hosts}) > 1
    urls = [f"http://{h}/{j}" for h, n in hosts.items() for j in range(n)]
    assert run(redis_url, "push", *urls, crawl="hosts",
               fingerprint=lambda r: r.url.encode()) == 0
    capsys.readouterr()
    assert run(redis_url, "status", "--hosts", "--json", crawl="hosts") == 0
    status = json.loads(capsys.readouterr().out)
    assert [(r["host"], r["queued"], r["leased"], r["failures"]) for r in status["hosts"]] == [
        (h, n, 0, 0) for h, n in sorted(hosts.items(), key=lambda kv: -kv[1])]
    assert "host_policy" in status
    assert run(redis_url, "status", "--hosts", crawl="hosts") == 0
    out = capsys.readouterr().out
    assert "  per host (fleet-wide): not known yet (no worker has started)\n" in out
    for h, n in hosts.items():
        assert f"           {h:<32} {n:>8} " in out


def test_the_skew_of_a_crawl_with_nothing_queued_is_a_dash(redis_url, capsys):
    client = redis.Redis.from_url(redis_url)
    client.hset(CrawlKeys("fleet", "empty").all_partitions(4)[1].stats, "pages", 3)
    assert run(redis_url, "status", crawl="empty") == 0
    out = capsys.readouterr().out
    assert "  skew: - (nothing queued)\n" in out and "0.0x" not in out
