"""Issue 31 without Redis: the signatures of a version (every word of the text, digits
included; the item set's digest without the ignored fields) and the spider middleware that
holds a page's items until its outcome is settled (requests pass at once, sync and async
callbacks)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.recrawl.items import PENDING_META_KEY, FleetRecrawlItems
from scrapy_fleet.recrawl.settings import recrawl_config
from scrapy_fleet.recrawl.signature import (
    item_digest,
    items_digest,
    page_text,
    response_signature,
    same_version,
    simhash64,
)

WORDS = " ".join(["river stone market garden winter paper window signal"] * 60)  # 480 words


def html(body: str) -> HtmlResponse:
    return HtmlResponse("http://h/p", body=body.encode(), encoding="utf-8")


def test_a_changed_number_is_a_new_text_signature_and_whitespace_or_scripts_are_not():
    a = html(f"<html><body><p>{WORDS}</p><p>price 12.35</p></body></html>")
    b = html(f"<html><body><p>{WORDS}</p><p>price 12.36</p></body></html>")
    assert response_signature(a) != response_signature(b)
    # (the simhash, opt-in for pages with rotating noise, cannot see it)
    assert same_version(response_signature(a, near=True), response_signature(b, near=True))
    assert response_signature(a, near=True) == simhash64(page_text(a))
    spaced = html(f"<html><body><p>{WORDS}</p>\n  <p>price\t12.35 </p>"
                  "<script>var t = 'x1';</script><style>p {}</style></body></html>")
    assert response_signature(spaced) == response_signature(a)


def test_a_one_sentence_edit_of_a_long_page_is_a_new_text_signature():
    sentences = [f"sentence {k} " + WORDS[:100] for k in range(25)]
    edited = list(sentences)
    edited[7] = edited[7].replace("winter", "summer", 1)
    a = html("<html><body><p>" + ". ".join(sentences) + "</p></body></html>")
    b = html("<html><body><p>" + ". ".join(edited) + "</p></body></html>")
    assert response_signature(a) != response_signature(b)


def test_the_item_digest_leaves_out_the_ignored_fields_and_the_order_of_items():
    one = {"url": "http://h/p", "price": 12.35, "fetched_at": 1.0}
    same = {"fetched_at": 2.0, "price": 12.35, "url": "http://h/p"}
    other = {"url": "http://h/p", "price": 12.36, "fetched_at": 1.0}
    ignore = {"fetched_at"}
    assert item_digest(one, ignore) == item_digest(same, ignore)
    assert item_digest(one) != item_digest(same)
    assert item_digest(one, ignore) != item_digest(other, ignore)
    a, b = item_digest({"n": 1}), item_digest({"n": 2})
    assert items_digest([a, b]) == items_digest([b, a])
    assert items_digest([a, b]) != items_digest([a, b, b]) != items_digest([a])
    # values JSON cannot write are compared by their repr
    assert item_digest({"when": {1, 2}}) == item_digest({"when": {2, 1}})


def test_the_recrawl_item_settings_are_validated():
    config = recrawl_config({"FLEET_RECRAWL": "adaptive", "FLEET_RECRAWL_ITEMS": "All",
                             "FLEET_RECRAWL_IGNORE_FIELDS": "fetched_at, seen",
                             "FLEET_RECRAWL_NEAR_DUPLICATES": "true"})
    assert (config.items, config.ignore_fields, config.near_duplicates) == (
        "all", frozenset({"fetched_at", "seen"}), True)
    defaults = recrawl_config({})
    assert (defaults.items, defaults.ignore_fields, defaults.near_duplicates) == (
        "changed", frozenset(), False)
    with pytest.raises(FleetConfigError, match="FLEET_RECRAWL_ITEMS"):
        recrawl_config({"FLEET_RECRAWL_ITEMS": "some"})
    with pytest.raises(FleetConfigError, match="FLEET_RECRAWL_IGNORE_FIELDS"):
        recrawl_config({"FLEET_RECRAWL_IGNORE_FIELDS": [1]})


class Pending:
    """A PendingOutcome (recrawl/items.py) whose last digest is *last*."""

    def __init__(self, last: int | None) -> None:
        self.last = last
        self.settled = False
        self.digest: int | None = None

    def settle(self, digest: int | None) -> bool:
        self.settled, self.digest = True, digest
        return digest != self.last

    def version(self) -> tuple[int, int]:
        return 1_700_000_000, self.digest or 0


def output(items: list[Any]) -> tuple[FleetRecrawlItems, HtmlResponse, Pending, list[Any]]:
    crawler = get_crawler(settings_dict={"FLEET_RECRAWL": "fixed",
                                         "FLEET_RECRAWL_IGNORE_FIELDS": ["fetched_at"]})
    mw = FleetRecrawlItems.from_crawler(crawler)
    request = Request("http://h/p")
    response = HtmlResponse("http://h/p", body=b"<html></html>", request=request)
    pending = Pending(items_digest(item_digest(i, {"fetched_at"}) for i in items
                                   if isinstance(i, dict)))
    request.meta[PENDING_META_KEY] = pending
    return mw, response, pending, items


def test_requests_pass_at_once_and_unchanged_items_are_held_back():
    links = [Request("http://h/a"), Request("http://h/b")]
    mw, response, pending, _ = output([{"n": 1, "fetched_at": 1}, {"n": 2}])
    seen: list[Any] = []

    def callback() -> Any:
        yield {"n": 2}
        yield links[0]
        assert seen == [links[0]] and not pending.settled  # the link passed, items held
        yield {"n": 1, "fetched_at": 2}  # (another fetch time: ignored)
        yield links[1]

    for x in mw.process_spider_output(response, callback()):
        seen.append(x)
    assert seen == links and pending.settled  # unchanged: no item sent
    assert mw.stats is not None
    assert mw.stats.get_value("fleet/recrawl/items_unchanged") == 2


def test_a_changed_item_set_is_sent_whole_and_stamped_by_an_async_callback():
    mw, response, pending, _ = output([{"n": 1}])

    async def callback() -> Any:
        yield {"n": 1}
        await asyncio.sleep(0)
        yield Request("http://h/a")
        yield {"n": 3}

    async def collect() -> list[Any]:
        return [x async for x in mw.process_spider_output_async(response, callback())]

    out = asyncio.run(collect())
    assert isinstance(out[0], Request) and [x["n"] for x in out[1:]] == [1, 3]
    assert pending.digest == items_digest([item_digest({"n": 1}), item_digest({"n": 3})])
    assert out[1]["fleet_signature"] == f"{pending.digest & 0xFFFFFFFFFFFFFFFF:016x}"


def test_a_callback_that_raises_settles_on_the_text_and_sends_what_it_yielded():
    mw, response, pending, _ = output([{"n": 1}])

    def callback() -> Any:
        yield {"n": 1}
        raise ValueError("broken page")

    seen: list[Any] = []
    with pytest.raises(ValueError):
        for x in mw.process_spider_output(response, callback()):
            seen.append(x)
    assert pending.settled and pending.digest is None
    assert [x["n"] for x in seen] == [1]
