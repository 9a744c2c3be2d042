"""Spiders for tests/worker/test_sink_failures.py: items a sink cannot write, requests the codec
cannot store; each has a setting that "fixes" the spider, for the retry."""

from __future__ import annotations

import threading
from typing import Any

import scrapy


class Unwritable:
    """A value no sink can write (not JSON, not BSON)."""

    def __repr__(self) -> str:
        return "<Unwritable>"


class ItemTroubleSpider(scrapy.Spider):
    """Fetches what is pushed, follows nothing.  Each page yields a good item and, on a URL
    with "bad", a second item with a field no sink can write (until ``ITEM_TROUBLE_FIXED``).
    With ``ITEM_TROUBLE_DROP`` a URL with "drop" has its item dropped (DropItem)."""

    name = "item_trouble"
    custom_settings = {"ITEM_PIPELINES": {"fleettest.sink_spiders.DropPipeline": 100}}

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "kind": "good"}
        if "bad" in response.url:
            fixed = self.settings.getbool("ITEM_TROUBLE_FIXED")
            yield {"url": response.url, "kind": "extra",
                   "blob": "fixed" if fixed else Unwritable()}


class DropPipeline:
    """Drops the items of URLs with "drop" (a decision, not a failure)."""

    def process_item(self, item: Any) -> Any:
        if "drop" in item["url"]:
            raise scrapy.exceptions.DropItem("not wanted")
        return item


class UnstorableSpider(scrapy.Spider):
    """Its start request (``UNSTORABLE_BASE`` + ``p/5.html``) and two of the links its callback
    yields on a page without ``child`` meta (``UNSTORABLE_BASE`` + ``p/1.html``, ``p/2.html``)
    have a callback or a meta value the fleet's codec
    cannot store, until ``UNSTORABLE_FIXED``; a third link (p/3.html) is fine."""

    name = "unstorable"

    def _fixed(self) -> bool:
        return self.settings.getbool("UNSTORABLE_FIXED")

    async def start(self) -> Any:
        base = self.settings.get("UNSTORABLE_BASE")
        if base:
            yield scrapy.Request(base + "p/5.html",
                                 callback=self.parse if self._fixed() else lambda r: None)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url}
        if response.meta.get("child"):
            return
        fixed, base = self._fixed(), self.settings.get("UNSTORABLE_BASE")
        yield scrapy.Request(base + "p/1.html", meta={"child": True},
                             callback=self.parse if fixed else lambda r: None)
        yield scrapy.Request(base + "p/2.html", meta={"child": True} if fixed else
                             {"child": True, "lock": threading.Lock()})
        yield scrapy.Request(base + "p/3.html", meta={"child": True})
