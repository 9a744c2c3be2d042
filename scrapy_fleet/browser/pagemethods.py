"""``scrapy_playwright.page.PageMethod`` in the frontier: encoded as data, never pickled.

A page method travels as msgpack extension type 2 holding ``[kind, method, args, kwargs]``:
``kind`` ``"n"`` for a method of the page named by ``method`` (``"wait_for_selector"``), ``"i"``
for a module-level function given by its import path (``"myproject.pages.scroll_down"``,
called by scrapy-playwright with the page first).  ``args`` and ``kwargs`` are plain values
(the codec's types).  The method's ``result`` (set once it ran: an element handle, a
screenshot) is never carried: a request yielded again with ``meta=response.meta`` runs its
page methods afresh.

A pushed JSON line writes a page method as
``{"method": "wait_for_selector", "args": ["#done"], "kwargs": {}}`` inside
``meta["playwright_page_methods"]`` (:func:`from_json`).

Live objects cannot travel: ``meta["playwright_page"]`` (a page kept open by
``playwright_include_page=True``), or a callable that is not a module-level function, are
refused at encode with :class:`~scrapy_fleet.errors.RequestEncodeError` naming the key.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from scrapy_fleet.errors import RequestDecodeError, RequestEncodeError

logger = logging.getLogger(__name__)
#: page.close() tasks in progress (kept referenced until done)
_closing: set[asyncio.Task[Any]] = set()

#: msgpack extension code of a page method (1 is the codec's tuple)
EXT_PAGE_METHOD = 2
#: the meta key scrapy-playwright puts an open page under (playwright_include_page=True)
PAGE_META_KEY = "playwright_page"
#: the meta key holding the page methods
METHODS_META_KEY = "playwright_page_methods"


@functools.cache
def page_method_class() -> Any:
    """``scrapy_playwright.page.PageMethod``, or None when scrapy-playwright is not installed."""
    try:
        from scrapy_playwright.page import PageMethod
    except ImportError:
        return None
    return PageMethod


def _import_path(func: Any) -> str:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", "")
    if not module or not qualname or "<" in qualname or "." in qualname:
        raise RequestEncodeError(
            f"meta['playwright_page_methods']: page method {func!r} is not a module-level "
            "function: pass the name of a page "
            "method (a string) or a function importable by its path")
    return f"{module}.{qualname}"


def to_wire(pm: Any) -> list[Any]:
    """``[kind, method, args, kwargs]`` of a PageMethod (see module docstring).

    Raises:
        RequestEncodeError: the method is a callable that cannot be imported by path.
    """
    if isinstance(pm.method, str):
        return ["n", pm.method, list(pm.args), dict(pm.kwargs)]
    return ["i", _import_path(pm.method), list(pm.args), dict(pm.kwargs)]


def from_wire(value: Any) -> Any:
    """Rebuild a PageMethod from ``[kind, method, args, kwargs]``.

    Raises:
        RequestDecodeError: scrapy-playwright is not installed, or the value is malformed, or
            an import path does not resolve to a callable.
    """
    cls = page_method_class()
    if cls is None:
        raise RequestDecodeError(
            "entry holds a playwright PageMethod but scrapy-playwright is not installed "
            "(pip install scrapy-playwright)")
    if (not isinstance(value, list) or len(value) != 4 or value[0] not in ("n", "i")
            or not isinstance(value[1], str) or not isinstance(value[2], list)
            or not isinstance(value[3], dict)):
        raise RequestDecodeError("corrupt entry: bad page method")
    kind, method, args, kwargs = value
    if kind == "i":
        from scrapy.utils.misc import load_object
        try:
            method = load_object(method)
        except (ImportError, NameError, ValueError, AttributeError) as exc:
            raise RequestDecodeError(f"cannot import page method {value[1]!r}: {exc}") from exc
    return cls(method, *args, **kwargs)


def check_meta(meta: dict[str, Any], url: str) -> None:
    """Refuse a live page in *meta* before encoding, with the fix in the message.

    Raises:
        RequestEncodeError: ``meta["playwright_page"]`` holds a page.
    """
    page = meta.get(PAGE_META_KEY)
    if page is not None:
        raise RequestEncodeError(
            f"cannot store request {url!r} in the frontier: meta[{PAGE_META_KEY!r}] is a live "
            "browser page, which cannot travel to another worker; close it (await "
            f"page.close()) and remove it from meta (e.g. meta={{k: v for k, v in "
            f"response.meta.items() if k != {PAGE_META_KEY!r}}}) before yielding the request")


def close_page_of(meta: dict[str, Any]) -> bool:
    """Close the open page a dropped request holds in meta, so no page leaks; True if one was
    scheduled for closing.  Safe without a running loop (then nothing is done)."""
    page = meta.get(PAGE_META_KEY)
    close = getattr(page, "close", None)
    if close is None or getattr(page, "is_closed", lambda: True)():
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    task = loop.create_task(close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    return True


def from_json(value: Any) -> list[Any]:
    """PageMethods from the JSON form of ``meta["playwright_page_methods"]`` in a pushed line:
    a list of ``{"method": str, "args": list, "kwargs": dict}`` (args and kwargs optional).

    Raises:
        ValueError: the value has another shape, or scrapy-playwright is not installed; the
            message says which.
    """
    cls = page_method_class()
    if cls is None:
        raise ValueError("meta.playwright_page_methods needs scrapy-playwright installed")
    if not isinstance(value, list):
        raise ValueError("meta.playwright_page_methods must be a list of objects")
    out = []
    for i, item in enumerate(value):
        where = f"meta.playwright_page_methods[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("method"), str):
            raise ValueError(f"{where} must be an object with a string \"method\"")
        extra = set(item) - {"method", "args", "kwargs"}
        if extra:
            raise ValueError(f"{where} has unknown field(s): {', '.join(sorted(extra))}")
        args, kwargs = item.get("args", []), item.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError(f"{where}: args must be a list and kwargs an object")
        out.append(cls(item["method"], *args, **kwargs))
    return out
