"""Request codec: round trips, refusals, corrupt entries, never pickle."""

from __future__ import annotations

import pickle
import re
import threading

import msgpack
import pytest
from parsel import Selector
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.errors import RequestDecodeError, RequestEncodeError

ALLOWED = DEFAULT_REQUEST_CLASSES


class DemoSpider(Spider):
    name = "demo"

    def parse_page(self, response):
        pass

    def on_error(self, failure):
        pass


SPIDER = DemoSpider()


def roundtrip(request: Request) -> Request:
    return codec.decode(codec.encode(request, SPIDER), SPIDER, ALLOWED)


def test_full_request_round_trip():
    req = Request("https://example.com/a?b=1", method="POST", body=b"\x00\xffdata",
                  headers={"X-One": "1", "Accept": ["a", "b"]}, cookies={"c": "v"},
                  meta={"depth": 2, "t": (1, "x", b"y"), "nested": {"k": [1.5, None, True]}},
                  cb_kwargs={"page": 3}, callback=SPIDER.parse_page, errback=SPIDER.on_error,
                  priority=-7, dont_filter=True, flags=["f1"], encoding="latin-1")
    back = roundtrip(req)
    assert back.url == req.url
    assert back.method == "POST"
    assert back.body == b"\x00\xffdata"
    assert back.headers.getlist("Accept") == [b"a", b"b"]
    assert back.headers["X-One"] == b"1"
    assert back.cookies == {"c": "v"}
    assert back.meta == {"depth": 2, "t": (1, "x", b"y"), "nested": {"k": [1.5, None, True]}}
    assert isinstance(back.meta["t"], tuple)
    assert back.cb_kwargs == {"page": 3}
    assert back.callback == SPIDER.parse_page
    assert back.errback == SPIDER.on_error
    assert (back.priority, back.dont_filter, back.flags, back.encoding) == (-7, True, ["f1"],
                                                                            "latin-1")


def test_defaults_round_trip_and_are_left_out():
    req = Request("http://example.com/")
    data = codec.encode(req, SPIDER)
    assert msgpack.unpackb(data[1:]) == {"u": "http://example.com/"}
    back = codec.decode(data, SPIDER, ALLOWED)
    assert (back.method, back.priority, back.dont_filter, back.callback) == ("GET", 0, False,
                                                                             None)


@pytest.mark.parametrize("cls,kwargs,check", [
    (FormRequest, {"formdata": {"q": "x y"}}, lambda r: r.body == b"q=x+y"),
    (JsonRequest, {"data": {"a": 1}}, lambda r: r.body == b'{"a": 1}'),
])
def test_request_subclasses_by_import_path(cls, kwargs, check):
    back = roundtrip(cls("http://example.com/form", **kwargs))
    assert type(back) is cls
    assert check(back)


def test_class_outside_allow_list_is_refused():
    class MyRequest(Request):
        pass

    data = codec.encode(MyRequest("http://example.com/"), SPIDER)
    with pytest.raises(RequestDecodeError, match="not in FLEET_REQUEST_CLASSES"):
        codec.decode(data, SPIDER, ALLOWED)


def test_lambda_callback_is_refused_with_url():
    req = Request("http://example.com/x", callback=lambda r: None)
    with pytest.raises(RequestEncodeError, match=re.escape("http://example.com/x")):
        codec.encode(req, SPIDER)


@pytest.mark.parametrize("value,where", [
    (Selector(text="<p>x</p>"), "meta['bad'] (type parsel.selector.Selector)"),
    (threading.Lock(), "meta['bad'] (type _thread.lock)"),
    ({1, 2}, "meta['bad'] (type builtins.set)"),
    (2**70, "meta['bad'] (integer out of 64-bit range)"),
])
def test_unencodable_meta_names_the_path(value, where):
    req = Request("http://example.com/y", meta={"ok": 1, "bad": value})
    with pytest.raises(RequestEncodeError) as info:
        codec.encode(req, SPIDER)
    assert where in str(info.value)
    assert "http://example.com/y" in str(info.value)


@pytest.mark.parametrize("data,reason", [
    (b"", "empty entry"),
    (b"\x07" + msgpack.packb({"u": "http://x/"}), "unknown format version 7"),
    (b"\x01\xc1\xc1", "corrupt entry"),
    (b"\x01" + msgpack.packb({"m": "GET"}), "no url"),
    (b"\x01" + msgpack.packb({"u": "http://x/", "zz": 1}), r"unknown field 'zz'"),
    (pickle.dumps({"url": "http://x/"}), "unknown format version 128"),
])
def test_corrupt_entries_raise_decode_error(data, reason):
    with pytest.raises(RequestDecodeError, match=reason):
        codec.decode(data, SPIDER, ALLOWED)


def test_unknown_callback_is_a_decode_error():
    data = codec.encode_dict({"url": "http://x/", "callback": "no_such_method"})
    with pytest.raises(RequestDecodeError, match="no_such_method"):
        codec.decode(data, SPIDER, ALLOWED)


def test_typical_request_is_at_most_half_of_pickle():
    req = Request("https://docs.python.org/3/library/os.html", callback=SPIDER.parse_page,
                  headers={"Referer": "https://docs.python.org/3/library/index.html"},
                  meta={"depth": 3, "scope": "https://docs.python.org/3/"}, priority=-3)
    ours = len(codec.encode(req, SPIDER))
    pickled = len(pickle.dumps(req.to_dict(spider=SPIDER), protocol=pickle.HIGHEST_PROTOCOL))
    assert ours * 2 <= pickled, (ours, pickled)


class BaseCallbacks(Spider):
    name = "base"

    def parse_inherited(self, response):
        pass


class CallbackSpider(BaseCallbacks):
    name = "callbacks"

    def parse_page(self, response):
        pass

    def on_error(self, failure):
        pass


class AliasSpider(CallbackSpider):
    name = "alias"
    parse_alias = CallbackSpider.parse_page  # the same function under a name sorted first


def test_callback_names_found_without_scanning_the_spider_are_scrapys(monkeypatch):
    spider = CallbackSpider()
    other = CallbackSpider()  # another instance: Scrapy matches the function, so do we
    requests = [
        Request("https://example.com/a", callback=spider.parse_page, errback=spider.on_error,
                meta={"k": 1}, cb_kwargs={"p": 2}, priority=3, flags=["f"]),
        Request("https://example.com/b", callback=spider.parse_inherited),
        Request("https://example.com/c", callback=other.parse_page),
        Request("https://example.com/d"),
        FormRequest("https://example.com/e", formdata={"a": "1"}, callback=spider.parse_page),
        JsonRequest("https://example.com/f", data={"a": 1}, errback=spider.on_error),
    ]
    expected = []
    for request in requests:
        d = request.to_dict(spider=spider)
        d.pop("_class", None)  # codec.encode writes its own
        expected.append(d)
    import inspect

    def no_scan(*args, **kwargs):
        raise AssertionError("inspect.getmembers called")

    monkeypatch.setattr(inspect, "getmembers", no_scan)
    assert [codec._to_dict(r, spider) for r in requests] == expected
    for request in requests:
        back = codec.decode(codec.encode(request, spider), spider, ALLOWED)
        # (bound to *spider* once decoded, also the one made for another instance)
        assert [getattr(f, "__func__", f) for f in (back.callback, back.errback)] == [
            getattr(f, "__func__", f) for f in (request.callback, request.errback)]
    monkeypatch.undo()
    # an alias: Scrapy names the method by the first of its names, we by its own name;
    # both decode to the same method
    spider = AliasSpider()
    alias = Request("https://example.com/g", callback=spider.parse_alias)
    assert alias.to_dict(spider=spider)["callback"] == "parse_alias"
    assert codec._to_dict(alias, spider)["callback"] == "parse_page"
    back = codec.decode(codec.encode(alias, spider), spider, ALLOWED)
    assert back.callback == spider.parse_alias


def test_callbacks_that_are_not_spider_methods_are_refused_as_before():
    spider = AliasSpider()

    class Helper:
        def parse_page(self, response):  # the name of a spider method, another function
            pass

    for callback in (lambda r: None, Helper().parse_page, print):
        with pytest.raises(RequestEncodeError, match="not an instance method"):
            codec.encode(Request("https://example.com/x", callback=callback), spider)
    with pytest.raises(RequestEncodeError, match="not an instance method"):
        codec.encode(Request("https://example.com/x", callback=spider.parse_page), None)


class _TaggedRequest(Request):
    """A request class with its own to_dict (an extra field): the codec must use it."""

    def to_dict(self, *, spider=None):
        d = super().to_dict(spider=spider)
        d["meta"] = {**d.get("meta", {}), "tagged": True}
        return d


def test_a_request_class_with_its_own_to_dict_keeps_it():
    spider = CallbackSpider()
    req = _TaggedRequest("https://example.com/t", callback=spider.parse_page)
    assert codec._to_dict(req, spider)["meta"] == {"tagged": True}
    allowed = [*ALLOWED, f"{__name__}._TaggedRequest"]
    back = codec.decode(codec.encode(req, spider), spider, allowed)
    assert type(back) is _TaggedRequest and back.meta["tagged"] is True


def test_str_subclass_in_meta_is_stored_as_str():
    """CrawlSpider puts lxml's text (a str subclass) into meta["link_text"]: it is stored as
    the str it is (issue 36: every link of a CrawlSpider was refused)."""
    from lxml import html

    link_text = html.fromstring("<a>next page</a>").xpath("//a/text()")[0]
    assert type(link_text) is not str and isinstance(link_text, str)
    request = Request("http://h.test/p", meta={"rule": 0, "link_text": link_text,
                                               "nested": [link_text]})
    back = codec.decode(codec.encode(request), None, DEFAULT_REQUEST_CLASSES)
    assert back.meta == {"rule": 0, "link_text": "next page", "nested": ["next page"]}
    assert type(back.meta["link_text"]) is str
