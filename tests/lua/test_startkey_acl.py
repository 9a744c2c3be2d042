"""The ACL rule of a crawl whose spider reads a scrapy-redis start key (issue 36): a worker's
rule reaches that start key and its ``:fleet:*`` keys, with lua/startkey.lua's commands, and no
other key; a start key with glob characters matches itself only.  Checked against a real
Redis's ACLs."""

from __future__ import annotations

import pytest
import redis

from scrapy_fleet import acl, lua
from scrapy_fleet.keys.fleet import StartKeyKeys


def take(url: str, start: str, kind: str = "list") -> int:
    """One step of lua/startkey.lua as the user of *url*: entries taken."""
    client = redis.Redis.from_url(url)
    try:
        _, _, taken = lua.load(client, "startkey.lua")(
            keys=StartKeyKeys(start).call_keys(), args=[kind, "w1", 60000, 5, 0, 0])
        return len(taken) // 2
    finally:
        client.close()


def test_a_worker_rule_with_the_start_key_reaches_it_and_its_keys_only(acl_users, redis_url):
    producer = redis.Redis.from_url(redis_url)
    for key in ("myspider:start_urls", "other:start_urls", "a*b:start", "axxb:start"):
        producer.lpush(key, "http://h.test/1", "http://h.test/2")
    producer.sadd("set:start", "http://h.test/3")
    rule = acl.acl_rule("worker", crawl_id="myspider",
                        start_keys=("myspider:start_urls", "a*b:start", "set:start"))
    assert "~myspider:start_urls ~{myspider:start_urls}:fleet:*" in rule
    assert "~a\\*b:start ~{a\\*b:start}:fleet:*" in rule
    url = acl_users("sk-worker", rule)
    assert take(url, "myspider:start_urls") == 2
    assert take(url, "a*b:start") == 2
    assert take(url, "set:start", "set") == 1  # (SPOP, SCARD: startkey.lua's set commands)
    for other in ("other:start_urls", "axxb:start"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            take(url, other)
    assert producer.llen("axxb:start") == 2 and producer.llen("other:start_urls") == 2
    # without the start key the crawl's rule reaches none
    plain = acl_users("sk-plain", acl.acl_rule("worker", crawl_id="myspider"))
    with pytest.raises(redis.exceptions.NoPermissionError):
        take(plain, "myspider:start_urls")


def test_a_monitor_rule_gets_no_start_key():
    assert acl.acl_rule("monitor", crawl_id="m", start_keys=("m:start_urls",)) == \
        acl.acl_rule("monitor", crawl_id="m")
    admin = acl.acl_rule("admin", crawl_id="m", start_keys=("m:start_urls",))
    assert "~m:start_urls" in admin and "+spop" in admin and "+zremrangebyrank" in admin
