"""frontier/bloom_read.py (the Bloom filter read with plain reads, for ``scrapy fleet url``)
against the filter lua/bloom.lua wrote, with a real redis-server: every key the frontier call
added is found, in both bit layouts (blocked, and the classic layout of filters written before
it) and across slices; keys never added are found at about the filter's false-positive
rate."""

from __future__ import annotations

import os

import pytest
import redis

from scrapy_fleet import codec
from scrapy_fleet.frontier import bloom_read
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import FrontierParams


@pytest.mark.parametrize("layout", ["blocked", "classic"])
def test_the_read_finds_every_added_key_in_every_slice(redis_url, layout):
    crawl = f"bloomread-{layout}"
    admin = FrontierAdmin(redis_url, crawl, params=FrontierParams(
        bloom_capacity=500, bloom_error_rate=0.01))
    client = redis.Redis.from_url(redis_url)
    if layout == "classic":  # (a filter of layout 1: its metadata has no field v)
        client.hset(admin.keys.bloom_meta,
                    mapping={"n0": 500, "p": 0.01, "slices": 1, "c0": 0})
    added = [os.urandom(12) for _ in range(2000)]  # 500 + 1000 + ...: three slices
    for start in range(0, len(added), 250):
        admin.push([(k, 0, codec.encode_dict({"url": f"http://h.test/{start + i}"}), 0, "h.test")
                    for i, k in enumerate(added[start:start + 250])])
    meta = client.hgetall(admin.keys.bloom_meta)
    assert int(meta[b"slices"]) == 3
    assert (b"v" in meta) is (layout == "blocked")
    assert all(bloom_read.contains(client, admin.keys, k) for k in added)
    others = sum(bloom_read.contains(client, admin.keys, os.urandom(12)) for _ in range(4000))
    assert others < 4000 * 0.02 * 2  # compound rate < 2p (Almeida et al.): a loose bound
    assert not bloom_read.contains(client, FrontierAdmin(redis_url, "none").keys, added[0])
