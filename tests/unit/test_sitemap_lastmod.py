"""Sitemaps' <lastmod> on the worker's side (recrawl/sitemaps.py, issue 22): the W3C datetime
formats sitemaps use, a bad lastmod ignored and counted, a sitemap signed by its bytes, a push
with a lastmod never left out as a known duplicate, and the place a record is indexed by."""

from __future__ import annotations

import datetime

import pytest
from scrapy.http import HtmlResponse, XmlResponse

from scrapy_fleet.frontier.dupecache import DupeCache
from scrapy_fleet.frontier.protocol import CallBatch
from scrapy_fleet.frontier.records import Push
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.recrawl.record import revisit_record
from scrapy_fleet.recrawl.schedule import State
from scrapy_fleet.recrawl.signature import response_signature
from scrapy_fleet.recrawl.sitemaps import FUTURE_SLACK, parse_lastmod, sitemap_lastmods

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.timezone.utc).timestamp()


def utc(*args: int) -> int:
    return int(datetime.datetime(*args, tzinfo=datetime.timezone.utc).timestamp())


@pytest.mark.parametrize(("text", "expected"), [
    ("2026", utc(2026, 1, 1)),
    ("2026-11", utc(2026, 11, 1)),
    ("2026-11-30", utc(2026, 11, 30)),
    (" 2026-11-30\n", utc(2026, 11, 30)),
    ("2026-11-30T10:20Z", utc(2026, 11, 30, 10, 20)),
    ("2026-11-30T10:20:30Z", utc(2026, 11, 30, 10, 20, 30)),
    ("2026-11-30T10:20:30.45Z", utc(2026, 11, 30, 10, 20, 30)),
    ("2026-11-30T10:20:30+01:00", utc(2026, 11, 30, 9, 20, 30)),
    ("2026-11-30T10:20:30-05:00", utc(2026, 11, 30, 15, 20, 30)),
    ("2026-11-30T10:20:30+0100", utc(2026, 11, 30, 9, 20, 30)),  # (no colon: seen in the wild)
    ("2026-11-30T10:20:30+01", utc(2026, 11, 30, 9, 20, 30)),
    ("2026-11-30 10:20:30", utc(2026, 11, 30, 10, 20, 30)),  # (a space, no zone: UTC)
    ("2026-11-30t10:20:30z", utc(2026, 11, 30, 10, 20, 30)),
])
def test_w3c_datetimes_and_what_sitemaps_write_besides_are_read(text, expected):
    assert parse_lastmod(text, NOW) == expected


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-13-01", "2026-02-30",
                                  "2026-11-30T25:00Z", "30/11/2026", "2026-11-30T10:20:30+25:00",
                                  "1969-12-31", "2026-11-30T10Z", "2026-11-30T10:20:30 PST"])
def test_a_bad_lastmod_is_none_never_an_error(text):
    assert parse_lastmod(text, NOW) is None


def test_a_lastmod_more_than_a_day_ahead_is_ignored():
    assert parse_lastmod("2026-12-03T11:59:00Z", NOW) == int(NOW) + FUTURE_SLACK - 60
    assert parse_lastmod("2026-12-03T12:01:00Z", NOW) is None


def test_a_sitemaps_lastmods_by_request_url_and_the_invalid_ones_counted():
    body = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <url><loc>http://a.test/p 1.html</loc><lastmod>2026-11-30</lastmod></url>
  <url><loc>http://a.test/none.html</loc></url>
  <url><loc>http://a.test/bad.html</loc><lastmod>soon</lastmod></url>
</urlset>"""
    found, invalid = sitemap_lastmods(body)
    assert found == {"http://a.test/p%201.html": utc(2026, 11, 30)}  # as Request(loc).url
    assert invalid == 1
    index = b"""<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sitemap><loc>http://a.test/s1.xml</loc><lastmod>2026-11-29T08:00:00Z</lastmod></sitemap>
</sitemapindex>"""
    assert sitemap_lastmods(index) == ({"http://a.test/s1.xml": utc(2026, 11, 29, 8)}, 0)
    assert sitemap_lastmods(b"not xml at all") == ({}, 0)


def test_a_sitemap_whose_lastmod_alone_changed_is_a_new_version():
    """The text's simhash leaves out words with digits (dates): a sitemap, whose change is
    often a date alone, is signed by its bytes."""
    def xml(date: str) -> XmlResponse:
        return XmlResponse("http://a.test/sitemap.xml", body=(
            "<urlset xmlns='http://www.sitemaps.org/schemas/sitemap/0.9'><url><loc>"
            f"http://a.test/news/story</loc><lastmod>{date}</lastmod></url></urlset>").encode())

    assert response_signature(xml("2026-11-30")) != response_signature(xml("2026-12-01"))
    assert response_signature(xml("2026-11-30")) == response_signature(xml("2026-11-30"))

    def html(date: str) -> HtmlResponse:  # (a page's date is noise only when near=True)
        return HtmlResponse("http://a.test/p", body=(
            "<html><body><p>the river stone market garden winter paper window</p>"
            f"<p>updated {date}</p></body></html>").encode())

    assert response_signature(html("2026-11-30"), near=True) == response_signature(
        html("2026-12-01"), near=True)
    assert response_signature(html("2026-11-30")) != response_signature(html("2026-12-01"))


def test_a_push_with_a_lastmod_is_never_left_out_as_a_known_duplicate():
    cache = DupeCache(100)
    cache.gen = "g1"
    cache._keys[b"k" * 12] = None
    batch = CallBatch(pushes=[Push(b"k" * 12, 0, b"p", 0, "h", 0, 0),
                              Push(b"k" * 12, 0, b"p", 0, "h", 0, 1_700_000_000)])
    sent, kept, left_out = cache.split(batch)
    assert (kept, left_out) == ([1], 1) and sent.pushes == [batch.pushes[1]]


def test_a_revisit_record_carries_its_bloom_key_and_last_fetch_and_its_place_key():
    from scrapy import Request

    from scrapy_fleet import codec

    payload = codec.encode(Request("http://a.test/p"))
    state = State(fetched=1_700_000_000, interval=60).to_meta()
    assert len(revisit_record(payload, state, 60, "a.test", 0)) == 4  # (without a key)
    record = revisit_record(payload, state, 60, "a.test", 0, b"\x01\x02" + b"k" * 10)
    assert record[4:] == [b"\x01\x02" + b"k" * 10, 1_700_000_000]
    keys = CrawlKeys("fleet", "c")
    assert keys.revisit_place(b"\x01\x02" + b"k" * 10) == ("fleet:{c}:rvx:0102", b"k" * 6)


def test_the_sitemap_is_noted_as_the_sitemap_spider_reads_and_parses_it():
    """The entries are those of the spider's own parse (its body: gunzipped within
    DOWNLOAD_MAXSIZE...), noted while it parses: nothing read or parsed a second time."""
    import gzip

    from scrapy.http import Request, Response, TextResponse
    from scrapy.spiders import SitemapSpider, Spider
    from scrapy.utils.test import get_crawler

    from scrapy_fleet import engine_hooks

    crawler = get_crawler(SitemapSpider, {"DOWNLOAD_MAXSIZE": 1000})
    spider = SitemapSpider.from_crawler(crawler, name="s")
    noted: list[tuple[str, str]] = []
    assert engine_hooks.on_sitemap_entries(spider, lambda r, e: noted.append((r.url, e["loc"])))
    assert engine_hooks.on_sitemap_entries(spider, lambda r, e: None)  # (once: kept)

    def parsed(response: Response) -> list[tuple[str, str]]:
        noted.clear()
        list(spider._parse_sitemap(response))
        return list(noted)

    xml = b"<urlset><url><loc>http://a.test/</loc></url></urlset>"
    assert parsed(XmlResponse("http://a.test/s", body=xml)) == [("http://a.test/s",
                                                                 "http://a.test/")]
    # (responses of requests, as a crawl's are: the spider reads its download_maxsize meta)
    zipped = Response("http://a.test/s.gz", body=gzip.compress(xml),
                      request=Request("http://a.test/s.gz"))
    assert parsed(zipped) == [("http://a.test/s.gz", "http://a.test/")]
    big = Response("http://a.test/s.gz", body=gzip.compress(b" " * 5000),
                   request=Request("http://a.test/s.gz"))
    assert parsed(big) == []  # past DOWNLOAD_MAXSIZE: not read
    assert parsed(TextResponse("http://a.test/s.xml", body=xml)) == [("http://a.test/s.xml",
                                                                      "http://a.test/")]
    assert parsed(HtmlResponse("http://a.test/p.html", body=b"<p>x</p>")) == []
    assert parsed(TextResponse("http://a.test/robots.txt", body=b"")) == []
    plain = Spider.from_crawler(get_crawler(Spider), name="p")
    assert not engine_hooks.on_sitemap_entries(plain, lambda r, e: None)


def test_a_gzipped_sitemap_over_the_warning_size_is_warned_of_once(caplog):
    """The middleware reads the spider's own parse: one gunzip, one warning (it warned twice
    when it read the body again), and the lastmods still reach the requests."""
    import gzip
    import logging

    from scrapy.http import Request, Response
    from scrapy.spiders import SitemapSpider
    from scrapy.utils.test import get_crawler

    from scrapy_fleet.recrawl.sitemaps import LASTMOD_META_KEY, FleetSitemapLastmod

    crawler = get_crawler(SitemapSpider, {"DOWNLOAD_WARNSIZE": 2000, "FLEET_RECRAWL": "fixed"})
    spider = SitemapSpider.from_crawler(crawler, name="s")
    crawler.spider = spider
    middleware = FleetSitemapLastmod.from_crawler(crawler)
    middleware._opened(spider)  # (the spider_opened signal)
    urls = "".join(f"<url><loc>http://a.test/{i}</loc><lastmod>2026-11-{i + 1:02d}</lastmod>"
                   f"</url>" for i in range(5))
    body = gzip.compress(f"<urlset>{urls}<url><loc>http://a.test/x</loc><lastmod>soon"
                         f"</lastmod></url>{' ' * 3000}</urlset>".encode())
    assert len(body) < 2000
    response = Response("http://a.test/s.gz", body=body, request=Request("http://a.test/s.gz"))
    with caplog.at_level(logging.WARNING):
        out = list(middleware.process_spider_output(response, spider._parse_sitemap(response)))
    assert len([r for r in caplog.records if "download warning size" in r.message]) == 1
    assert [r.meta.get(LASTMOD_META_KEY) for r in out] == [
        utc(2026, 11, i + 1) for i in range(5)] + [None]
    assert crawler.stats.get_value("fleet/recrawl/lastmod") == 5
    assert crawler.stats.get_value("fleet/recrawl/lastmod_invalid") == 1
