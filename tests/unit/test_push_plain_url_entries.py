"""The push helper's plain-URL fast path, with no Redis: a plain URL line gives the URL,
payload and fingerprint Scrapy's Request gives, and is refused for the same reasons; only
Scrapy's own fingerprinter takes the fast path (worker/test_push_plain_urls.py pushes)."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_fleet import codec
from scrapy_fleet.commands.push import (
    default_fingerprinter,
    is_default_fingerprinter,
    parse_line,
    plain_url_entry,
)
from scrapy_fleet.errors import PushLineError

#: URLs whose safe and canonical forms differ from the text in every way w3lib knows
VARIED_URLS = [
    "http://h.test/docs/page/000001234.html",
    "http://h.test",                                 # no path: "/" added
    "http://h.test/?",                               # empty query
    "http://h.test/#",                               # empty fragment
    "http://h.test/a?c=3&b=5&b=2&a=50",              # query sorted for the fingerprint
    "http://h.test/a?b=&a=1&a",                      # blank values kept
    "http://h.test/a?q=a+b&r=a%20b&s=%2f%2F",        # spaces, percent-encoding case
    "http://h.test/a#frag",                          # fragment dropped in the fingerprint
    "http://h.test/a?x=1#f?g=2",
    "http://H.Test/UPPER/Case",                      # host lower-cased
    "HTTPS://h.test/Scheme",
    "http://h.test:80/default-port",
    "https://h.test:443/default-port",
    "http://h.test:8080/port",
    "http://h.test:08080/leading-zero-port",
    "http://h.test/user:pa%20ss@userinfo-like/path",  # an @ in the path (credentials: refused)
    "http://[::1]:8080/ipv6",
    "http://[0:0::1]/ipv6-long",
    "http://127.0.0.2:8000/ipv4",
    "http://h.test/a/./b/../c",                      # dot segments
    "http://h.test//double//slashes/",
    "http://h.test/path;params?q=1",
    "http://h.test/a%2Fb%zz%",                       # lone and bad percent signs
    "http://h.test/r\u00e9sum\u00e9?q=\u00e9t\u00e9#\u00e9",  # unicode path, query, fragment
    "http://b\u00fccher.example/\u00fc",             # IDN host
    "http://\u4f8b\u3048.\u30c6\u30b9\u30c8/\u30da\u30fc\u30b8",
    "http://h.test/emoji/\U0001f600",
    "http://h.test/quote'\"<>`{}|\\^",
    "http://h.test/" + "x" * 2000,
    "http://xn--bcher-kva.example/punycode",
    "http://h.test/a?" + "&".join(f"k{i}=v{i}" for i in range(50, 0, -1)),
]


def scrapy_way(line: str, priority: int, dont_filter: bool) -> tuple[str, bytes, bytes]:
    """What a worker has for the line: the Request parse_line builds, its encoded dict and
    Scrapy's default fingerprint of it."""
    request, d = parse_line(line, dont_filter=dont_filter, priority=priority)
    return request.url, codec.encode_dict(d), RequestFingerprinter().fingerprint(request)


@pytest.mark.parametrize("url", VARIED_URLS)
@pytest.mark.parametrize("priority,dont_filter", [(0, False), (7, True), (-3, False)])
def test_a_plain_url_line_gives_what_the_request_gives(url, priority, dont_filter):
    assert plain_url_entry(url, dont_filter=dont_filter, priority=priority) == scrapy_way(
        url, priority, dont_filter)
    # surrounding whitespace of the line is not part of the URL either way
    assert plain_url_entry(f"  {url}\n", priority=priority, dont_filter=dont_filter) == (
        scrapy_way(f"  {url}\n", priority, dont_filter))


def test_the_fingerprint_equals_scrapys_own_function():
    from scrapy.utils.request import fingerprint

    for url in VARIED_URLS:
        assert plain_url_entry(url)[2] == fingerprint(Request(url))


@pytest.mark.parametrize("line", [
    "ftp://example.com/f", "example.com/page", "http:///nohost", "http://exa mple.com/",
    "http://example.com:99999/", "http://example.com/" + "a" * 2100, "http://[::1/",
    "http://[x]/", "http://h.test/\udcfb", "", "   ", "http:h.test/", "mailto:a@b.test",
])
def test_a_bad_plain_line_is_refused_for_the_same_reason(line):
    with pytest.raises(PushLineError) as slow:
        parse_line(line)
    with pytest.raises(PushLineError) as fast:
        plain_url_entry(line)
    assert str(fast.value) == str(slow.value)


def test_only_scrapys_own_fingerprinter_takes_the_fast_path():
    class Subclass(RequestFingerprinter):
        pass

    assert is_default_fingerprinter(default_fingerprinter())
    assert is_default_fingerprinter(RequestFingerprinter(None).fingerprint)
    assert not is_default_fingerprinter(Subclass().fingerprint)
    assert not is_default_fingerprinter(lambda request: b"x" * 20)
