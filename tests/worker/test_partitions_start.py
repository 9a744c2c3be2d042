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
from scrapy_fleet.keys import LAYOUT_VERSION, CrawlKeys

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


def test_a_one_partition_worker_between_the_check_and_the_write_of_a_partitioned_one(
        redis_url):
    """The P = 1 worker claims the crawl between the P = 2 worker's look for a P = 1 crawl and
    its SET NX (the window that let both pass): the P = 2 worker refuses in one line and takes
    its key back."""
    c = redis.Redis.from_url(redis_url)
    racing = _OtherFirst(c, "set", lambda: partition_count.claim_one_sync(c, KEYS))
    with pytest.raises(FleetConfigError) as refused:
        partition_count.check_sync(racing, KEYS, 2)
    assert str(refused.value) == (
        "FLEET_PARTITIONS=2 does not match crawl 'race', created with FLEET_PARTITIONS=1: "
        "set it to 1, or purge the crawl to start it again")
    assert stored(c) == {KEYS.layout: str(LAYOUT_VERSION).encode()}


def test_a_partitioned_worker_between_the_claim_and_the_check_of_a_one_partition_one(
        redis_url):
    """The P = 2 worker checks and writes between the P = 1 worker's claim and its read: it sees
    the claim and refuses; the P = 1 worker passes."""
    c = redis.Redis.from_url(redis_url)
    errors: list[Exception] = []

    def partitioned() -> None:
        try:
            partition_count.check_sync(c, KEYS, 2)
        except FleetConfigError as exc:
            errors.append(exc)
    partition_count.claim_one_sync(_OtherFirst(c, "get", partitioned), KEYS)
    assert [str(e) for e in errors] == [
        "FLEET_PARTITIONS=2 does not match crawl 'race', created with FLEET_PARTITIONS=1: "
        "set it to 1, or purge the crawl to start it again"]
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
