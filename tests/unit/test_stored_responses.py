"""A stored response (FLEET_ROLE stages, the response queue's records), with no Redis: round
trips of each response class, corrupt or foreign records are decode errors
(e2e/test_stages.py runs fetch and parse workers)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse, Response, TextResponse, XmlResponse

from scrapy_fleet.errors import RequestDecodeError
from scrapy_fleet.stages import records

CLASSES = ["scrapy.http.request.Request"]


@pytest.mark.parametrize("cls, body", [
    (HtmlResponse, b"<html><title>t</title>" + b"<p>x</p>" * 500 + b"</html>"),
    (XmlResponse, b"<?xml version='1.0'?><a/>"),
    (TextResponse, b"plain"),
    (Response, bytes(range(256)) * 8),
])
def test_stored_response_round_trip(cls: type[Response], body: bytes) -> None:
    request = Request("http://a.test/p", meta={"depth": 2, "k": [1, "x"]}, priority=3)
    response = cls(url="http://a.test/p?r=1", status=203, body=body, request=request,
                   headers={"Content-Type": "text/html; charset=utf-8", "X-Two": ["a", "b"]},
                   flags=["cached"], protocol="HTTP/1.1")
    payload = records.encode(response, None)
    assert records.is_stored(payload)
    if len(body) >= records.MIN_COMPRESS:
        assert len(payload) < len(body)  # compressed (zstd)
    back_request, stored = records.decode(payload, None, CLASSES)
    back = stored.response(back_request)
    assert type(back) is cls
    assert (back.url, back.status, back.body, back.protocol) == (
        response.url, 203, body, "HTTP/1.1")
    assert back.headers.getlist("X-Two") == [b"a", b"b"]
    assert back.flags == ["cached", "fleet-stored"]
    assert back.request is back_request
    assert back_request.meta == {"depth": 2, "k": [1, "x"]}
    assert back_request.priority == 3


def test_corrupt_or_foreign_records_are_decode_errors() -> None:
    import msgpack

    def record(**fields: Any) -> bytes:
        base: dict[str, Any] = {"q": b"\x01" + msgpack.packb({"u": "http://a.test/"}),
                                "u": "http://a.test/", "s": 200, "h": [], "b": b"",
                                "z": "", "c": "scrapy.http.response.Response"}
        base.update(fields)
        return b"\x02" + msgpack.packb(base, use_bin_type=True)

    assert records.decode(record(), None, CLASSES)[1].status == 200
    for bad, reason in ((record(c="os.system"), "not one of scrapy.http"),
                        (record(c="scrapy.http.request.Request"), "not a Response class"),
                        (record(z="gzip"), "unknown body compression"),
                        (record(z="zstd", b=b"not zstd"), "corrupt stored response body"),
                        (record(s="x"), "corrupt stored response"),
                        (b"\x02\xc1", "corrupt stored response")):
        with pytest.raises(RequestDecodeError, match=reason):
            records.decode(bad, None, CLASSES)
