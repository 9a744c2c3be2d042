"""``url``, ``hosts``, ``urls`` and ``crawls`` (commands/lookup.py, docs/control.md) against a
real redis-server, at P = 1 and P = 2: every state of ``url`` is produced through the real
frontier calls (push, a lease by a worker id, a failure record with its acknowledgement, a
dead letter, a recrawl record, an acknowledgement), then looked up as ``scrapy fleet`` runs
the action (``cli.run_action``, in process)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import redis
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.commands import cli, push
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of
from scrapy_fleet.recrawl.record import revisit_record
from scrapy_fleet.recrawl.schedule import State

FP = push.default_fingerprinter()


def run(redis_url: str, action: str, crawl: str, *args: str, parts: int = 1,
        capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="*")
    cli.add_action_arguments(parser)
    opts = parser.parse_args(list(args))
    opts.redis, opts.prefix = redis_url, "fleet"
    if capsys is not None:
        capsys.readouterr()
    status = cli.run_action(action, FrontierAdmin(redis_url, crawl), opts.urls, opts, FP,
                            label=f"crawl {crawl!r}", partitions=parts)
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return status, out, err


class Crawl:
    """A crawl of *parts* partitions, written through the frontier calls of each host's
    partition (as the workers and ``push`` write it)."""

    def __init__(self, redis_url: str, crawl: str, parts: int) -> None:
        self.url, self.crawl, self.parts = redis_url, crawl, parts
        self.base = CrawlKeys("fleet", crawl)

    def keys(self, host: str) -> CrawlKeys:
        return self.base.partition(partition_of(host, self.parts), self.parts) \
            if self.parts > 1 else self.base

    def admin(self, host: str) -> FrontierAdmin:
        return FrontierAdmin(self.url, self.crawl, keys=self.keys(host))

    def push(self, url: str, delay_ms: int = 0) -> None:
        host = Request(url).url.split("/")[2]
        pushed = self.admin(host).push([(bloom_key(FP(Request(url))), 0,
                                         codec.encode_dict({"url": url}), 0, host, delay_ms)])
        assert pushed.push_flags == [1]

    def lease(self, url: str, worker: str = "w1"):
        host = url.split("/")[2]
        self.push(url)
        leased = self.admin(host).call(CallBatch(take=1), worker=worker).leased
        assert [codec.decode_dict(e.payload)["url"] for e in leased] == [url]
        return leased[0]


def states_crawl(redis_url: str, crawl: str, parts: int) -> tuple[Crawl, dict[str, str]]:
    """One URL in each state, each of its own host (the lease step takes the one entry of its
    partition that is queued at that moment)."""
    c = Crawl(redis_url, crawl, parts)
    assert run(redis_url, "push", crawl, "http://seed.test/", parts=parts)[0] == 0
    seed = c.admin("seed.test").call(CallBatch(take=1), worker="w0").leased[0]
    c.admin("seed.test").call(CallBatch(acks=[(seed.entry_id, seed.token)]), worker="w0")
    u = {s: f"http://{s}.test/page?b=2&a=1" for s in
         ("done", "recrawl", "failed", "dead", "leased", "queued", "deferred", "never")}
    e = c.lease(u["done"])
    c.admin("done.test").call(CallBatch(acks=[(e.entry_id, e.token)]), worker="w1")
    e = c.lease(u["recrawl"])
    state = State(fetched=1_700_000_000, interval=3600)
    c.admin("recrawl.test").call(CallBatch(acks=[(e.entry_id, e.token, b"", [], 0, revisit_record(
        e.payload, state.to_meta(), 3600, "recrawl.test", 0))]), worker="w1")
    e = c.lease(u["failed"])
    record = FailureRecord(url=u["failed"], method="GET", reason="http/500", status=500,
                           attempts=3, worker="w1", host="failed.test").encode()
    c.admin("failed.test").call(CallBatch(acks=[(e.entry_id, e.token, record)]), worker="w1")
    e = c.lease(u["dead"])
    c.admin("dead.test").call(CallBatch(dead=[(e.entry_id, e.token, "bad entry")]), worker="w1")
    c.lease(u["leased"], worker="w7")
    c.push(u["queued"])
    c.push(u["deferred"], delay_ms=600_000)
    return c, u


@pytest.mark.parametrize("parts", [1, 2])
def test_url_answers_each_state_as_the_frontier_calls_left_it(redis_url, capsys, parts):
    crawl = f"where{parts}"
    c, u = states_crawl(redis_url, crawl, parts)
    client = redis.Redis.from_url(redis_url)
    status, out, err = run(redis_url, "url", crawl, *u.values(), "--json", parts=parts,
                           capsys=capsys)
    assert status == 0, err
    rows = {r["host"].split(".")[0]: r for r in json.loads(out)}
    assert {name: r["state"] for name, r in rows.items()} == {
        "done": "done", "recrawl": "recrawl", "failed": "failed", "dead": "dead",
        "leased": "leased", "queued": "queued", "deferred": "deferred",
        "never": "never_seen"}
    assert [n for n, r in rows.items() if not r["certain"]] == ["done"]
    leased, lk = rows["leased"], c.keys("leased.test")
    assert (leased["worker"], leased["attempts"], leased["downloaded"]) == ("w7", 1, False)
    assert leased["lease_expiry"] == int(client.zscore(lk.leases, leased["entry_id"]))
    queued, qk = rows["queued"], c.keys("queued.test")
    assert (queued["priority"], queued["ahead"]) == (0, 0)
    assert client.lindex(qk.bucket("queued.test", 0), 0).startswith(
        queued["entry_id"].encode() + b"\t")
    deferred, dk = rows["deferred"], c.keys("deferred.test")
    [(member, until)] = client.zrange(dk.deferred, 0, -1, withscores=True)
    assert member.startswith(deferred["entry_id"].encode() + b"|")
    assert deferred["until"] == int(until)
    assert (rows["failed"]["reason"], rows["failed"]["attempts"]) == ("http/500", 3)
    assert rows["failed"]["at"] > 0
    assert rows["dead"]["reason"] == "bad entry"
    assert rows["recrawl"]["next_due"] > deferred["until"] - 600_000  # due in ~an hour
    assert rows["recrawl"]["last_fetch"] == 1_700_000_000
    # another spelling of the same canonical URL is the same entry (the fingerprint)
    status, out, _ = run(redis_url, "url", crawl, "http://queued.test/page?a=1&b=2", "--json",
                         parts=parts, capsys=capsys)
    assert json.loads(out)["entry_id"] == queued["entry_id"]
    status, out, _ = run(redis_url, "url", crawl, u["leased"], parts=parts, capsys=capsys)
    assert "leased by worker 'w7'" in out


class Counting(redis.Redis):
    """A client that records the commands it sends, a pipeline's execute as one."""

    sent: list[str] = []

    def execute_command(self, *args, **options):
        Counting.sent.append(str(args[0]))
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(*a, **kw):
            Counting.sent.append("PIPELINE")
            return execute(*a, **kw)
        pipe.execute = counted
        return pipe


def test_a_done_url_is_found_in_few_round_trips_each_page_read_once(redis_url):
    """A done URL takes both passes (the second looks at every entry of the host); the
    second matches the pages the first read, and the first page of every structure comes in
    one pipeline: 7 round trips in all (there were 19: every read twice, one per structure)."""
    from scrapy_fleet.frontier.where import locate

    c, u = states_crawl(redis_url, "few", 1)
    for i in range(30):  # the host has a queue to read
        c.push(f"http://done.test/other/{i}")
    client = Counting.from_url(redis_url)
    Counting.sent = []
    row = locate(client, c.base, u["done"], "done.test", FP)
    assert row["state"] == "done"
    # the Bloom filter (HMGET, PIPELINE), the first page of every structure (PIPELINE), the
    # host's bucket (LRANGE, once for both passes), then the recrawl schedule (HGET, ZRANGE,
    # LRANGE of its slot: recrawl/view.py)
    assert Counting.sent == ["HMGET", "PIPELINE", "PIPELINE", "LRANGE", "HGET", "ZRANGE",
                             "LRANGE"], Counting.sent
    Counting.sent = []
    assert locate(client, c.base, u["queued"], "queued.test", FP)["state"] == "queued"
    assert len(Counting.sent) == 4, Counting.sent  # Bloom (2), the pipeline, its bucket


def test_url_refuses_bad_input_in_one_line(redis_url, capsys):
    assert run(redis_url, "url", "nothing", "http://a.test/", capsys=capsys)[0] == 4
    Crawl(redis_url, "bad", 1).push("http://a.test/")
    status, out, err = run(redis_url, "url", "bad", "ftp://a.test/x", capsys=capsys)
    assert (status, out) == (2, "")
    assert err == "error: url takes http(s) URLs (got ftp://a.test/x)\n"
    # a URL no request can have (an unclosed IPv6 bracket, no host): one line, no traceback
    for url in ("http://[::1", "http://", "http:///x"):
        status, out, err = run(redis_url, "url", "bad", url, capsys=capsys)
        assert (status, out, len(err.splitlines())) == (2, "", 1), err
        assert err.startswith(f"error: {url}: not a URL a request can have"), err
    status, out, err = run(redis_url, "url", "bad", capsys=capsys)
    assert (status, err) == (2, "error: url needs at least one http(s) URL\n")
    # an unknown option is named as one, not taken for a URL; a host given to urls without
    # --host is told where it goes (a new user's trial, session 14)
    status, out, err = run(redis_url, "url", "bad", "http://a.test/", "--", "--bogus",
                           capsys=capsys)  # (as scrapy fleet passes unknown options on)
    assert (status, err) == (2, "error: unrecognized arguments: --bogus\n")
    status, out, err = run(redis_url, "urls", "bad", "a.test", capsys=capsys)
    assert (status, err) == (2, "error: urls takes no arguments after the crawl (got 'a.test'; "
                                "a host goes in --host)\n")


@pytest.mark.parametrize("parts", [1, 2])
def test_urls_pages_list_every_entry_exactly_once(redis_url, capsys, parts):
    crawl = f"pages{parts}"
    c = Crawl(redis_url, crawl, parts)
    assert run(redis_url, "push", crawl, "http://seed.test/", parts=parts)[0] == 0
    urls = [f"http://big.test/{i}" for i in range(230)]
    admin = c.admin("big.test")
    admin.push([(bloom_key(FP(Request(x))), i % 3, codec.encode_dict({"url": x}), 0, "big.test")
                for i, x in enumerate(urls)])
    leased = admin.call(CallBatch(take=7), worker="w2").leased  # (several hosts: none rated)
    seen: list[str] = []
    cursor = "0"
    for _ in range(100):
        status, out, err = run(redis_url, "urls", crawl, "--host", "big.test", "--limit", "40",
                               "--cursor", cursor, "--json", parts=parts, capsys=capsys)
        assert status == 0, err
        page = json.loads(out)
        assert len(page["urls"]) <= 40
        seen += [r["url"] for r in page["urls"]]
        cursor = page["next"]
        if cursor == "0":
            break
    taken = {codec.decode_dict(e.payload)["url"] for e in leased}
    assert len(taken) == len(leased) > 0
    assert sorted(seen) == sorted(set(urls) - taken)  # each queued one once
    status, out, _ = run(redis_url, "urls", crawl, "--host", "big.test", "--state", "leased",
                         "--json", parts=parts, capsys=capsys)
    assert {r["url"] for r in json.loads(out)["urls"]} == taken
    assert {r["worker"] for r in json.loads(out)["urls"]} == {"w2"}
    # hosts: the counts per host add up to the crawl's status
    status, out, _ = run(redis_url, "hosts", crawl, "--json", parts=parts, capsys=capsys)
    hosts = json.loads(out)
    rows = {r["host"]: r for r in hosts["hosts"]}
    assert (rows["big.test"]["queued"], rows["big.test"]["leased"]) == (230 - len(taken),
                                                                         len(taken))
    status, out, _ = run(redis_url, "status", crawl, "--json", parts=parts, capsys=capsys)
    counts = json.loads(out)["frontier"]
    assert hosts["total"] == {"queued": counts["due"], "leased": counts["leased"],
                              "deferred": counts["deferred"], "failed": counts["failed"]}
    # bad input: one line each
    for args, code, line in (
            (["--host", "nope.test"], 1, "error: crawl 'pages%d' has no host 'nope.test'"),
            (["--host", "big.test", "--state", "odd"], 2, "error: --state takes one of"),
            (["--host", "big.test", "--cursor", "x"], 2, "error: --cursor 'x' is not a"),
            ([], 2, "error: urls needs one --host H"),
            (["--host", "big.test", "--limit", "0"], 2, "error: --limit takes a positive"),
            (["--host", "big.test", "--limit", "-3"], 2, "error: --limit takes a positive")):
        status, out, err = run(redis_url, "urls", crawl, *args, parts=parts, capsys=capsys)
        assert (status, len(err.splitlines())) == (code, 1), err
        assert err.startswith(line.replace("%d", str(parts))), err


def test_crawls_lists_the_crawl_ids_with_their_counts(redis_url, capsys):
    Crawl(redis_url, "listed-a", 1).push("http://a.test/1")
    assert run(redis_url, "push", "listed-b", "http://b.test/1", "http://c.test/2",
               parts=2)[0] == 0
    done = subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                           redis_url, "crawls", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {r["crawl"]: r for r in json.loads(done.stdout)}
    assert rows["listed-a"] == {"crawl": "listed-a", "partitions": 1, "pushed": 1, "queued": 1}
    assert rows["listed-b"] == {"crawl": "listed-b", "partitions": 2, "pushed": 2, "queued": 2}


@pytest.mark.parametrize("parts", [1, 2])
def test_the_reads_run_as_the_monitor_role_and_drop_as_admin(redis_server, redis_url, parts):
    """``url``, ``hosts``, ``urls`` with a Redis user of the monitor's ACL rule (reads only);
    ``host drop`` with the admin's; ``crawls`` with a monitor of every crawl."""
    from scrapy_fleet import acl

    crawl = f"aclread{parts}"
    _, u = states_crawl(redis_url, crawl, parts)
    root = redis_server.client()
    users = []

    def user(name: str, rule: str) -> str:
        root.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", *rule.split())
        users.append(name)
        return f"redis://{name}:pw@127.0.0.1:{redis_server.port}/0"

    try:
        monitor = user(f"mon{parts}", acl.acl_rule("monitor", crawl_id=crawl,
                                                   partitions=parts > 1))
        every = user(f"monall{parts}", acl.acl_rule("monitor", partitions=True))
        admin = user(f"adm{parts}", acl.acl_rule("admin", crawl_id=crawl, partitions=parts > 1))

        def cli_as(url: str, *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "scrapy_fleet.commands.cli", "--redis",
                                   url, *args], capture_output=True, text=True, timeout=60)

        where = cli_as(monitor, "url", crawl, *u.values(), "--json")
        assert where.returncode == 0, where.stderr
        assert [r["state"] for r in json.loads(where.stdout)] == [
            "done", "recrawl", "failed", "dead", "leased", "queued", "deferred", "never_seen"]
        for args in (["hosts", crawl], ["urls", crawl, "--host", "queued.test"],
                     ["urls", crawl, "--host", "leased.test", "--state", "leased"]):
            done = cli_as(monitor, *args)
            assert done.returncode == 0, (args, done.stderr)
        listed = cli_as(every, "crawls", "--json")
        assert listed.returncode == 0, listed.stderr
        assert crawl in {r["crawl"] for r in json.loads(listed.stdout)}
        refused = cli_as(monitor, "host", "drop", crawl, "queued.test", "--yes")
        assert refused.returncode == 2 and "admin" in refused.stderr, refused.stderr
        dropped = cli_as(admin, "host", "drop", crawl, "queued.test", "--yes")
        assert dropped.returncode == 0, dropped.stderr
    finally:
        for name in users:
            root.execute_command("ACL", "DELUSER", name)
        root.close()


def spelled_crawl(redis_url: str, crawl: str) -> tuple[Crawl, dict[str, str]]:
    """One URL in each state, pushed as ``/dir/./page?y=2&x=1#top`` (another spelling of
    ``/dir/page?x=1&y=2``), each on a host of 40 other entries of the same shape."""
    c = Crawl(redis_url, crawl, 1)
    states = ("leased", "failed", "dead", "done", "queued", "deferred")
    written = {s: f"http://{s}.spell.test/dir/./page?y=2&x=1#top" for s in states}
    for s in states:  # (the lease step takes the one entry queued at that moment)
        url = written[s]
        if s in ("leased", "failed", "dead", "done"):
            e = c.lease(url, worker="w5")
            if s == "failed":
                record = FailureRecord(url=url, method="GET", reason="http/503", status=503,
                                       attempts=2, worker="w5", host=f"{s}.spell.test")
                c.admin(f"{s}.spell.test").call(
                    CallBatch(acks=[(e.entry_id, e.token, record.encode())]), worker="w5")
            elif s == "dead":
                c.admin(f"{s}.spell.test").call(CallBatch(dead=[(e.entry_id, e.token, "bad")]),
                                                worker="w5")
            elif s == "done":
                c.admin(f"{s}.spell.test").call(CallBatch(acks=[(e.entry_id, e.token)]),
                                                worker="w5")
        else:
            c.push(url, delay_ms=600_000 if s == "deferred" else 0)
    for s in states:
        for i in range(40):
            c.push(f"http://{s}.spell.test/dir/page?x={i + 2}&y=2")
    return c, written


def test_another_spelling_is_found_in_each_state_and_a_done_one_stays_done(redis_url):
    """The second pass's filter (where.py ``has_runs``) keeps the entry of every state when the
    URL is looked up in another spelling (the first pass, by the spelling, misses it): never
    ``done`` for an entry the frontier holds."""
    from scrapy_fleet.frontier.where import locate

    c, written = spelled_crawl(redis_url, "spell")
    client = redis.Redis.from_url(redis_url)
    for state, url in written.items():
        host = f"{state}.spell.test"
        other = f"http://{host}/dir/page?x=1&y=2"
        as_written = locate(client, c.base, url, host, FP)
        found = locate(client, c.base, other, host, FP)
        assert (as_written["state"], found["state"]) == (state, state), (state, found)
        assert found["entry_id"] == as_written["entry_id"]
        assert found["certain"] is (state != "done")
        if state != "done":
            assert found["entry_id"] is not None
        assert locate(client, c.base, f"http://{host}/dir/page?x=1&y=3", host,
                      FP)["state"] == "never_seen"


def test_a_done_lookup_fingerprints_only_the_entries_that_may_be_it(redis_url, monkeypatch):
    """A done URL of a host of 300 queued entries: the second pass fingerprints none of them
    (there were 300: each entry canonicalized and hashed); a queued one in another spelling
    is found with one fingerprint; the same with 100 escaped URLs more."""
    from scrapy_fleet.frontier import where

    c = Crawl(redis_url, "cost", 1)
    admin = c.admin("cost.test")
    done = c.lease("http://cost.test/item/1000?ref=nav")
    admin.call(CallBatch(acks=[(done.entry_id, done.token)]), worker="w1")
    urls = [f"http://cost.test/item/{i}?ref=nav" for i in range(300)]
    admin.push([(bloom_key(FP(Request(u))), 0, codec.encode_dict({"url": u}), 0, "cost.test")
                for u in urls])
    calls: list[str] = []
    keyed = where.url_bloom_key

    def counted(url: str) -> bytes:
        calls.append(url)
        return keyed(url)
    monkeypatch.setattr(where, "url_bloom_key", counted)
    client = redis.Redis.from_url(redis_url)
    row = where.locate(client, c.base, "http://cost.test/item/1000?ref=nav", "cost.test", FP)
    assert (row["state"], calls) == ("done", [])
    row = where.locate(client, c.base, "http://cost.test/item/7?ref=nav#more", "cost.test", FP)
    assert (row["state"], calls) == ("queued", ["http://cost.test/item/7?ref=nav"])
    assert row["ahead"] == 7
    # escaped URLs (non-ASCII): decided without fingerprints too, found in another spelling
    escaped = [f"http://cost.test/caf%C3%A9/{i}%20x" for i in range(100)]
    admin.push([(bloom_key(FP(Request(u))), 0, codec.encode_dict({"url": u}), 0, "cost.test")
                for u in escaped])
    calls.clear()
    row = where.locate(client, c.base, "http://cost.test/item/1000?ref=nav", "cost.test", FP)
    assert (row["state"], calls) == ("done", [])
    row = where.locate(client, c.base, "http://cost.test/caf\u00e9/7 x#top", "cost.test", FP)
    assert (row["state"], calls, row["ahead"]) == ("queued", [escaped[7]], 307)
