"""FLEET_REDIS_URL: the deployments it names (scrapy_fleet/redis_url.py) and the clients
built for them (redis_client.py)."""

from __future__ import annotations

import warnings

import pytest
import redis
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.sentinel

from scrapy_fleet import redis_client, redis_url
from scrapy_fleet.errors import FleetConfigError, RedisUnavailableError


def test_schemes_name_their_deployment():
    one = redis_url.parse("redis://u:p@h:1/2")
    assert (one.kind, one.tls, one.url) == ("standalone", False, "redis://u:p@h:1/2")
    cluster = redis_url.parse("rediss+cluster://u:p%40w@a:7000,b,[::1]:7002?socket_timeout=2")
    assert (cluster.kind, cluster.tls) == ("cluster", True)
    assert cluster.hosts == (("a", 7000), ("b", 6379), ("::1", 7002))
    assert cluster.url == "rediss://u:p%40w@a:7000?socket_timeout=2"
    sentinel = redis_url.parse(
        "redis+sentinel://:pw@s1:1,s2/mymaster/3?sentinel_password=x%26y&socket_timeout=2")
    assert sentinel.kind == "sentinel" and sentinel.service == "mymaster"
    assert sentinel.hosts == (("s1", 1), ("s2", 26379))
    assert sentinel.sentinel_options == {"password": "x&y"}
    assert sentinel.url == "redis://:pw@sentinel-master/3?socket_timeout=2"


@pytest.mark.parametrize("url,fragment", [
    ("http://h", "redis+cluster://"),
    ("redis+cluster://h:1/3", "Redis Cluster has database 0 only"),
    ("redis+cluster://h:notaport", "a port number"),
    ("redis+sentinel://s1:1", "the monitored master's name"),
    ("redis+sentinel://s1:1/m/x", "a database number"),
    ("redis+sentinel:///m/0", "at least one sentinel"),
    ("redis://h/0?ssl_ca_certs=/etc/hostname", "rediss:// scheme"),
    ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs among none, optional, required"),
    ("rediss://h/0?ssl_ca_certs=/no/such.pem", "no such file"),
    ("rediss://h/0?ssl_certfile=/etc/hostname", "ssl_certfile and ssl_keyfile together"),
    ("redis://:secret@h:99999/0", "bad port"),
])
def test_wrong_urls_are_one_error_without_the_password(url, fragment):
    with pytest.raises(FleetConfigError) as info:
        redis_url.parse(url)
    assert fragment in str(info.value)
    assert str(info.value).startswith("FLEET_REDIS_URL=")
    assert "secret" not in str(info.value)


def test_unverified_only_when_asked():
    assert not redis_url.parse("rediss://h/0").unverified  # verified by default
    assert not redis_url.parse("rediss://h/0?ssl_cert_reqs=required").unverified
    assert redis_url.parse("rediss://h/0?ssl_cert_reqs=none").unverified
    assert redis_url.parse("rediss+cluster://h?ssl_cert_reqs=NONE").unverified


def test_clients_of_each_kind():
    # (a client connects at its first command: none of these needs a server)
    standalone = redis_client.make_client("redis://127.0.0.1:1/0")
    assert isinstance(standalone, redis.Redis) and not redis_client.is_cluster(standalone)
    assert redis_client.node_of(standalone, "k") == {}
    standalone.close()
    sentinel = redis_client.make_client("redis+sentinel://127.0.0.1:1/mymaster/0")
    assert isinstance(sentinel.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert sentinel.connection_pool.service_name == "mymaster"
    acluster = redis_client.make_client("redis+cluster://127.0.0.1:1", is_async=True)
    assert isinstance(acluster, redis.asyncio.cluster.RedisCluster)
    # a sync cluster client reads the slot map when it is made: one clear error
    with pytest.raises(RedisUnavailableError, match="cannot reach Redis at redis\\+cluster"):
        redis_client.make_client("redis+cluster://127.0.0.1:1", timeout=0.5)
    # no retries inside the client: callers retry with their operation ids
    tls = redis_client.make_client("rediss://127.0.0.1:1/0?ssl_ca_certs=/etc/hostname")
    kwargs = tls.connection_pool.connection_kwargs
    assert kwargs["ssl_ca_certs"] == "/etc/hostname" and kwargs["retry"]._retries == 0


def test_asyncio_clients_get_an_asyncio_retry_without_a_warning():
    # a sync redis.retry.Retry given to an asyncio client: redis-py 8.2 converts it with a
    # UserWarning, which under PYTHONWARNINGS=error killed every worker at its first call
    # (RuntimeError: Scraper slot not assigned); 5.0.1 kept the sync one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = redis_client.make_client("redis://127.0.0.1:1/0", is_async=True)
        sentinel = redis_client.make_client("redis+sentinel://127.0.0.1:1/mymaster/0",
                                            is_async=True)
        cluster = redis_client.make_client("redis+cluster://127.0.0.1:1", is_async=True)
    sentinels = sentinel.connection_pool.sentinel_manager.sentinels
    retries = [plain.connection_pool.connection_kwargs["retry"],
               sentinel.connection_pool.connection_kwargs["retry"],
               sentinels[0].connection_pool.connection_kwargs["retry"], cluster.retry]
    assert [type(r) for r in retries] == [redis.asyncio.retry.Retry] * 4
    assert [r._retries for r in retries] == [0] * 4
