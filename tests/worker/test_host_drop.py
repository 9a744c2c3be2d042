"""``scrapy fleet host drop CRAWL HOST [--dead-letter] [--yes]`` (commands/host.py,
lua/host_drop.lua) against a real redis-server, at P = 1 and P = 2: the host's queue goes in
bounded slices, other hosts keep theirs, the counts stay exact, and a worker leasing from the
host at the same time loses nothing and gets nothing twice."""

from __future__ import annotations

import json
import threading

import msgpack
import pytest
import redis
from test_lookup import FP, Crawl, run

from scrapy_fleet import codec
from scrapy_fleet.commands import cli
from scrapy_fleet.commands import host as host_command
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch


def fill(c: Crawl, host: str, n: int) -> list[str]:
    urls = [f"http://{host}/{i}" for i in range(n)]
    admin = c.admin(host)
    for start in range(0, n, 1000):
        pushed = admin.push([(bloom_key(FP(_req(u))), i % 2, codec.encode_dict({"url": u}), 0,
                              host) for i, u in enumerate(urls[start:start + 1000])])
        assert sum(pushed.push_flags) == len(urls[start:start + 1000])
    return urls


def _req(url: str):
    from scrapy import Request

    return Request(url)


def counts(redis_url: str, crawl: str, parts: int, capsys) -> tuple[dict, dict]:
    status, out, err = run(redis_url, "hosts", crawl, "--json", "--limit", "100", parts=parts,
                           capsys=capsys)
    assert status == 0, err
    hosts = json.loads(out)
    status, out, err = run(redis_url, "status", crawl, "--json", parts=parts, capsys=capsys)
    assert status == 0, err
    snap = json.loads(out)
    return {r["host"]: r for r in hosts["hosts"]}, snap


def stats(client: redis.Redis, c: Crawl, name: str) -> int:
    keys = [c.base.partition(p, c.parts) for p in range(c.parts)] if c.parts > 1 else [c.base]
    return sum(int(client.hget(k.stats, name) or 0) for k in keys)


@pytest.mark.parametrize("parts", [1, 2])
def test_drop_empties_one_host_in_slices_and_keeps_every_count_exact(redis_url, capsys, parts):
    crawl = f"drop{parts}"
    c = Crawl(redis_url, crawl, parts)
    client = redis.Redis.from_url(redis_url)
    assert run(redis_url, "push", crawl, "http://seed.test/", parts=parts)[0] == 0
    fill(c, "big.test", 4500)
    kept = fill(c, "small.test", 300)
    leased = c.admin("big.test").call(CallBatch(take=10), worker="w1").leased
    assert len(leased) == 10
    slices: list[int] = []
    total = host_command.drop(client, c.keys("big.test"), "big.test", False,
                              lambda removed, left, s: slices.append(removed))
    # two priority buckets of 2250 entries, 10 leased from the best one: a slice is at most
    # SLICE entries of one bucket
    assert total == sum(slices) == 4490 and max(slices) == host_command.SLICE
    assert len(slices) == 4
    rows, snap = counts(redis_url, crawl, parts, capsys)
    assert (rows["big.test"]["queued"], rows["big.test"]["leased"]) == (0, 10)
    assert rows["small.test"]["queued"] == 300
    fr, req = snap["frontier"], snap["counters"]["requests"]
    assert fr["due"] == sum(r["queued"] for r in rows.values()) == 301
    assert req["dropped"] == stats(client, c, "dropped") == 4490
    assert req["pushed"] == req["acked"] + req["dead_lettered"] + req["dropped"] \
        + fr["due"] + fr["leased"] + fr["deferred"]
    bk = c.keys("big.test")
    assert int(client.hget(bk.hostq, "big.test")) == 10  # its leases, still in the frontier
    assert client.hget(bk.queue_index, "big.test") is None
    assert client.zscore(bk.ready, "big.test") is None
    sk = c.keys("small.test")
    left = [codec.decode_dict(e.split(b"\t", 1)[1])["url"]
            for k in client.hget(sk.queue_index, "small.test").split()
            for e in client.lrange(f"{sk.bucket_prefix}small.test\t{k.decode()}", 0, -1)]
    assert sorted(left) == sorted(kept)
    # the leases end as usual: the host leaves the frontier
    c.admin("big.test").call(CallBatch(acks=[(e.entry_id, e.token) for e in leased]),
                             worker="w1")
    assert client.hget(bk.hostq, "big.test") is None
    # the command: an unknown host, then a second drop that finds nothing queued
    status, out, err = run(redis_url, "host", crawl, "drop", "nope.test", "--yes", parts=parts,
                           capsys=capsys)
    assert (status, out) == (1, "")
    assert err == f"error: crawl '{crawl}' has no host 'nope.test' (see `hosts CRAWL`)\n"
    status, out, err = run(redis_url, "host", crawl, "drop", "small.test", "--yes",
                           parts=parts, capsys=capsys)
    assert status == 0 and out.startswith("dropped 300 queued entries of host 'small.test'")
    assert counts(redis_url, crawl, parts, capsys)[1]["frontier"]["due"] == 1


@pytest.mark.parametrize("parts", [1, 2])
def test_drop_into_the_dead_letters_while_a_worker_leases_loses_nothing(redis_url, capsys,
                                                                       parts):
    crawl = f"dropdead{parts}"
    c = Crawl(redis_url, crawl, parts)
    client = redis.Redis.from_url(redis_url)
    assert run(redis_url, "push", crawl, "http://seed.test/", parts=parts)[0] == 0
    urls = fill(c, "busy.test", 6000)
    admin = c.admin("busy.test")
    acked: list[str] = []
    started, stop = threading.Event(), threading.Event()

    def worker() -> None:  # leases and acknowledges from the host until it has nothing
        while not stop.is_set():
            got = admin.call(CallBatch(take=50), worker="w9").leased
            started.set()
            mine = [e for e in got if codec.decode_dict(e.payload)["url"].startswith(
                "http://busy.test/")]
            acked.extend(codec.decode_dict(e.payload)["url"] for e in mine)
            admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in got]), worker="w9")
            if not got:
                return

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(60)
    status, out, err = run(redis_url, "host", crawl, "drop", "busy.test", "--dead-letter",
                           "--yes", parts=parts, capsys=capsys)
    stop.set()
    thread.join(60)
    assert status == 0, err
    bk = c.keys("busy.test")
    dead = {codec.decode_dict(msg[b"data"])["url"]: msg[b"reason"]
            for msg in (msgpack.unpackb(v, raw=True) for v in client.hvals(bk.dead))}
    assert set(dead.values()) == {b"dropped"}
    assert len(acked) == len(set(acked)) > 0
    assert not set(acked) & set(dead)  # none both fetched and dropped
    assert set(acked) | set(dead) == set(urls)  # none lost
    assert out.startswith(f"dropped {len(dead)} queued entries of host 'busy.test' into the "
                          "dead letters")
    rows, snap = counts(redis_url, crawl, parts, capsys)
    assert "busy.test" not in rows
    assert snap["frontier"]["dead"] == len(dead)
    # a dropped URL: dead, reason dropped
    gone = sorted(dead)[0]
    status, out, _ = run(redis_url, "url", crawl, gone, "--json", parts=parts, capsys=capsys)
    assert (json.loads(out)["state"], json.loads(out)["reason"]) == ("dead", "dropped")
    # the dropped host's dead letters are listed, page by page (it has nothing queued any more)
    listed: list[str] = []
    cursor = "0"
    for _ in range(100):
        status, out, err = run(redis_url, "urls", crawl, "--host", "busy.test", "--state", "dead",
                               "--limit", "1000", "--cursor", cursor, "--json", parts=parts,
                               capsys=capsys)
        assert status == 0, err
        listed += [r["url"] for r in json.loads(out)["urls"]]
        cursor = json.loads(out)["next"]
        if cursor == "0":
            break
    assert sorted(listed) == sorted(dead)


def test_bad_input_is_one_line(redis_url, capsys):
    Crawl(redis_url, "dropbad", 1).push("http://a.test/")
    for args, code, line in ((["drop"], 2, "error: host drop takes one HOST"),
                             (["zap", "a.test"], 2, "error: host takes a subcommand: drop")):
        status, out, err = run(redis_url, "host", "dropbad", *args, capsys=capsys)
        assert (status, len(err.splitlines())) == (code, 1) and err.startswith(line), err
    # an unknown subcommand, on either side of the crawl, is bad input (2), not an unknown
    # crawl (4): refused before Redis is asked
    for argv in (["zap", "dropbad", "a.test"], ["nosuchcrawl", "zap", "a.test"]):
        capsys.readouterr()
        status = cli.main(["--redis", redis_url, "host", *argv])
        err = capsys.readouterr().err
        assert (status, len(err.splitlines())) == (2, 1), err
        assert err.startswith("error: host takes a subcommand: drop, block, unblock, set"), err
    status, out, _ = run(redis_url, "host", "dropbad", "drop", "a.test", capsys=capsys)
    assert status == 1 and "declined: nothing dropped" in out  # (no terminal: no)
    assert host_command.reorder(["host", "drop", "c", "h"]) == ["host", "c", "drop", "h"]
    assert host_command.reorder(["host", "c", "drop", "h"]) == ["host", "c", "drop", "h"]
    assert host_command.reorder(["host", "c", "zap", "h"]) == ["host", "c", "zap", "h"]


def test_the_console_command_reads_host_drop_crawl_host(redis_url):
    """``scrapy-fleet host drop CRAWL HOST`` as typed (the subcommand before the crawl), and the
    ``url`` that follows it, through the console entry point."""
    import subprocess
    import sys

    Crawl(redis_url, "dropcli", 1).push("http://a.test/1")
    cli_args = [sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis", redis_url]
    done = subprocess.run([*cli_args, "host", "drop", "dropcli", "a.test", "--yes",
                           "--dead-letter"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("dropped 1 queued entries of host 'a.test' into the dead")
    where = subprocess.run([*cli_args, "url", "dropcli", "http://a.test/1"],
                           capture_output=True, text=True, timeout=60)
    assert where.stdout == "http://a.test/1\n  dead letter: dropped (entry 000000000000001)\n"
