"""Safe, versioned, compact encoding of Scrapy requests for the frontier.  Never pickle.

Format version 1: one byte ``0x01`` followed by a msgpack map of the fields of
``Request.to_dict()`` under short keys, with fields at their default value left out::

    u url   m method   h headers   b body   c cookies   e encoding   f flags   p priority
    d dont_filter   cb callback name   eb errback name   k cb_kwargs   M meta
    C request class import path (absent for scrapy.Request)   x other class attributes
    s 1: a start request pushed from outside the spider (``scrapy fleet push``) that has not
      met the spider middlewares' ``process_start`` yet (absent otherwise)

Callbacks and errbacks travel by spider method name (``Request.to_dict`` refuses anything
else); request classes by import path, rebuilt only when listed in ``FLEET_REQUEST_CLASSES``.
Values in meta, cb_kwargs and cookies may be None, bool, int (64-bit), float, str, bytes,
list, tuple (kept as tuple, msgpack extension 1) and dicts of those, and scrapy-playwright's
``PageMethod`` (msgpack extension 2, see ``browser/pagemethods.py``: its name or import path,
args and kwargs; never its result).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack
from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from scrapy_fleet.browser import pagemethods
from scrapy_fleet.errors import CallbackError, RequestDecodeError, RequestEncodeError

VERSION = 1
_HEADER = bytes([VERSION])
_EXT_TUPLE = 1

#: to_dict field -> (short key, default value)
_FIELDS: dict[str, tuple[str, Any]] = {
    "url": ("u", None),
    "method": ("m", "GET"),
    "headers": ("h", {}),
    "body": ("b", b""),
    "cookies": ("c", {}),
    "encoding": ("e", "utf-8"),
    "flags": ("f", []),
    "priority": ("p", 0),
    "dont_filter": ("d", False),
    "callback": ("cb", None),
    "errback": ("eb", None),
    "cb_kwargs": ("k", {}),
    "meta": ("M", {}),
}
_SHORT = {short: name for name, (short, _) in _FIELDS.items()}
_PLAIN_REQUEST = "scrapy.http.request.Request"
#: meta keys the fleet sets on requests in flight; never stored in the frontier
PRIVATE_META_PREFIX = "_fleet_"
#: meta key naming the frontier entry of the leased request a request is, or was copied from
#: (set by the scheduler when it hands the request to the engine)
LEASE_META_KEY = PRIVATE_META_PREFIX + "lease"
#: meta key numbering the spider's start requests (0, 1, ...) in the worker that consumes them
START_META_KEY = PRIVATE_META_PREFIX + "start"
#: meta key of a request sent back to the frontier to wait there (seconds) before it may be
#: leased again (its origin's robots.txt could not be fetched yet); read once by the scheduler
DEFER_META_KEY = PRIVATE_META_PREFIX + "defer"
#: key of a ``Request.to_dict()``-shaped mapping (the push helper's) that marks a pushed start
#: request, stored as field ``s``: the worker that leases it passes it through the spider
#: middlewares' ``process_start`` first (FleetSpiderMiddleware's module docstring)
PUSHED_FIELD = "_pushed"
#: meta key :func:`decode` sets (to True) on such a request; in flight only, like every
#: private key, so a request the worker stores again (a retry, a redirect) is not marked
PUSHED_META_KEY = PRIVATE_META_PREFIX + "pushed"


def _default(obj: Any) -> Any:
    if isinstance(obj, str):
        # a str subclass (lxml's _ElementUnicodeResult: CrawlSpider's meta["link_text"]) is
        # stored as the str it is; it decodes as a plain str
        return str(obj)
    if isinstance(obj, tuple):
        return msgpack.ExtType(_EXT_TUPLE, _pack(list(obj)))
    page_method = pagemethods.page_method_class()
    if page_method is not None and isinstance(obj, page_method):
        return msgpack.ExtType(pagemethods.EXT_PAGE_METHOD, _pack(pagemethods.to_wire(obj)))
    raise TypeError(f"cannot encode object of type {type(obj).__qualname__}")


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == pagemethods.EXT_PAGE_METHOD:
        return pagemethods.from_wire(_unpack(data))
    raise RequestDecodeError(f"unknown msgpack extension type {code}")


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _find_unsupported(value: Any, path: str) -> str | None:
    """Path and type of the first value msgpack cannot take (for error messages)."""
    if value is None or isinstance(value, (bool, str, bytes, float)):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else f"{path} (integer out of 64-bit range)"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _find_unsupported(item, f"{path}[{i}]")
            if found:
                return found
        return None
    page_method = pagemethods.page_method_class()
    if page_method is not None and isinstance(value, page_method):
        return _find_unsupported([value.args, value.kwargs], f"{path} (page method arguments)")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, bytes, int)):
                return f"{path} (key of type {type(key).__qualname__})"
            found = _find_unsupported(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    return f"{path} (type {type(value).__module__}.{type(value).__qualname__})"


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode_dict(d: Mapping[str, Any]) -> bytes:
    """Encode a ``Request.to_dict()``-shaped mapping.

    Raises:
        RequestEncodeError: a value has a type the format cannot carry; the message gives its
            path (for example ``meta['sel'] (type parsel.selector.Selector)``).
    """
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in d.items():
        if name == "_class":
            if value != _PLAIN_REQUEST:
                out["C"] = value
            continue
        if name == PUSHED_FIELD:
            if value:
                out["s"] = 1
            continue
        spec = _FIELDS.get(name)
        if spec is None:
            extra[name] = value
            continue
        short, default = spec
        if name == "url" or value != default:
            if name == "headers":
                value = [[k, list(v)] for k, v in value.items()]
            out[short] = value
    if extra:
        out["x"] = extra
    try:
        return _HEADER + _pack(out)
    except RequestEncodeError as exc:
        raise RequestEncodeError(
            f"cannot store request {d.get('url')!r} in the frontier: {exc}") from exc
    except (TypeError, ValueError, OverflowError) as exc:
        where = _find_unsupported(out.get("M", {}), "meta") or _find_unsupported(
            out.get("k", {}), "cb_kwargs") or _find_unsupported(out, "request")
        raise RequestEncodeError(
            f"cannot store request {d.get('url')!r} in the frontier: unsupported value at "
            f"{where or '?'} ({exc})") from exc


def _method_name(spider: Spider | None, func: Any) -> str | None:
    """The name under which *spider* has the method *func* (a bound method), looked up by
    the function's own name; None when that finds nothing (an alias, not a method of the
    spider...): ``Request.to_dict`` searches then."""
    name = getattr(func, "__name__", None)
    inner = getattr(func, "__func__", None)
    if not spider or not isinstance(name, str) or inner is None:
        return None
    found = getattr(spider, name, None)
    return name if getattr(found, "__func__", None) is inner else None


def _to_dict(request: Request, spider: Spider | None) -> dict[str, Any]:
    """``request.to_dict(spider=spider)``, the callback and errback found by their names:
    Scrapy's ``_find_method`` reads every attribute of the spider (``inspect.getmembers``,
    ~40 µs per request for a plain Spider, more with more members) to find them.  Same dict
    (tests/unit/test_codec.py compares them), except that a method the spider also has under
    another name may come out under its own name (both decode to the same method)."""
    if type(request).to_dict is not Request.to_dict:
        return request.to_dict(spider=spider)  # a class with its own to_dict: that one
    names: list[Any] = []
    for func in (request.callback, request.errback):
        if not callable(func):
            names.append(func)
            continue
        name = _method_name(spider, func)
        if name is None:
            return request.to_dict(spider=spider)  # raises ValueError for a non-method
        names.append(name)
    d: dict[str, Any] = {"url": request.url, "callback": names[0], "errback": names[1],
                         "headers": dict(request.headers)}
    for attr in request.attributes:
        d.setdefault(attr, getattr(request, attr))
    return d


def encode(request: Request, spider: Spider | None = None) -> bytes:
    """Encode *request*; callbacks must be methods of *spider* (or None).

    Raises:
        RequestEncodeError: the callback/errback is not a spider method (a lambda, a
            function), or a value in meta/cb_kwargs/cookies cannot be encoded.
    """
    try:
        d = _to_dict(request, spider)
    except ValueError as exc:
        raise RequestEncodeError(
            f"cannot store request {request.url!r} in the frontier: {exc}") from exc
    d["_class"] = class_path(type(request))
    meta = d.get("meta")
    if meta:
        pagemethods.check_meta(meta, request.url)
    if meta and any(isinstance(k, str) and k.startswith(PRIVATE_META_PREFIX) for k in meta):
        d["meta"] = {k: v for k, v in meta.items()
                     if not (isinstance(k, str) and k.startswith(PRIVATE_META_PREFIX))}
    return encode_dict(d)


def decode_dict(data: bytes) -> dict[str, Any]:
    """Decode an entry into a ``Request.to_dict()``-shaped dict (callbacks as names); a pushed
    start request (field ``s``) has ``PUSHED_FIELD: True`` besides.

    Raises:
        RequestDecodeError: empty, unknown format version, or corrupt msgpack.
    """
    if not data:
        raise RequestDecodeError("empty entry")
    if data[0] != VERSION:
        raise RequestDecodeError(f"unknown format version {data[0]}")
    try:
        raw = _unpack(data[1:])
    except RequestDecodeError:
        raise
    except Exception as exc:
        raise RequestDecodeError(f"corrupt entry: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("u"), str):
        raise RequestDecodeError("corrupt entry: no url")
    d: dict[str, Any] = {}
    for short, value in raw.items():
        if short == "C":
            d["_class"] = value
        elif short == "s":
            d[PUSHED_FIELD] = bool(value)
        elif short == "x":
            if not isinstance(value, dict):
                raise RequestDecodeError("corrupt entry: bad extra attributes")
            d.update(value)
        elif short in _SHORT:
            d[_SHORT[short]] = value
        else:
            raise RequestDecodeError(f"corrupt entry: unknown field {short!r}")
    if "headers" in d:
        try:
            d["headers"] = {k: v for k, v in d["headers"]}
        except (TypeError, ValueError) as exc:
            raise RequestDecodeError("corrupt entry: bad headers") from exc
    return d


#: names on scrapy.Spider that are its own machinery, never a request's callback (``parse``
#: and ``_parse``, the default callback, are callbacks); ``closed`` and ``start_requests``:
#: what Scrapy calls on a spider that defines them
NOT_CALLBACKS = frozenset(
    {name for name in vars(Spider) if name not in ("parse", "_parse")}
    | {"closed", "start_requests"})


def callback_name_problem(name: Any, pushed: bool = False) -> str | None:
    """The part of :func:`callback_problem` that needs no spider: why *name* cannot name a
    callback whatever the spider (or None)."""
    if not isinstance(name, str) or not name.isidentifier():
        return "not the name of a spider method"
    if name.startswith("__") and name.endswith("__"):
        return "a special method of Python, not a request callback"
    if pushed and name.startswith("_"):
        return "a private name (leading '_'), not a callback a pushed request may name"
    if name in NOT_CALLBACKS:
        return "a method of scrapy.Spider itself, not a request callback"
    return None


def callback_problem(owner: Any, name: Any, pushed: bool = False) -> str | None:
    """Why *name* cannot be the callback (or errback) of a request of spider *owner* (an
    instance or its class), or None when it can.  The rule (docs/failures.md): the name of a
    method defined with ``def`` in the spider's class (or a base) and looked up by name
    (``inspect.getattr_static``: no property or descriptor runs), not a dunder, not one of
    scrapy.Spider's own (:data:`NOT_CALLBACKS`: ``start``, ``from_crawler``, ``closed``...),
    not a classmethod, staticmethod or non-callable value; *pushed* (a line of ``push``):
    not a private name either (``_x``: the spider's own machinery, such as CrawlSpider's
    ``_callback``, which only the spider's own requests use)."""
    problem = callback_name_problem(name, pushed)
    if problem:
        return problem
    found = inspect.getattr_static(owner, name, None)
    if found is None:
        return "the spider has no such method"
    if not inspect.isfunction(found):
        return f"not a method of the spider (a {type(found).__name__})"
    return None


def _check_callbacks(d: Mapping[str, Any], spider: Spider) -> None:
    for field in ("callback", "errback"):
        name = d.get(field)
        if name is not None:
            problem = callback_problem(spider, name)
            if problem:
                raise CallbackError(f"{field} {name!r} of {d.get('url')!r}: {problem}")


def decode(data: bytes, spider: Spider | None, allowed_classes: Iterable[str]) -> Request:
    """Rebuild a Request from an entry; a pushed start request gets
    ``meta[PUSHED_META_KEY] = True``.

    Raises:
        CallbackError: its callback or errback is no request callback of *spider*
            (:func:`callback_problem`).
        RequestDecodeError: corrupt entry, class not in *allowed_classes*, or arguments the
            Request class refuses.
    """
    d = decode_dict(data)
    pushed = d.pop(PUSHED_FIELD, False)
    cls_path = d.get("_class", _PLAIN_REQUEST)
    if cls_path not in set(allowed_classes):
        raise RequestDecodeError(
            f"request class {cls_path!r} is not in FLEET_REQUEST_CLASSES")
    try:
        load_object(cls_path)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise RequestDecodeError(f"cannot import request class {cls_path!r}: {exc}") from exc
    if cls_path == _PLAIN_REQUEST:
        d.pop("_class", None)
    if spider is not None:
        _check_callbacks(d, spider)
    try:
        request = request_from_dict(d, spider=spider)
    except Exception as exc:
        raise RequestDecodeError(f"cannot rebuild request {d.get('url')!r}: {exc}") from exc
    if pushed:
        request.meta[PUSHED_META_KEY] = True
    return request
