"""Failure records in the frontier (lua/failed.lua, lua/failed_retry.lua) against a real
redis-server: recorded with their acknowledgement once even when the call is replayed,
capped oldest first, a bad record refused before any write, retried once at the head of
its priority (worker/test_failed.py runs the retry command and a real crawl's failures)."""

from __future__ import annotations

import msgpack
import pytest
import redis

from scrapy_fleet import codec
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams


def _entry(url: str, priority: int = 0) -> tuple[bytes, int, bytes, int, str]:
    payload = codec.encode_dict({"url": url, "priority": priority})
    return (b"", priority, payload, 0, "h.test")


def _record(url: str, reason: str = "http/500") -> bytes:
    return FailureRecord(url=url, method="GET", reason=reason, status=500, attempts=3,
                         worker="w", host="h.test").encode()


def _fail(admin: FrontierAdmin, urls: list[str], reason: str = "http/500",
          op_id: str | None = None) -> None:
    leased = admin.call(CallBatch(take=len(urls)), worker="w").leased
    by_url = {codec.decode_dict(e.payload)["url"]: e for e in leased}
    acks = [(by_url[u].entry_id, by_url[u].token, _record(u, reason)) for u in urls]
    admin.call(CallBatch(acks=acks), worker="w", op_id=op_id)


def test_failure_is_recorded_with_its_ack_once_even_when_the_call_is_replayed(redis_url):
    admin = FrontierAdmin(redis_url, "rec")
    admin.push([_entry("http://h.test/a")])
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    batch = CallBatch(acks=[(lease.entry_id, lease.token, _record("http://h.test/a"))])
    first = admin.call(batch, worker="w", op_id="op-1")
    again = admin.call(batch, worker="w", op_id="op-1")  # a resent call after a lost reply
    assert first.acked == again.acked == 1
    counters = admin.status()["counters"]
    assert counters["failed"] == 1 and counters["acked"] == 1
    assert failures.failed_counts(admin.client, admin.keys) == {"http/500": 1}
    ((rid, rec),) = list(failures.failed_records(admin.client, admin.keys))
    assert rid == lease.entry_id
    assert (rec.url, rec.method, rec.reason, rec.status, rec.attempts, rec.worker) == (
        "http://h.test/a", "GET", "http/500", 500, 3, "w")
    assert rec.at > 0 and codec.decode_dict(rec.data)["url"] == "http://h.test/a"
    assert admin.status()["queued"] == 0  # acknowledged: gone from the frontier


def test_failed_records_are_capped_oldest_first_and_counted(redis_url):
    admin = FrontierAdmin(redis_url, "cap", params=FrontierParams(failed_max=3))
    urls = [f"http://h.test/{i}" for i in range(5)]
    admin.push([_entry(u) for u in urls])
    for u in urls:  # one failure per call: distinct server times, oldest first
        _fail(admin, [u], reason="download/TimeoutError" if u.endswith("4") else "http/500")
    kept = [rec.url for _, rec in failures.failed_records(admin.client, admin.keys)]
    assert kept == urls[2:]
    assert failures.failed_counts(admin.client, admin.keys) == {
        "download/TimeoutError": 1, "http/500": 2}
    counters = admin.status()["counters"]
    assert (counters["failed"], counters["failed_trimmed"]) == (5, 2)


def test_bad_failure_record_is_refused_before_any_write(redis_url):
    admin = FrontierAdmin(redis_url, "badrec")
    admin.push([_entry("http://h.test/a")])
    lease = admin.call(CallBatch(take=1), worker="w").leased[0]
    before = sorted(admin.client.keys("*"))
    with pytest.raises(redis.ResponseError, match="bad failure record"):
        admin.call(CallBatch(acks=[(lease.entry_id, lease.token,
                                    msgpack.packb({"url": "x"}))]), worker="w")
    assert sorted(admin.client.keys("*")) == before
    assert admin.status()["leased"] == 1


def test_retry_pushes_each_record_once_at_the_head_of_its_priority(redis_url):
    admin = FrontierAdmin(redis_url, "again")
    admin.push([_entry("http://h.test/bad"), _entry("http://h.test/x")])
    _fail(admin, ["http://h.test/bad"])
    admin.push([_entry("http://h.test/y")])  # queued after x: the retried one goes first
    report = failures.retry(admin.client, admin.keys, redis_url, reason="http/500")
    assert (report.retried, report.gone) == (1, 0)
    again = failures.retry(admin.client, admin.keys, redis_url, reason="http/500")
    assert again.retried == 0  # nothing left to retry: pushed once
    assert failures.failed_counts(admin.client, admin.keys) == {}
    leased = admin.call(CallBatch(take=3), worker="w").leased
    assert [codec.decode_dict(e.payload)["url"] for e in leased] == [
        "http://h.test/bad", "http://h.test/x", "http://h.test/y"]
    counters = admin.status()["counters"]
    assert (counters["failed"], counters["retried"], counters["pushed"]) == (1, 1, 4)
