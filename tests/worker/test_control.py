"""Crawl control in the frontier call (issue 34, lua/step_control.lua, docs/control.md): a
paused crawl or host gets no lease, pushes go on, `--for` ends on Redis's clock, a paused
crawl is not idle, `pause` waits for every live worker's confirmation; at P = 1 and 2."""

from __future__ import annotations

import argparse

import pytest
from support import host_entry as entry
from support import wait_until

from scrapy_fleet.commands import cli, control
from scrapy_fleet.commands.partitioned import partition_admins
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.keys.partition import partition_of

HOSTS = ["a.test", "b.test", "c.test", "d.test"]


def opts(**kw):
    base = {"host": None, "pause_for": None, "reason": None, "wait": 2.0}
    return argparse.Namespace(**{**base, **kw})


def setup_crawl(redis_url: str, parts: int, n: int = 3):
    """A crawl of *parts* partitions with *n* entries per host of HOSTS; its admins."""
    admin = FrontierAdmin(redis_url, f"ctl{parts}")
    admins = partition_admins(admin, parts) if parts > 1 else [admin]
    for h in HOSTS:
        admins[partition_of(h, parts)].push([entry(f"http://{h}/{i}") for i in range(n)])
    return admin, admins


def leased_hosts(admins, worker="w", take=50) -> list[str]:
    from scrapy_fleet import codec
    from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES

    hosts = []
    for a in admins:
        for e in a.call(CallBatch(take=take), worker=worker).leased:
            hosts.append(codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url.split("/")[2])
    return hosts


@pytest.mark.parametrize("parts", [1, 2])
def test_a_paused_crawl_grants_no_lease_accepts_pushes_and_resumes(redis_url, parts):
    admin, admins = setup_crawl(redis_url, parts)
    assert control.run_pause(admin, [], opts(reason="too fast", wait=0.5), parts) == 0
    assert leased_hosts(admins) == []  # every partition: nothing leased
    # pushes are accepted while paused, and counted
    home = admins[partition_of("a.test", parts)]
    res = home.call(CallBatch(pushes=[entry("http://a.test/new")], take=5), worker="w")
    assert res.pushed == 1 and res.leased == []
    assert res.control is not None and res.control.paused == float("inf")
    state = control.read_state(admins[0])
    assert state is not None and state["paused"] and state["why"] == "too fast"
    assert control.run_resume(admin, [], opts(), parts) == 0
    got = leased_hosts(admins)
    assert sorted(set(got)) == sorted(HOSTS) and len(got) == 4 * 3 + 1


@pytest.mark.parametrize("parts", [1, 2])
def test_a_paused_host_gets_no_lease_while_the_others_are_served(redis_url, parts):
    admin, admins = setup_crawl(redis_url, parts, n=2)
    assert control.run_pause(admin, [], opts(host=["b.test"], wait=0.5), parts) == 0
    got: list[str] = []
    for _ in range(4):
        got += leased_hosts(admins)
    assert "b.test" not in got and sorted(got) == sorted(h for h in HOSTS if h != "b.test"
                                                        for _ in range(2))
    # the reply names the paused host for the worker's gate (frontier/control.py)
    reply = admins[0].call(CallBatch(), worker="w")
    assert reply.control is not None and "b.test" in reply.control.hosts
    assert reply.control.paused is None  # the crawl itself runs
    assert control.run_resume(admin, [], opts(host=["b.test"]), parts) == 0
    assert sorted(leased_hosts(admins)) == ["b.test", "b.test"]


def test_a_host_typed_as_host_port_or_url_names_the_crawls_host(redis_url):
    """An operator types the host as the site shows it: ``B.TEST:8013`` and
    ``http://b.test:8013/x`` are the crawl's host ``b.test`` (ports are not part of it)."""
    admin, admins = setup_crawl(redis_url, 1, n=2)
    o = opts(wait=0.5)
    o.host_verb = "block"
    assert control.run_host(admin, ["HTTP://C.TEST:80/"], o, 1) == 0
    state = control.read_state(admins[0])
    assert state is not None and list(state["hosts"]) == ["c.test"]
    o.host_verb = "unblock"
    assert control.run_host(admin, ["c.test:80"], o, 1) == 0
    assert control.run_pause(admin, [], opts(host=["B.TEST:8013"], wait=0.5), 1) == 0
    got = leased_hosts(admins) + leased_hosts(admins)
    assert "b.test" not in got and "c.test" in got
    assert control.run_resume(admin, [], opts(host=["http://b.test:8013/x"]), 1) == 0
    assert sorted(leased_hosts(admins)) == ["b.test", "b.test"]


@pytest.mark.parametrize("parts", [1, 2])
def test_host_block_holds_until_unblocked(redis_url, parts):
    admin, admins = setup_crawl(redis_url, parts, n=1)
    o = opts(wait=0.5)
    o.host_verb = "block"
    assert control.run_host(admin, ["c.test"], o, parts) == 0
    assert sorted(leased_hosts(admins)) == ["a.test", "b.test", "d.test"]
    assert leased_hosts(admins) == []
    state = control.read_state(admins[0])
    assert state is not None and state["hosts"]["c.test"]["kind"] == "block"
    o.host_verb = "unblock"
    assert control.run_host(admin, ["c.test"], o, parts) == 0
    assert leased_hosts(admins) == ["c.test"]


@pytest.mark.parametrize("parts", [1, 2])
def test_unblock_of_a_host_never_blocked_says_so(redis_url, parts, capsys):
    admin, admins = setup_crawl(redis_url, parts, n=1)
    gen_before = [admins[0].client.get(k.ctl) for k in admin.keys.all_partitions(parts)]
    o = opts(wait=0.5)
    o.host_verb = "unblock"
    assert control.run_host(admin, ["c.test"], o, parts) == 0
    out = capsys.readouterr().out
    assert out == (f"host c.test of crawl 'ctl{parts}' was not blocked or paused: nothing "
                   "to unblock\n"), out
    # nothing written: no control generation spent
    assert [admins[0].client.get(k.ctl) for k in admin.keys.all_partitions(parts)] == gen_before
    o.host_verb = "block"
    assert control.run_host(admin, ["c.test"], o, parts) == 0
    o.host_verb = "unblock"
    capsys.readouterr()
    assert control.run_host(admin, ["c.test"], o, parts) == 0
    assert capsys.readouterr().out.startswith("unblocked host c.test of crawl")


@pytest.mark.parametrize("parts", [1, 2])
def test_pause_for_ends_on_redis_clock(redis_url, parts):
    admin, admins = setup_crawl(redis_url, parts, n=1)
    assert control.run_pause(admin, [], opts(pause_for="1.5s", wait=0.5), parts) == 0
    first = admins[0].call(CallBatch(take=5), worker="w")
    assert first.leased == [] and first.control is not None
    assert first.control.paused is not None and 0 < first.control.paused <= 1.5
    got: list[str] = []

    def leased():
        got.extend(leased_hosts(admins))
        return len(got) == 4
    wait_until(leased, 30, "leases back once the pause's time is over")
    assert sorted(got) == sorted(HOSTS)


def test_a_paused_empty_crawl_is_not_idle(redis_url):
    admin, _ = setup_crawl(redis_url, 1, n=1)
    leased = admin.call(CallBatch(take=10), worker="w").leased
    admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in leased]), worker="w")
    assert admin.call(CallBatch(), worker="w").idle_ms >= 0  # empty: idle
    # (worker w is live and does not call during the pause, but holds no lease: it could
    # start nothing without a call that sees the pause, so the command does not wait for it)
    assert control.run_pause(admin, [], opts(wait=0.2), 1) == 0
    assert admin.call(CallBatch(), worker="w").idle_ms == -1  # paused: never idle
    assert control.run_resume(admin, [], opts(), 1) == 0
    assert admin.call(CallBatch(), worker="w").idle_ms >= 0


def test_pause_waits_for_live_workers_and_names_those_that_do_not_confirm(redis_url, capsys):
    admin, _ = setup_crawl(redis_url, 1, n=1)
    # a live worker holding a lease (it could start it) that will not call again
    assert len(admin.call(CallBatch(take=1), worker="slow").leased) == 1
    assert control.run_pause(admin, [], opts(wait=0.3), 1) == 1
    assert "slow" in capsys.readouterr().err
    gen = control.read_state(admin)["gen"]
    assert control.unconfirmed(admin, 1, gen) == ["slow"]
    # its next call reports the generation it holds: confirmed
    admin.call(CallBatch(control_gen=gen), worker="slow")
    assert control.unconfirmed(admin, 1, gen) == []


@pytest.mark.parametrize("parts", [1, 2])
def test_pause_does_not_wait_for_a_live_worker_that_holds_no_lease(redis_url, capsys, parts):
    """An idle worker calls only at its heartbeat (5 s): it held `pause` back that long.  It
    holds no lease, so it can start nothing before a frontier call, whose lease step reads
    the pause: the command returns without it."""
    admin, admins = setup_crawl(redis_url, parts, n=1)
    for a in admins:
        a.call(CallBatch(), worker="idle")  # live, no lease, will not call again
    held = {a: a.call(CallBatch(take=1), worker="busy").leased for a in admins}
    assert [len(v) for v in held.values()] == [1] * parts  # one lease in each partition
    assert control.run_pause(admin, [], opts(wait=0.3), parts) == 1
    err = capsys.readouterr().err
    assert "busy" in err and "idle" not in err, err
    gen = control.read_state(admins[0])["gen"]
    assert control.unconfirmed(admin, parts, gen) == ["busy"]
    for a, leases in held.items():  # busy's downloads end and are acknowledged: no lease
        a.call(CallBatch(acks=[(e.entry_id, e.token) for e in leases]), worker="busy")
    # only workers without a lease are live: the next control returns at once
    assert control.run_resume(admin, [], opts(), parts) == 0
    assert control.run_pause(admin, [], opts(wait=0.3), parts) == 0
    assert "every live worker holds it" in capsys.readouterr().out


@pytest.mark.parametrize("argv, status, line", [
    (["pause", "nosuch"], 4, "no record"),
    (["pause", "ctlcli", "--for", "5x"], 2, "cannot read duration"),
    (["pause", "ctlcli", "--host", ""], 2, "empty"),
    (["pause", "ctlcli", "--wait", "-1"], 2, "--wait takes a positive"),
    (["host", "block", "ctlcli", "a.test", "--wait", "0"], 2, "--wait takes a positive"),
    (["host", "block", "ctlcli", ""], 2, "one non-empty host"),
    (["host", "block", "ctlcli", "http://[::1"], 2, "needs a host name"),
    (["budget", "ctlcli", "--host", "", "--pages", "5"], 2, "empty"),
    (["budget", "ctlcli", "--host", "a.test", "--host", "b.test", "--pages", "5"], 2,
     "one --host"),
])
def test_bad_input_gets_one_line_and_its_status(redis_url, capsys, argv, status, line):
    FrontierAdmin(redis_url, "ctlcli").push([entry("http://a.test/1")])
    assert cli.main(["--redis", redis_url, *argv]) == status
    err = capsys.readouterr().err.strip()
    assert line in err and len(err.splitlines()) == 1, err


def test_status_shows_the_pause_and_the_blocked_hosts(redis_url, capsys):
    import json

    admin, _ = setup_crawl(redis_url, 1, n=1)
    assert cli.main(["--redis", redis_url, "status", "ctl1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["control"] is None  # never used: null
    assert control.run_pause(admin, [], opts(reason="site asked", wait=0.2), 1) == 0
    o = opts(wait=0.2)
    o.host_verb = "block"
    assert control.run_host(admin, ["b.test"], o, 1) == 0
    capsys.readouterr()
    assert cli.main(["--redis", redis_url, "status", "ctl1", "--json"]) == 0
    ctl = json.loads(capsys.readouterr().out)["control"]
    assert ctl["paused"] and ctl["why"] == "site asked" and ctl["until"] == 0
    assert list(ctl["hosts"]) == ["b.test"] and ctl["hosts"]["b.test"]["kind"] == "block"
    assert cli.main(["--redis", redis_url, "status", "ctl1"]) == 0
    out = capsys.readouterr().out
    assert "control    PAUSED by" in out and "(site asked)" in out and "b.test (block)" in out


def test_top_and_metrics_show_the_pause_and_the_paused_hosts(redis_url, capsys):
    from scrapy_fleet.monitoring.metrics import PREFIX, families
    from scrapy_fleet.monitoring.snapshot import read_snapshot

    admin, _ = setup_crawl(redis_url, 1, n=1)

    def gauges() -> tuple[float, float]:
        fams = {f.name: f for f in families(read_snapshot(admin.client, admin.keys))}
        return (fams[PREFIX + "paused"].samples[0].value,
                fams[PREFIX + "paused_hosts"].samples[0].value)

    assert gauges() == (0.0, 0.0)
    assert control.run_pause(admin, [], opts(host=["a.test", "c.test"], wait=0.2), 1) == 0
    assert gauges() == (0.0, 2.0)
    assert control.run_pause(admin, [], opts(reason="night", wait=0.2), 1) == 0
    assert gauges() == (1.0, 2.0)
    capsys.readouterr()
    assert cli.main(["--redis", redis_url, "top", "ctl1", "--once"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # (the view wraps long lines)
    assert "control PAUSED by" in out and "(night)" in out
    assert "2 host(s) paused or blocked: a.test (pause), c.test (pause)" in out
    assert control.run_resume(admin, [], opts(), 1) == 0
    assert gauges() == (0.0, 2.0)


def hosts_of_calls(admin, n: int, take: int = 10) -> list[list[str]]:
    """The hosts leased by *n* calls (each acknowledging nothing), one list per call."""
    from scrapy_fleet import codec
    from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES

    return [[codec.decode(e.payload, None, DEFAULT_REQUEST_CLASSES).url.split("/")[2]
             for e in admin.call(CallBatch(take=take), worker="w").leased] for _ in range(n)]


@pytest.mark.parametrize("parts", [1, 2])
def test_host_set_overrides_a_hosts_politeness_from_the_next_lease(redis_url, parts):
    admin, admins = setup_crawl(redis_url, parts, n=4)
    home = admins[partition_of("a.test", parts)]
    o = opts()
    o.host_verb, o.set_rate, o.set_delay, o.set_concurrency = "set", None, None, 1
    assert control.run_host(admin, ["a.test"], o, parts) == 0
    # at most one request of a.test in flight (nothing acknowledged): 1, then none
    assert [hs.count("a.test") for hs in hosts_of_calls(home, 2)] == [1, 0]
    # a rate of 0.5/s: its next turn two seconds after a lease (reply's next_ready)
    o.set_concurrency, o.set_rate = None, 0.5
    other = admins[partition_of("e.test", parts)]
    other.push([entry(f"http://e.test/{i}") for i in range(3)])
    assert control.run_host(admin, ["e.test"], o, parts) == 0
    assert hosts_of_calls(other, 1)[0].count("e.test") == 1  # one turn now
    second = other.call(CallBatch(take=10), worker="w")
    assert second.leased == [] and second.next_ready is not None
    assert 1.5 < second.next_ready <= 2.0  # the next one two seconds after
    # --clear: a.test back to the defaults (no cap): its three others leased at once
    o2 = opts()
    o2.host_verb, o2.clear = "set", True
    assert control.run_host(admin, ["a.test"], o2, parts) == 0
    assert hosts_of_calls(home, 1)[0].count("a.test") == 3


def test_host_set_refuses_bad_values_with_one_line(redis_url, capsys):
    FrontierAdmin(redis_url, "ctlcli").push([entry("http://a.test/1")])
    for extra in (["--rate", "0"], ["--rate", "1", "--delay", "1"], [], ["--concurrency", "0"]):
        assert cli.main(["--redis", redis_url, "host", "set", "ctlcli", "a.test", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and len(err.splitlines()) == 1, err
