"""The push helper's fast paths: a plain URL line without a Request (same URL, payload and
fingerprint as Scrapy's), and the frontier call that overlaps the reading of the next batch
(order and refusals kept)."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_fleet import codec
from scrapy_fleet.commands.push import (
    default_fingerprinter,
    parse_line,
    push_lines,
)
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.protocol import CallBatch, FrontierParams

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


def test_a_project_fingerprinter_is_used_for_plain_lines(redis_url):
    seen = []

    def project_fingerprint(request: Request) -> bytes:
        seen.append(request.url)
        return hashlib.sha1(request.url.encode()).digest()  # not Scrapy's fingerprint

    admin = FrontierAdmin(redis_url, "projfp")
    report = push_lines(admin, [(1, "http://h.test/a"), (2, "http://H.test/a#x")],
                        project_fingerprint)
    assert seen == ["http://h.test/a", "http://h.test/a#x"]
    assert (report.pushed, report.duplicates) == (2, 0)  # Scrapy's would call them one


def test_pushed_lines_are_duplicates_of_the_requests_a_worker_makes(redis_url):
    """The Bloom keys the push helper writes (fast path for plain lines, the Request for JSON
    lines with methods and bodies) are the ones a worker computes for the same requests."""
    json_lines = [
        json.dumps({"url": "http://h.test/api?b=2&a=1", "method": "POST", "body": "x=1"}),
        json.dumps({"url": "http://h.test/api", "method": "put", "body": "h\u00e9"}),
        json.dumps({"url": "http://h.test/r\u00e9sum\u00e9#top", "priority": 3}),
        json.dumps({"url": "http://h.test/v#keep", "meta": {"verbatim_url": True}}),
    ]
    lines = list(enumerate(VARIED_URLS + json_lines, 1))
    admin = FrontierAdmin(redis_url, "samefp")
    first = push_lines(admin, lines, default_fingerprinter())
    fingerprint = RequestFingerprinter().fingerprint
    worker_way = []
    for _, line in lines:
        request, d = parse_line(line)
        worker_way.append((bloom_key(fingerprint(request)), 0, codec.encode_dict(d), 0, "h"))
    # some lines are one request to Scrapy ("http://h.test", "http://h.test/?", ...)
    assert first.rejected == 0
    assert first.pushed == len({key for key, *_ in worker_way}) < len(lines)
    assert first.pushed + first.duplicates == len(lines)
    again = admin.push(worker_way)
    assert (again.pushed, again.duplicates) == (0, len(lines))


class Recorder:
    """A real FrontierAdmin whose calls are recorded, with a worker that drains the
    frontier (lease and acknowledge, real frontier calls) whenever the push helper looks at
    its size while waiting for room."""

    def __init__(self, admin: FrontierAdmin, read: list[int]) -> None:
        self.admin = admin
        self.read = read  # read[0]: lines read from the input so far
        self.calls: list[tuple[int, list[str], list[int]]] = []
        self.params = admin.params

    def push(self, entries: list[tuple[Any, ...]]) -> Any:
        at_start = self.read[0]
        result = self.admin.push(entries)
        urls = [codec.decode_dict(e[2])["url"] for e in entries]
        self.calls.append((at_start, urls, list(result.refused)))
        return result

    def size(self) -> int:
        size = self.admin.size()
        leased = self.admin.call(CallBatch(take=size), worker="drain").leased
        self.admin.call(CallBatch(acks=[(e.entry_id, e.token) for e in leased]),
                        worker="drain")
        return size


def counted(lines: list[tuple[int, str]], read: list[int]) -> Any:
    for item in lines:
        read[0] += 1
        yield item


def test_the_call_in_flight_overlaps_the_reading_of_the_next_batch(redis_url):
    lines = [(n, f"http://h{n % 7}.test/{n}") for n in range(1, 101)]
    read = [0]
    admin = Recorder(FrontierAdmin(redis_url, "overlap"), read)
    report = push_lines(admin, counted(lines, read), default_fingerprinter(),  # type: ignore
                        batch=10)
    assert report.pushed == 100
    # each call had started when its own batch, and not yet the next one, had been read:
    # the next batch is read while the call is in flight (not before the call was sent)
    assert [at for at, _, _ in admin.calls] == [10 * (k + 1) for k in range(10)]
    assert [u for _, urls, _ in admin.calls for u in urls] == [u for _, u in lines]


def test_refused_lines_are_pushed_again_first_and_in_order(redis_url):
    lines = [(n, f"http://h{n}.test/p") for n in range(1, 61)]
    read = [0]
    admin = Recorder(FrontierAdmin(redis_url, "refusals",
                                   params=FrontierParams(queue_max=15)), read)
    report = push_lines(admin, counted(lines, read), default_fingerprinter(),  # type: ignore
                        batch=10, low_watermark=5, poll=0.01)
    assert (report.pushed, report.rejected, report.stopped_full) == (60, 0, False)
    assert any(refused for _, _, refused in admin.calls)
    accepted = [u for _, urls, refused in admin.calls
                for i, u in enumerate(urls) if i not in refused]
    assert accepted == [u for _, u in lines]  # each line once, in the order of the input
    for (_, urls, refused), (_, next_urls, _) in itertools.pairwise(admin.calls):
        if refused:  # the refused ones head the next call, before the batch read meanwhile
            assert next_urls[:len(refused)] == [urls[i] for i in refused]
