"""The worker's Bloom keys from the URL alone (frontier/fingerprint.py) are Scrapy's bytes."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter, fingerprint
from scrapy.utils.test import get_crawler
from w3lib.url import canonicalize_url

from scrapy_fleet.frontier import fingerprint as fast
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.dupefilter import RedisBloomDupeFilter

URLS = [
    "http://a.test/x?b=2&a=1",
    "http://a.test/x?a=1&b=2",
    "http://a.test/x?a=1&b=2#frag",
    "HTTP://A.Test:80/Path/../x/./y",
    "https://a.test:8443/p?q=a+b&q=c%20d&empty=",
    "http://a.test/caf\u00e9/\u00fcber?k=\u00e9t\u00e9",
    "http://b\u00fccher.example/x",
    "http://a.test/%7Euser/a%2Fb?x=%41",
    "http://a.test/sp ace/<tag>?\"q\"",
    "http://127.0.0.2:41391/site/p/17.html",
    "http://a.test/?",
    "http://a.test/x;param?y#z",
    "http://a.test/\\back\\slash",
]


def _filter(**settings: object) -> RedisBloomDupeFilter:
    crawler = get_crawler(settings_dict={"FLEET_REDIS_URL": "redis://127.0.0.1:1/0",
                                         **settings})
    return RedisBloomDupeFilter.from_crawler(crawler)


@pytest.mark.parametrize("url", URLS)
def test_default_fingerprint_is_scrapys(url):
    request = Request(url)
    assert fast.default_fingerprint(canonicalize_url(request.url)) == fingerprint(request)
    assert fast.url_bloom_key(request.url) == bloom_key(fingerprint(request))


def test_dupefilter_keys_equal_scrapys_and_take_the_url_path_for_plain_gets():
    df = _filter()
    assert df._by_url
    requests = [Request(u) for u in URLS]
    # not keyed by URL alone: a body, another method, verbatim_url (Scrapy keeps the URL
    # as written then), a GET with a body
    slow = [Request(URLS[0], method="POST", body=b"a=1"), Request(URLS[0], method="HEAD"),
            Request(URLS[2], meta={"verbatim_url": True}), Request(URLS[3], body=b"x"),
            Request(URLS[0], method="POST")]
    fast.url_bloom_key.cache_clear()
    for request in requests + slow:
        assert df.bloom_key(request) == bloom_key(fingerprint(request)), request
    assert [fast.fast_bloom_key(r) is not None for r in slow] == [False] * len(slow)
    info = fast.url_bloom_key.cache_info()
    # every plain GET went through url_bloom_key: one miss per distinct URL, none for the rest
    assert info.misses == len(URLS) and info.hits == 0
    for request in requests:  # the same URLs again: remembered
        assert df.bloom_key(Request(request.url)) == bloom_key(fingerprint(request))
    assert fast.url_bloom_key.cache_info().hits == len(URLS)
    # verbatim_url changes Scrapy's fingerprint, and so the key (a meta key of newer Scrapy,
    # not in 2.16: before, the request is fingerprinted as any other, checked above)
    if fingerprint(slow[2]) != fingerprint(Request(URLS[2])):
        assert df.bloom_key(slow[2]) != df.bloom_key(Request(URLS[2]))


class HeaderFingerprinter(RequestFingerprinter):
    """A project's fingerprinter: includes a header, so the URL alone does not decide."""

    def fingerprint(self, request: Request) -> bytes:
        return fingerprint(request, include_headers=["X-Lang"])


def test_a_projects_fingerprinter_is_used_as_is():
    df = _filter(REQUEST_FINGERPRINTER_CLASS=HeaderFingerprinter)
    assert not df._by_url
    de = Request(URLS[0], headers={"X-Lang": "de"})
    fr = Request(URLS[0], headers={"X-Lang": "fr"})
    assert df.bloom_key(de) == bloom_key(fingerprint(de, include_headers=["X-Lang"]))
    assert df.bloom_key(de) != df.bloom_key(fr)  # the URL path would have made them one
    assert fast.url_bloom_key(URLS[0]) not in (df.bloom_key(de), df.bloom_key(fr))


def test_unparsable_url_raises_as_scrapy_does():
    request = Request("http://a.test/x")
    request._url = "http://[::1/x"  # what no Request would take: canonicalize_url refuses it
    with pytest.raises(ValueError):
        fingerprint(request)
    with pytest.raises(ValueError):
        _filter().bloom_key(request)
