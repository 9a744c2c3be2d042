"""The push helper's reading of a line, with no Redis: a JSON spec becomes a request dict,
bad lines are refused with a reason, a callback's required arguments must be in cb_kwargs,
a JSON string is that URL (worker/test_push_command.py runs the commands)."""

from __future__ import annotations

import json
import re

import pytest

from scrapy_fleet import codec
from scrapy_fleet.commands.push import parse_line
from scrapy_fleet.errors import PushLineError


def test_full_json_spec_becomes_a_request_dict():
    line = json.dumps({
        "url": "https://example.com/api", "method": "post", "headers": {"X-A": ["1", "2"]},
        "body": "héllo", "cookies": {"s": "1"}, "meta": {"depth": 1}, "cb_kwargs": {"n": 2},
        "callback": "parse_api", "errback": "on_error", "priority": 7, "dont_filter": True})
    request, d = parse_line(line)
    assert (request.method, request.priority, request.dont_filter) == ("POST", 7, True)
    back = codec.decode_dict(codec.encode_dict(d))
    assert back["callback"] == "parse_api" and back["errback"] == "on_error"
    assert back["body"] == "héllo".encode()
    assert back["headers"] == {b"X-A": [b"1", b"2"]}
    assert (back["meta"], back["cb_kwargs"], back["cookies"]) == ({"depth": 1}, {"n": 2},
                                                                  {"s": "1"})


@pytest.mark.parametrize("line,reason", [
    ("ftp://example.com/f", "url scheme must be http or https, not 'ftp'"),
    ("example.com/page", "url has no scheme: write it with http:// or https://"),
    ("http:///nohost", "url has no host"),
    ("http://exa mple.com/", "url contains whitespace"),
    ("http://example.com:99999/", "url is malformed"),
    ("http://example.com/" + "a" * 2100, "characters long (limit 2083)"),
    ('{"url": "http://e.com/", "priority": "high"}', "priority must be an integer"),
    ('{"url": "http://e.com/", "priority": true}', "priority must be an integer"),
    ('{"url": "http://e.com/", "dont_filter": "yes"}', "dont_filter must be true or false"),
    ('{"url": "http://e.com/", "headers": {"A": 1}}', "headers['A'] must be a string"),
    ('{"url": "http://e.com/", "callback": "not a name"}', "callback must be the name"),
    ('{"url": "http://e.com/", "meta": []}', "meta must be an object"),
    ('{"url": "http://e.com/", "colour": "red"}', "unknown field(s): colour"),
    ('{"url": "http://e.com/", ', "invalid JSON"),
    ('["http://e.com/"]', "JSON line must be an object"),
    ("null", "a JSON line must be an object (a request) or a string (its URL), not null"),
    ("  null ", "a JSON line must be an object (a request) or a string (its URL), not null"),
    ("42", "a JSON line must be an object (a request) or a string (its URL), not a number"),
    ("false", "a JSON line must be an object (a request) or a string (its URL), not a "
              "boolean"),
    ('"http://e.com/', "invalid JSON"),
    ('"ftp://e.com/"', "url scheme must be http or https, not 'ftp'"),
    ('{"method": "GET"}', "url must be a non-empty string"),
    ("http://[::1/", "url is malformed: Invalid IPv6 URL"),
    ("http://[x]/", "url is malformed"),
    ('{"url": "http://e.com/a\\u0000b"}', "url contains a NUL character"),
    ('{"url": "http://e.com/", "priority": 2147483649}', "priority must be within"),
])
def test_bad_lines_are_refused_with_a_reason(line, reason):
    with pytest.raises(PushLineError) as info:
        parse_line(line)
    assert reason in str(info.value)


def test_a_callback_with_required_arguments_needs_them_in_cb_kwargs():
    """A callback whose own arguments are required is refused without cb_kwargs that give
    them (trial: such a request failed with a TypeError in every worker)."""
    from scrapy_fleet.commands.push import PushLineError, parse_line

    class _Spider:
        def parse_kw(self, response, n):
            pass

        def parse_opt(self, response, n=1):
            pass

    def has(name):
        return getattr(_Spider, name, False)

    with pytest.raises(PushLineError, match="cb_kwargs do not fit callback 'parse_kw': "
                                            "missing a required argument: 'n'"):
        parse_line('{"url": "http://h.test/a", "callback": "parse_kw"}', has_method=has)
    request, _ = parse_line('{"url": "http://h.test/a", "callback": "parse_kw", '
                            '"cb_kwargs": {"n": 2}}', has_method=has)
    assert request.cb_kwargs == {"n": 2}
    request, _ = parse_line('{"url": "http://h.test/a", "callback": "parse_opt"}',
                            has_method=has)
    assert request.cb_kwargs == {}


def test_a_url_as_a_json_string_is_pushed_as_that_url():
    # a JSON line is an object or a string: the string is the URL (issue 19: `null` was
    # refused as "url has no scheme", as if it were a URL)
    request, d = parse_line('"http://e.com/a b"'.replace(" ", "%20"))
    assert request.url == "http://e.com/a%20b" and d["url"] == "http://e.com/a%20b"


class _CallbackSpider:
    """A spider class of every kind of attribute a line may name (issue 30, trial item 5)."""

    name = "cbs"
    custom_settings: dict = {}

    def parse(self, response):
        pass

    def parse_item(self, response):
        pass

    def _helper(self, response):
        pass

    @classmethod
    def build(cls, response):
        pass

    @staticmethod
    def tool(response):
        pass

    @property
    def prop(self):
        raise AssertionError("a property must not run when a name is checked")

    def closed(self, reason):
        pass


@pytest.mark.parametrize("field,value,reason", [
    ("callback", "__init__", "a special method of Python, not a request callback"),
    ("errback", "__call__", "a special method of Python, not a request callback"),
    ("callback", "_helper", "a private name (leading '_'), not a callback a pushed request "
                            "may name"),
    ("callback", "start", "a method of scrapy.Spider itself, not a request callback"),
    ("callback", "from_crawler", "a method of scrapy.Spider itself, not a request callback"),
    ("callback", "closed", "a method of scrapy.Spider itself, not a request callback"),
    ("callback", "build", "not a method of the spider (a classmethod)"),
    ("callback", "tool", "not a method of the spider (a staticmethod)"),
    ("callback", "prop", "not a method of the spider (a property)"),
    ("callback", "name", "not a method of the spider (a str)"),
    ("callback", "nope", "the spider has no such method"),
])
def test_a_name_that_is_no_callback_is_refused_with_its_reason(field, value, reason):
    def has(name):  # what `scrapy fleet push` passes (commands/fleet.py)
        return codec.callback_problem(_CallbackSpider, name, pushed=True) or getattr(
            _CallbackSpider, name, None)

    line = json.dumps({"url": "http://h.test/a", field: value})
    with pytest.raises(PushLineError) as info:
        parse_line(line, has_method=has)
    assert str(info.value) == f"{field} {value!r}: {reason}"
    if value.startswith("_") or reason.startswith("a method of scrapy.Spider"):
        with pytest.raises(PushLineError, match=f"^{field} {value!r}: "):
            parse_line(line)  # outside a project too: no spider is needed to say so
    good = json.dumps({"url": "http://h.test/a", "callback": "parse_item",
                       "errback": "parse"})
    assert parse_line(good, has_method=has)[1]["callback"] == "parse_item"


@pytest.mark.parametrize("line,reason", [
    ("http://user:pass@h.test/", "url has credentials (user:password@host), which no worker "
                                 "can send"),
    ('{"url": "http://user@h.test/"}', "url has credentials"),
    ('{"url": "http://:p%40ss@h.test/"}', "url has credentials"),
    ('{"url": "http://h.test/", "meta": {"download_timeout": "abc"}}',
     "meta['download_timeout'] must be a number > 0, not 'abc': no worker could send"),
    ('{"url": "http://h.test/", "meta": {"download_timeout": 0}}', "must be a number > 0"),
    ('{"url": "http://h.test/", "meta": {"download_maxsize": "1"}}',
     "meta['download_maxsize'] must be an integer >= 0"),
    ('{"url": "http://h.test/", "meta": {"max_retry_times": true}}',
     "meta['max_retry_times'] must be an integer >= 0"),
    ('{"url": "http://h.test/", "meta": {"proxy": 5}}', "meta['proxy'] must be a string or null"),
    ('{"url": "http://h.test/", "meta": {"handle_httpstatus_list": [404, "500"]}}',
     "meta['handle_httpstatus_list'] must be a list of integers"),
    # header names must be HTTP tokens (RFC 9110 tchar): the worker's download failed with
    # InvalidHeaderName; CR/LF in a value went out as spaces, a NUL as it was
    ('{"url": "http://127.0.0.4:8001/a8", "headers": {"X\\r\\nY": "z"}}',
     "header name 'X\\r\\nY' is not a valid HTTP field name (a token of letters, digits and "
     "!#$%&'*+-.^_`|~), which no worker can send"),
    ('{"url": "http://h.test/", "headers": {"X Y": "z"}}', "header name 'X Y' is not a valid"),
    ('{"url": "http://h.test/", "headers": {"X-A:": "z"}}', "header name 'X-A:' is not a valid"),
    ('{"url": "http://h.test/", "headers": {"": "z"}}', "header name '' is not a valid"),
    ('{"url": "http://h.test/", "headers": {"X-\u00e9": "z"}}', "header name 'X-é' is not"),
    ('{"url": "http://h.test/", "headers": {"X-A\\n": "z"}}', "header name 'X-A\\n' is not"),
    ('{"url": "http://h.test/", "headers": {"X-A": "a\\r\\nEvil: 1"}}',
     "headers['X-A'] contains a CR, LF or NUL character, which no worker can send as given"),
    ('{"url": "http://h.test/", "headers": {"X-A": "a\\nb"}}', "headers['X-A'] contains a CR"),
    ('{"url": "http://h.test/", "headers": {"X-A": "a\\rb"}}', "headers['X-A'] contains a CR"),
    ('{"url": "http://h.test/", "headers": {"X-A": "a\\u0000b"}}',
     "headers['X-A'] contains a CR"),
    ('{"url": "http://h.test/", "headers": {"X-A": ["ok", "b\\n"]}}',
     "headers['X-A'] contains a CR"),
])
def test_a_line_no_worker_can_send_is_refused_at_push(line, reason):
    """issue 30, trial item 9: such lines were pushed, then failed in the worker's
    downloader (ValueError "invalid hostname", TypeError) and put their host on hold."""
    with pytest.raises(PushLineError, match=re.escape(reason)):
        parse_line(line)


def test_meta_values_a_worker_can_send_are_accepted():
    request, _ = parse_line(json.dumps({"url": "http://h.test/", "meta": {
        "download_timeout": 2.5, "download_maxsize": 0, "max_retry_times": 1, "proxy": None,
        "handle_httpstatus_list": [404], "depth": "anything"}}))
    assert request.meta["download_timeout"] == 2.5


def test_headers_a_worker_can_send_are_accepted():
    tchars = "!#$%&'*+-.^_`|~09azAZ"
    request, _ = parse_line(json.dumps({"url": "http://h.test/", "headers": {
        tchars: "v", "X-Tab": "a\tb c", "X-Utf8": "caf\u00e9", "X-Many": ["1", "2"],
        "X-Empty": ""}}))
    assert request.headers.getlist(tchars) == [b"v"]
    assert request.headers.getlist("X-Many") == [b"1", b"2"]
