"""Records of requests the codec could not store, riding on the acknowledgement of the page
that yielded them (lua/step_ack.lua, lua/failed.lua), against a real redis-server: recorded
once even when the call is replayed, a bad record refused before any write
(worker/test_sink_failures.py runs real crawls)."""

from __future__ import annotations

import msgpack
import pytest
import redis

from scrapy_fleet import codec
from scrapy_fleet.failures import admin as failures
from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.protocol import CallBatch


def _unstorable(url: str, parent: str = "") -> bytes:
    return FailureRecord(url=url, method="GET", reason="codec/ValueError", attempts=0,
                         worker="w", host="other.test", parent=parent).encode()


def test_unstorable_records_ride_on_the_ack_once_even_when_the_call_is_replayed(redis_url):
    """Two links a page yielded that could not be stored ride on its acknowledgement, one
    request without a parent on the call: three records, written once though the call is
    replayed; a link's record keeps the page's request (retry fetches the page, once for both,
    under the page's host), the other none (retry leaves it)."""
    admin = FrontierAdmin(redis_url, "unst")
    try:
        page = "http://h.test/page"
        admin.push([(b"", 0, codec.encode_dict({"url": page}), 0, "h.test")])
        lease = admin.call(CallBatch(take=1), worker="w").leased[0]
        batch = CallBatch(acks=[(lease.entry_id, lease.token, b"",
                                 [_unstorable("http://other.test/1", page),
                                  _unstorable("http://other.test/2", page)])],
                          unstorable=[_unstorable("http://other.test/start")])
        first = admin.call(batch, worker="w", op_id="op-u")
        again = admin.call(batch, worker="w", op_id="op-u")  # resent after a lost reply
        assert first.acked == again.acked == 1
        counters = admin.status()["counters"]
        assert (counters["failed"], counters["unstorable"], counters["acked"]) == (3, 3, 1)
        records = dict(failures.failed_records(admin.client, admin.keys))
        by_url = {rec.url: (rid, rec) for rid, rec in records.items()}
        assert by_url["http://other.test/1"][0] == lease.entry_id + "/1"
        assert by_url["http://other.test/2"][0] == lease.entry_id + "/2"
        assert by_url["http://other.test/start"][0].startswith("u")
        assert codec.decode_dict(by_url["http://other.test/1"][1].data)["url"] == page
        assert by_url["http://other.test/1"][1].parent == page
        assert by_url["http://other.test/start"][1].data == b""
        assert failures.failed_counts(admin.client, admin.keys) == {"codec/ValueError": 3}

        report = failures.retry(admin.client, admin.keys, redis_url, reason="codec/ValueError")
        assert (report.retried, report.merged, report.unstorable, report.unreadable) == (
            1, 1, 1, 0)
        # the page that found them, once, counted under its own host
        assert admin.client.hgetall(admin.keys.hostq) == {b"h.test": b"1"}
        queued = [codec.decode_dict(e.payload)["url"]
                  for e in admin.call(CallBatch(take=10), worker="w").leased]
        assert queued == [page]
        assert [rec.url for _, rec in failures.failed_records(admin.client, admin.keys)] == [
            "http://other.test/start"]
    finally:
        admin.close()


def test_bad_unstorable_record_is_refused_before_any_write(redis_url):
    admin = FrontierAdmin(redis_url, "unstbad")
    try:
        admin.push([(b"", 0, codec.encode_dict({"url": "http://h.test/a"}), 0, "h.test")])
        lease = admin.call(CallBatch(take=1), worker="w").leased[0]
        before = sorted(admin.client.keys("*"))
        for batch in (CallBatch(acks=[(lease.entry_id, lease.token, b"",
                                       [msgpack.packb({"url": "x"})])]),
                      CallBatch(unstorable=[msgpack.packb({"url": "x"})])):
            with pytest.raises(redis.ResponseError, match="bad failure record"):
                admin.call(batch, worker="w")
            assert sorted(admin.client.keys("*")) == before
        assert admin.status()["leased"] == 1
    finally:
        admin.close()
