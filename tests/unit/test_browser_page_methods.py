"""Browser pages' data, with no browser and no Redis: the page methods of a request travel
through the frontier as data (codec extension 2), a live page cannot, pushed JSON lines carry
page methods as objects; the settings and the add-on's install of scrapy-playwright
(worker/test_browser.py crawls with Debian's chromium)."""

from __future__ import annotations

import json

import pytest
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.commands.push import parse_line
from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError, PushLineError, RequestEncodeError

PageMethod = pytest.importorskip("scrapy_playwright.page").PageMethod


CLASSES = ["scrapy.http.request.Request"]


def roundtrip(request: Request) -> Request:
    return codec.decode(codec.encode(request), None, CLASSES)


def test_page_methods_travel_as_data_without_their_result() -> None:
    pm = PageMethod("wait_for_selector", "#done", timeout=5000, state=("visible",))
    pm.result = object()  # what scrapy-playwright leaves after running it
    back = roundtrip(Request("http://a.test/", meta={
        "playwright": True, "playwright_page_methods": [pm, PageMethod(json.dumps, 1)]}))
    first, second = back.meta["playwright_page_methods"]
    assert isinstance(first, PageMethod)
    assert (first.method, first.args, first.kwargs, first.result) == (
        "wait_for_selector", ("#done",), {"timeout": 5000, "state": ("visible",)}, None)
    assert second.method is json.dumps and second.args == (1,)
    assert back.meta["playwright"] is True


def test_live_objects_are_refused_naming_the_key() -> None:
    with pytest.raises(RequestEncodeError, match=r"meta\['playwright_page'\] is a live"):
        codec.encode(Request("http://a.test/", meta={"playwright_page": object()}))
    with pytest.raises(RequestEncodeError,
                       match=r"meta\['playwright_page_methods'\].*not a module-level"):
        codec.encode(Request("http://a.test/", meta={
            "playwright_page_methods": [PageMethod(lambda page: None)]}))
    with pytest.raises(RequestEncodeError, match=r"playwright_page_methods.*builtins.object"):
        codec.encode(Request("http://a.test/", meta={
            "playwright_page_methods": [PageMethod("click", object())]}))


def test_corrupt_page_method_is_a_decode_error() -> None:
    import msgpack

    from scrapy_fleet.errors import RequestDecodeError

    bad = bytes([codec.VERSION]) + msgpack.packb(
        {"u": "http://a.test/", "M": {"m": msgpack.ExtType(2, msgpack.packb(["z", 1]))}})
    with pytest.raises(RequestDecodeError, match="bad page method"):
        codec.decode(bad, None, CLASSES)


def test_pushed_line_page_methods() -> None:
    line = json.dumps({"url": "http://a.test/", "meta": {"playwright": True,
                       "playwright_page_methods": [
                           {"method": "wait_for_selector", "args": ["#done"], "kwargs": {}},
                           {"method": "click", "args": ["#b"]}]}})
    request, d = parse_line(line)
    methods = request.meta["playwright_page_methods"]
    assert [(m.method, m.args) for m in methods] == [("wait_for_selector", ("#done",)),
                                                      ("click", ("#b",))]
    assert codec.encode_dict(d)  # storable as pushed
    for bad, reason in (([{"args": []}], 'string "method"'), ("click", "must be a list"),
                        ([{"method": "click", "kw": {}}], "unknown field"),
                        ([{"method": "click", "args": "x"}], "args must be a list")):
        with pytest.raises(PushLineError, match=reason):
            parse_line(json.dumps({"url": "http://a.test/",
                                   "meta": {"playwright_page_methods": bad}}))


def test_settings() -> None:
    config = FleetConfig.from_settings({"FLEET_PLAYWRIGHT": "true",
                                        "FLEET_PLAYWRIGHT_ABORT": "image,font"})
    assert (config.browser.playwright, config.browser.abort) == (True, ("image", "font"))
    with pytest.raises(FleetConfigError, match=r"FLEET_PLAYWRIGHT_ABORT.*resource types"):
        FleetConfig.from_settings({"FLEET_PLAYWRIGHT_ABORT": ["pictures"]})


def test_addon_installs_scrapy_playwright_unless_the_project_did() -> None:
    from scrapy.settings import Settings

    from scrapy_fleet import Addon
    from scrapy_fleet.browser.handler import HANDLER, AbortResources

    settings = Settings({"FLEET_PLAYWRIGHT": True})
    Addon().update_settings(settings)
    assert settings.getdict("DOWNLOAD_HANDLERS") == {"http": HANDLER, "https": HANDLER}
    abort = settings["PLAYWRIGHT_ABORT_REQUEST"]
    assert isinstance(abort, AbortResources)
    assert [abort(type("R", (), {"resource_type": t})()) for t in ("image", "font", "document",
                                                                    "script")] == [
        True, True, False, False]
    own = Settings({"FLEET_PLAYWRIGHT": True, "DOWNLOAD_HANDLERS": {"https": "my.Handler"}},
                   priority="project")
    Addon().update_settings(own)
    assert own.getdict("DOWNLOAD_HANDLERS")["https"] == "my.Handler"
    plain = Settings()
    Addon().update_settings(plain)
    assert "PLAYWRIGHT_ABORT_REQUEST" not in plain
