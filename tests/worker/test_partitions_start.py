"""Two first workers starting one new crawl at the same moment with another FLEET_PARTITIONS
each (issue 21): whatever the interleaving of their start-up checks, at most one passes, the
other refuses in the start-up check's one line, and the refused one leaves no key behind.
The interleavings are played with a real client whose command runs the other worker's whole
check first (as tests/worker/test_layout_version.py does for the layout)."""

from __future__ import annotations

import pytest
import redis

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.frontier import partition_count
from scrapy_fleet.keys.crawl import LAYOUT_VERSION, CrawlKeys

KEYS = CrawlKeys("fleet", "race")


class _OtherFirst:
    """A real client whose first *command* runs *other* just before it."""

    def __init__(self, client: redis.Redis, command: str, other) -> None:
        self.client, self.command, self.other = client, command, other

    def __getattr__(self, name: str):
        call = getattr(self.client, name)
        if name != self.command or self.other is None:
            return call
        other, self.other = self.other, None

        def run(*args, **kwargs):
            other()
            return call(*args, **kwargs)
        return run


def stored(client: redis.Redis) -> dict[str, bytes]:
    return {k.decode(): client.get(k) for k in client.keys("*")}


#: the one line of a P = 2 worker refused by the P = 1 crawl 'race'
P2_REFUSED = ("FLEET_PARTITIONS=2 does not match crawl 'race', created with FLEET_PARTITIONS=1: "
              "set it to 1, or purge the crawl to start it again")


def _partitioned_worker(client: redis.Redis, errors: list[Exception]):
    """The start-up check of a P = 2 worker on *client*; its refusal goes to *errors*."""
    def check() -> None:
        try:
            partition_count.check_sync(client, KEYS, 2)
        except FleetConfigError as exc:
            errors.append(exc)
    return check


def test_a_one_partition_worker_between_the_check_and_the_write_of_a_partitioned_one(
        redis_url):
    """The P = 1 worker claims the crawl between the P = 2 worker's look for a P = 1 crawl and
    its SET NX (the window that let both pass): the P = 2 worker refuses in one line and takes
    its key back."""
    c = redis.Redis.from_url(redis_url)
    racing = _OtherFirst(c, "set", lambda: partition_count.claim_one_sync(c, KEYS))
    with pytest.raises(FleetConfigError) as refused:
        partition_count.check_sync(racing, KEYS, 2)
    assert str(refused.value) == P2_REFUSED
    assert stored(c) == {KEYS.layout: str(LAYOUT_VERSION).encode()}


def test_a_partitioned_worker_between_the_claim_and_the_check_of_a_one_partition_one(
        redis_url):
    """The P = 2 worker checks and writes between the P = 1 worker's claim and its read: it sees
    the claim and refuses; the P = 1 worker passes."""
    c = redis.Redis.from_url(redis_url)
    errors: list[Exception] = []
    partitioned = _partitioned_worker(c, errors)
    partition_count.claim_one_sync(_OtherFirst(c, "get", partitioned), KEYS)
    assert [str(e) for e in errors] == [P2_REFUSED]
    assert stored(c) == {KEYS.layout: str(LAYOUT_VERSION).encode()}


def test_a_one_partition_worker_after_a_partitioned_one_refuses_and_leaves_no_key(redis_url):
    """The P = 2 worker wrote P before the P = 1 worker's claim: the P = 1 worker refuses at
    start in one line (not later, in the scheduler's open) and takes its layout key back."""
    c = redis.Redis.from_url(redis_url)
    racing = _OtherFirst(c, "set", lambda: partition_count.check_sync(c, KEYS, 2))
    with pytest.raises(FleetConfigError) as refused:
        partition_count.claim_one_sync(racing, KEYS)
    assert str(refused.value) == (
        "FLEET_PARTITIONS=1 does not match crawl 'race', created with FLEET_PARTITIONS=2: "
        "set it to that value, or purge the crawl to start it again")
    assert stored(c) == {KEYS.partitions: b"2"}


def test_two_partitioned_workers_with_another_p_each(redis_url):
    c = redis.Redis.from_url(redis_url)
    racing = _OtherFirst(c, "set", lambda: partition_count.check_sync(c, KEYS, 3))
    with pytest.raises(FleetConfigError, match="FLEET_PARTITIONS=2 does not match crawl "
                                               "'race', created with FLEET_PARTITIONS=3"):
        partition_count.check_sync(racing, KEYS, 2)
    assert stored(c) == {KEYS.partitions: b"3"}


class _OtherAfter:
    """A real client that runs *other* right after the *nth* call of *command* returned."""

    def __init__(self, client: redis.Redis, command: str, nth: int, other) -> None:
        self.client, self.command, self.nth, self.other = client, command, nth, other

    def __getattr__(self, name: str):
        call = getattr(self.client, name)
        if name != self.command or self.other is None:
            return call

        def run(*args, **kwargs):
            reply = call(*args, **kwargs)
            self.nth -= 1
            if self.nth == 0:
                other, self.other = self.other, None
                other()
            return reply
        return run


def _push(redis_url: str, client, capsys) -> tuple[int, str]:
    """``scrapy fleet push`` of one URL with FLEET_PARTITIONS=1, in process, on *client*."""
    import argparse

    from scrapy_fleet.commands import cli
    from scrapy_fleet.frontier.admin import FrontierAdmin

    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="*")
    cli.add_action_arguments(parser)
    opts = parser.parse_args(["http://h.test/a"])
    capsys.readouterr()
    code = cli.run_action("push", FrontierAdmin(redis_url, KEYS.crawl_id, client=client),
                          opts.urls, opts, lambda r: r.url.encode(), label="crawl 'race'",
                          partitions=1)
    return code, capsys.readouterr().err


def test_a_partitioned_worker_just_after_the_check_of_a_one_partition_push(redis_url, capsys):
    """The P = 2 worker checks and writes right after a P = 1 push read the crawl's P, before
    the push's first write (the window in which both passed: the push did not claim the crawl
    as a P = 1 worker does): the worker refuses and takes its key back; the push pushes."""
    c = redis.Redis.from_url(redis_url)
    errors: list[Exception] = []
    partitioned = _partitioned_worker(c, errors)
    code, err = _push(redis_url, _OtherAfter(c, "get", 2, partitioned), capsys)
    assert (code, err) == (0, "")
    assert [str(e) for e in errors] == [P2_REFUSED]
    assert c.get(KEYS.partitions) is None
    assert c.get(KEYS.layout) == str(LAYOUT_VERSION).encode()


def test_a_one_partition_push_after_a_partitioned_worker_refuses_and_writes_nothing(
        redis_url, capsys):
    """The P = 2 worker created the crawl between the P = 1 push's read of P and its claim: the
    push refuses in one line and leaves nothing of a P = 1 crawl behind."""
    c = redis.Redis.from_url(redis_url)
    code, err = _push(redis_url, _OtherFirst(c, "set", lambda: partition_count.check_sync(
        c, KEYS, 2)), capsys)
    assert (code, err) == (2, "error: FLEET_PARTITIONS=1 does not match crawl 'race', created "
                              "with FLEET_PARTITIONS=2: set it to that value, or purge the "
                              "crawl to start it again\n")
    assert stored(c) == {KEYS.partitions: b"2"}


def test_a_one_partition_push_and_a_partitioned_worker_starting_together(redis_url, capsys):
    """The two in threads, started together, 20 times over: never do both pass, and nothing
    is left written under the layout of one that refused."""
    import threading

    from scrapy_fleet.commands import cli

    c = redis.Redis.from_url(redis_url)
    outcomes = set()
    for _ in range(20):
        c.flushdb()
        gate = threading.Barrier(2)
        results: dict[str, object] = {}

        def worker(gate: threading.Barrier, results: dict[str, object]) -> None:
            gate.wait()
            try:
                partition_count.start_sync(redis.Redis.from_url(redis_url), KEYS, 2, True)
                results["worker"] = "passed"
            except FleetConfigError:
                results["worker"] = "refused"

        thread = threading.Thread(target=worker, args=(gate, results))
        thread.start()
        gate.wait()
        code, _ = _push(redis_url, redis.Redis.from_url(redis_url), capsys)
        thread.join()
        outcome = (code, results["worker"])
        # never both; both refuse when each sees the other's write before it is taken back
        assert outcome in {(0, "refused"), (cli.push.EXIT_ERROR, "passed"),
                           (cli.push.EXIT_ERROR, "refused")}
        outcomes.add(outcome)
        keys = {k.decode() for k in c.keys("*")}
        if code == 0:
            assert KEYS.partitions not in keys
        else:
            assert keys == ({KEYS.partitions} if results["worker"] == "passed" else set())
    assert outcomes  # (which one wins varies with the timing)
