"""One input line of the push helper (commands/push.py) as a request: the checks of a plain
URL or a JSON request spec, each refusal with its reason (``PushLineError``), and the fast
path of a plain URL line (:func:`plain_url_entry`).  Re-exported by commands/push.py."""

from __future__ import annotations

import functools
import inspect
import ipaddress
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request
from w3lib.url import canonicalize_url, safe_url_string

from scrapy_fleet import codec
from scrapy_fleet.browser import pagemethods
from scrapy_fleet.errors import PushLineError
from scrapy_fleet.frontier.fingerprint import default_fingerprint

DEFAULT_MAX_URL_LENGTH = 2083  # Scrapy's URLLENGTH_LIMIT default
_SPEC_KEYS = {"url", "method", "headers", "body", "cookies", "meta", "cb_kwargs", "callback",
              "errback", "priority", "dont_filter"}
_METHOD_RE = re.compile(r"^[A-Z][A-Z0-9_-]{0,19}$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


#: any character ``str.isspace`` calls whitespace (``\s`` of a str pattern is the same set)
_WHITESPACE = re.compile(r"\s")


def _validate_url(url: Any, max_length: int) -> str:
    if not isinstance(url, str) or not url.strip():
        raise PushLineError("url must be a non-empty string")
    url = url.strip()
    if len(url) > max_length:
        raise PushLineError(f"url is {len(url)} characters long (limit {max_length})")
    if _WHITESPACE.search(url):
        raise PushLineError("url contains whitespace")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"
        raise PushLineError(f"url is malformed: {exc}") from None
    if not parts.scheme:
        raise PushLineError("url has no scheme: write it with http:// or https://")
    if parts.scheme.lower() not in ("http", "https"):
        raise PushLineError(f"url scheme must be http or https, not {parts.scheme!r}")
    if "\x00" in url:
        raise PushLineError("url contains a NUL character")
    try:
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
        if host and "[" in parts.netloc and not host.startswith("v"):
            # what urlsplit checks itself on Python 3.11.7 but not on 3.10.13: a bracketed
            # host is an IP address ("v..." is the IPvFuture form, left to the URL parser)
            ipaddress.ip_address(host)
    except ValueError as exc:
        raise PushLineError(f"url is malformed: {exc}") from None
    if not host:
        raise PushLineError("url has no host")
    if "@" in parts.netloc:  # what Scrapy's downloader refuses ("invalid hostname")
        raise PushLineError("url has credentials (user:password@host), which no worker can "
                            "send: give them as an Authorization header, or as the spider's "
                            "http_user / http_pass (Scrapy's HttpAuthMiddleware)")
    return url


#: meta keys Scrapy's downloader and its middlewares read, with the check of their values:
#: a value of another type fails the request in every worker (a TypeError in the download)
_NUMBER, _COUNT, _TEXT = "a number > 0", "an integer >= 0", "a string"
_META_CHECKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "download_timeout": (_NUMBER, lambda v: _is_number(v) and 0 < v < float("inf")),
    "download_maxsize": (_COUNT, lambda v: _is_number(v, int) and v >= 0),
    "download_warnsize": (_COUNT, lambda v: _is_number(v, int) and v >= 0),
    "max_retry_times": (_COUNT, lambda v: _is_number(v, int) and v >= 0),
    "proxy": (_TEXT + " or null", lambda v: v is None or isinstance(v, str)),
    "download_slot": (_TEXT, lambda v: isinstance(v, str)),
    "referrer_policy": (_TEXT, lambda v: isinstance(v, str)),
    "handle_httpstatus_list": ("a list of integers",
                               lambda v: isinstance(v, list)
                               and all(_is_number(x, int) for x in v)),
}


def _is_number(value: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _check_meta(meta: dict[str, Any]) -> None:
    """Raise PushLineError for a meta value of a key Scrapy's downloader reads
    (:data:`_META_CHECKS`) that no worker could send the request with."""
    for key, (expected, ok) in _META_CHECKS.items():
        if key in meta and not ok(meta[key]):
            raise PushLineError(f"meta[{key!r}] must be {expected}, not {meta[key]!r}: no "
                                "worker could send this request")


def _check_str_dict(name: str, value: Any, multi: bool = False) -> None:
    if not isinstance(value, dict):
        raise PushLineError(f"{name} must be an object")
    for k, v in value.items():
        ok = isinstance(v, str) or (multi and isinstance(v, list)
                                    and all(isinstance(x, str) for x in v))
        if not ok:
            raise PushLineError(f"{name}[{k!r}] must be a string" + (" or list of strings"
                                                                        if multi else ""))


#: an HTTP field name: a token, one or more tchar (RFC 9110, 5.1 and 5.6.2)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: what no field value may hold (RFC 9110, 5.5): Twisted's client sends a CR or LF as a
#: space (another header than the one pushed) and a NUL as it is (a request servers refuse)
_VALUE_FORBIDDEN = re.compile(r"[\r\n\x00]")


def _check_headers(headers: dict[str, Any]) -> None:
    """Raise PushLineError for a header (its types checked by ``_check_str_dict``) that no
    worker can send: a name that is no HTTP token (Twisted's client fails the download with
    InvalidHeaderName), or a value with a CR, LF or NUL character in it."""
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise PushLineError(f"header name {name!r} is not a valid HTTP field name (a token "
                                "of letters, digits and !#$%&'*+-.^_`|~), which no worker "
                                "can send")
        for item in value if isinstance(value, list) else [value]:
            if _VALUE_FORBIDDEN.search(item):
                raise PushLineError(f"headers[{name!r}] contains a CR, LF or NUL character, "
                                    "which no worker can send as given")


@functools.lru_cache(maxsize=64)
def _signature(function: Callable[..., Any]) -> inspect.Signature | None:
    """The signature of a spider method, read once per method (not once per pushed line)."""
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _check_cb_kwargs(name: str, function: Callable[..., Any], cb_kwargs: dict[str, Any]) -> None:
    """Raise PushLineError when *function* (a spider method, unbound) cannot take
    ``(spider, response, **cb_kwargs)``: the request would fail in every worker."""
    signature = _signature(function)
    if signature is None:  # no signature to read (a builtin): not checked
        return
    try:
        signature.bind(None, None, **cb_kwargs)
    except TypeError as exc:
        raise PushLineError(f"cb_kwargs do not fit callback {name!r}: {exc}") from None


def _stripped(line: str) -> str:
    """*line* without surrounding whitespace.

    Raises:
        PushLineError: it is not valid UTF-8 (a line read with errors="surrogateescape").
    """
    text = line.strip()
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PushLineError("line is not valid UTF-8") from None
    return text


#: JSON values that are no URL and no request: a line of one of them is said to be JSON
_JSON_WORDS = ("null", "true", "false")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _not_a_request(value: Any) -> str:
    kind = ("null" if value is None else "a boolean" if isinstance(value, bool)
            else "a number" if isinstance(value, int | float) else type(value).__name__)
    return (f"a JSON line must be an object (a request) or a string (its URL), not {kind}")


def json_line(line: str) -> bool:
    """Whether *line* is JSON rather than a plain URL (an object, an array, a string, a
    number or a JSON word): :func:`parse_line` reads those."""
    text = line.strip()
    first = text[:1]
    return (first in ("{", "[", '"') or text in _JSON_WORDS
            or (first in "-0123456789" and _JSON_NUMBER.fullmatch(text) is not None))


def parse_line(line: str, max_url_length: int = DEFAULT_MAX_URL_LENGTH,
               dont_filter: bool = False, priority: int = 0,
               has_method: Callable[[str], Any] | None = None,
               ) -> tuple[Request, dict[str, Any]]:
    """Parse one input line into a Request and its ``to_dict()`` form (callbacks as names),
    marked as a pushed start request (``codec.PUSHED_FIELD``: the worker that leases it passes
    it through the spider middlewares' ``process_start`` first).
    *has_method*, when given, tells whether the spider has a method of that name: a bool, or
    the spider class's function itself, against whose signature a callback's ``cb_kwargs``
    are then checked (``inspect.Signature.bind`` with the spider and the response), or a
    string: why that name is no callback of the spider (``codec.callback_problem``).  A
    callback or errback name is refused as ``codec.callback_name_problem`` says (dunders,
    private names, scrapy.Spider's own methods) with or without *has_method*.

    Raises:
        PushLineError: the reason, ready to print after the line number.
    """
    text = _stripped(line)
    if text.startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PushLineError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(spec, dict):
            raise PushLineError("JSON line must be an object")
    elif text.startswith("["):
        raise PushLineError("JSON line must be an object, not an array")
    elif text.startswith('"'):  # a URL as a JSON string
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PushLineError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(value, str):
            raise PushLineError(_not_a_request(value))
        spec = {"url": value}
    elif text in _JSON_WORDS or _JSON_NUMBER.fullmatch(text):
        raise PushLineError(_not_a_request(json.loads(text)))
    else:
        spec = {"url": text}
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise PushLineError(f"unknown field(s): {', '.join(sorted(unknown))}")
    url = _validate_url(spec.get("url"), max_url_length)
    kwargs: dict[str, Any] = {"url": url, "priority": priority, "dont_filter": dont_filter}
    if "method" in spec:
        if not isinstance(spec["method"], str) or not _METHOD_RE.match(spec["method"].upper()):
            raise PushLineError("method must be an HTTP method name")
        kwargs["method"] = spec["method"].upper()
    if "headers" in spec:
        _check_str_dict("headers", spec["headers"], multi=True)
        _check_headers(spec["headers"])
        kwargs["headers"] = spec["headers"]
    if "body" in spec:
        if not isinstance(spec["body"], str):
            raise PushLineError("body must be a string")
        kwargs["body"] = spec["body"].encode("utf-8")
    if "cookies" in spec:
        cookies = spec["cookies"]
        if isinstance(cookies, list):
            if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in cookies):
                raise PushLineError("cookies list items must be objects with a name")
        else:
            _check_str_dict("cookies", cookies)
        kwargs["cookies"] = cookies
    for name in ("meta", "cb_kwargs"):
        if name in spec:
            if not isinstance(spec[name], dict):
                raise PushLineError(f"{name} must be an object")
            kwargs[name] = spec[name]
    _check_meta(kwargs.get("meta", {}))
    methods = kwargs.get("meta", {}).get(pagemethods.METHODS_META_KEY)
    if methods is not None:
        try:
            kwargs["meta"] = {**kwargs["meta"],
                              pagemethods.METHODS_META_KEY: pagemethods.from_json(methods)}
        except ValueError as exc:
            raise PushLineError(str(exc)) from None
    if "priority" in spec:
        if isinstance(spec["priority"], bool) or not isinstance(spec["priority"], int):
            raise PushLineError("priority must be an integer")
        if abs(spec["priority"]) > 2**31:
            raise PushLineError("priority must be within +-2**31")
        kwargs["priority"] = spec["priority"]
    if "dont_filter" in spec:
        if not isinstance(spec["dont_filter"], bool):
            raise PushLineError("dont_filter must be true or false")
        kwargs["dont_filter"] = spec["dont_filter"]
    names = {}
    for name in ("callback", "errback"):
        value = spec.get(name)
        if value is not None:
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise PushLineError(f"{name} must be the name of a spider method")
            problem = codec.callback_name_problem(value, pushed=True)
            found = has_method(value) if has_method is not None and not problem else True
            if isinstance(found, str):  # the reason the spider gave (commands/fleet.py)
                problem = found
            if problem:
                raise PushLineError(f"{name} {value!r}: {problem}")
            if not found or not (found is True or callable(found)):
                raise PushLineError(f"{name} {value!r}: the spider has no such method")
            if name == "callback" and callable(found):
                # (also without cb_kwargs: a callback with required arguments of its own
                # would fail in every worker)
                _check_cb_kwargs(value, found, kwargs.get("cb_kwargs") or {})
            names[name] = value
    if "callback" not in names and kwargs.get("cb_kwargs") and has_method is not None:
        default = has_method("parse")  # a request without a callback goes to parse
        if callable(default) and default is not True:
            _check_cb_kwargs("parse", default, kwargs["cb_kwargs"])
    try:
        request = Request(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PushLineError(f"invalid request: {exc}") from None
    d = request.to_dict()
    d.update(names)
    d[codec.PUSHED_FIELD] = True  # a start request: the spider middlewares' process_start
    return request, d


#: the fields of a plain line that can differ from their defaults, in the order of
#: ``Request.to_dict()`` (the order codec.encode_dict writes them in)
_PLAIN_FIELDS = [name for name in Request("http://a.test/").to_dict()
                 if name in ("url", "priority", "dont_filter")]


def plain_url_entry(text: str, max_url_length: int = DEFAULT_MAX_URL_LENGTH,
                    dont_filter: bool = False,
                    priority: int = 0) -> tuple[str, bytes, bytes]:
    """A plain URL line (not JSON) as ``(url, payload, fingerprint)`` without building a
    Request: *url* is ``Request(url).url`` (``w3lib.url.safe_url_string``), *payload* is
    ``codec.encode_dict`` of the request's ``to_dict()`` (what :func:`parse_line` gives), and
    *fingerprint* the 20-byte SHA-1 of Scrapy's default fingerprinter
    (``scrapy.utils.request.fingerprint``: the JSON of method, canonical URL, body hex and no
    headers).  The same checks as :func:`parse_line`, the same reasons; tests compare both
    ways over varied URLs.

    Raises:
        PushLineError: the reason, ready to print after the line number.
    """
    text = _stripped(text)
    if text.startswith(("{", "[")):
        raise ValueError("a JSON line: parse it with parse_line")
    url = _validate_url(text, max_url_length)
    try:
        url = safe_url_string(url, "utf-8")  # Request._set_url
        if "://" not in url:
            raise ValueError(f"Missing scheme in request url: {url}")
        canonical = canonicalize_url(url)
    except (TypeError, ValueError) as exc:
        raise PushLineError(f"invalid request: {exc}") from None
    fields = {"url": url, "priority": priority, "dont_filter": dont_filter}
    payload = codec.encode_dict({**{name: fields[name] for name in _PLAIN_FIELDS},
                                 codec.PUSHED_FIELD: True})
    return url, payload, default_fingerprint(canonical)
