"""lua/startkey.lua on a real Redis: a scrapy-redis start key's entries move into the taking
hash in scrapy-redis's order, leave it only when their worker says they are done (or bad), and
are taken over by another worker once their deadline passes (compat/feeder.py)."""

from __future__ import annotations

import pytest
import redis
from support import server_ms, wait_server_past

from scrapy_fleet import lua
from scrapy_fleet.keys.fleet import StartKeyKeys

KEYS = StartKeyKeys("spider:start_urls")


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def call(client, kind, worker, n, done=(), bad=(), renew=(), lease_ms=60_000):
    script = lua.load(client, "startkey.lua")
    remaining, overdue, taken = script(keys=KEYS.call_keys(), args=[
        kind, worker, lease_ms, n, len(done), len(bad), *done, *bad, *renew])
    pairs = [(taken[i].decode(), taken[i + 1]) for i in range(0, len(taken), 2)]
    return int(remaining), int(overdue), pairs


def test_keys_share_the_start_keys_slot():
    from redis.crc import key_slot

    for start in ("spider:start_urls", "{tag}:start", "a{b}c"):
        k = StartKeyKeys(start)
        assert {key_slot(key.encode()) for key in k.call_keys()} == {key_slot(start.encode())}


def test_list_taken_from_the_head_and_kept_until_done(client):
    client.lpush(KEYS.start, b"u1", b"u2", b"u3")  # head: u3
    remaining, overdue, taken = call(client, "list", "w1", 2)
    assert [e for _, e in taken] == [b"u3", b"u2"]
    assert (remaining, overdue) == (3, 0)  # 1 in the key, 2 taken and not done
    assert client.lrange(KEYS.start, 0, -1) == [b"u1"]
    ids = [i for i, _ in taken]
    remaining, _, more = call(client, "list", "w1", 0, done=[ids[0]], renew=[ids[1]])
    assert (remaining, more) == (2, [])
    assert client.hget(KEYS.taking, ids[0]) is None
    assert client.hget(KEYS.taking, ids[1]) == b"w1\nu2"
    # another worker cannot finish what w1 holds
    call(client, "list", "w2", 0, done=[ids[1]])
    assert client.hget(KEYS.taking, ids[1]) == b"w1\nu2"


def test_set_and_sorted_set(client):
    client.sadd(KEYS.start, b"a", b"b")
    _, _, taken = call(client, "set", "w1", 5)
    assert sorted(e for _, e in taken) == [b"a", b"b"]
    assert client.scard(KEYS.start) == 0
    client.delete(KEYS.start)
    client.zadd(KEYS.start, {b"low": 1, b"high": 9, b"mid": 5})
    remaining, _, taken = call(client, "zset", "w1", 2)
    assert [e for _, e in taken] == [b"high", b"mid"]
    assert client.zrange(KEYS.start, 0, -1) == [b"low"]
    assert remaining == 1 + 2 + 2  # the key, and the four taken entries not done


def test_overdue_entries_of_a_stopped_worker_are_taken_over(client):
    client.lpush(KEYS.start, b"u1")
    _, _, taken = call(client, "list", "dead", 1, lease_ms=200)
    wait_server_past(client, server_ms(client) + 300)
    _, overdue, again = call(client, "list", "w2", 5)
    assert overdue == 1
    assert again == taken  # same id, same entry: now w2's
    assert client.hget(KEYS.taking, taken[0][0]) == b"w2\nu1"
    call(client, "list", "w2", 0, done=[taken[0][0]])
    assert call(client, "list", "w2", 5)[0] == 0


def test_bad_entries_move_to_the_bad_list_and_give_back(client):
    client.lpush(KEYS.start, b"x", b"y")
    _, _, taken = call(client, "list", "w1", 2)
    (id_y, _), (id_x, _) = taken
    call(client, "list", "w1", -1, bad=[id_y], renew=[id_x])
    assert client.lrange(KEYS.bad, 0, -1) == [b"y"]
    _, overdue, again = call(client, "list", "w2", 5)  # given back: overdue at once
    assert (overdue, again) == (1, [(id_x, b"x")])


def test_bad_call_is_refused(client):
    with pytest.raises(redis.ResponseError, match="bad startkey call"):
        call(client, "hash", "w1", 1)
