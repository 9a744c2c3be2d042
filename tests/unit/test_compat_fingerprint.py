"""scrapy-redis's fingerprint (compat/fingerprint.py): the bytes its dupefilter stores in hex,
which Scrapy's own fingerprinter never gives (the import's check)."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_fleet.compat.fingerprint import (
    ScrapyRedisFingerprinter,
    matches,
    scrapy_redis_fingerprint,
)

REQUESTS = [Request("http://h.test/a?b=2&a=1#f"), Request("http://h.test/", method="POST",
                                                           body=b"x=1"),
            Request("http://h.test/%7Euser/caf\u00e9")]


@pytest.mark.parametrize("request_", REQUESTS)
def test_same_hex_as_scrapy_redis(request_):
    dupefilter = pytest.importorskip("scrapy_redis.dupefilter",
                                     reason="scrapy-redis is not installed")
    theirs = dupefilter.RFPDupeFilter(server=None, key="k").request_fingerprint(request_)
    assert scrapy_redis_fingerprint(request_).hex() == theirs


def test_only_the_scrapy_redis_fingerprinter_matches():
    assert matches(ScrapyRedisFingerprinter().fingerprint)
    assert not matches(RequestFingerprinter().fingerprint)
