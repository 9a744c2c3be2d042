"""Recrawl policy without Redis: the content signature, the change-rate estimator, the next
interval, the state kept in meta and the revisit record."""

from __future__ import annotations

import math

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES
from scrapy_fleet.errors import FleetConfigError
from scrapy_fleet.recrawl.record import revisit_record, with_state
from scrapy_fleet.recrawl.schedule import (
    GONE,
    NOT_MODIFIED,
    OUTCOME_NAMES,
    STATE_META_KEY,
    UNCHANGED,
    UNKNOWN,
    State,
    estimate_rate,
    next_interval,
    observe,
    optimal_interval,
)
from scrapy_fleet.recrawl.settings import RecrawlConfig, recrawl_config
from scrapy_fleet.recrawl.signature import distance, page_text, same_version, simhash64

TEXT = ("The river market opened at dawn and the garden paper stalls sold copper lanterns "
        "to the harbor crowd while violet signals crossed the winter meadow")


def html(body: str) -> HtmlResponse:
    return HtmlResponse("http://h/p", body=body.encode(), encoding="utf-8")


def test_noise_does_not_change_the_signature_and_new_text_does():
    a = html(f"<html><body><p>{TEXT}</p><p>served at 1712345678.123 token a81f3c9</p>"
             "<script>var t = 'x1';</script></body></html>")
    b = html(f"<html><body><p>{TEXT}</p><p>served at 1799999999.999 token 0ffe12b</p>"
             "<script>var t = 'other';</script></body></html>")
    c = html("<html><body><p>A completely different article about glacier mosaics, quartz "
             "willows and thunder over the tundra, with cobalt falcons</p></body></html>")
    sa, sb, sc = (simhash64(page_text(r)) for r in (a, b, c))
    assert sa == sb  # digits-bearing words and scripts are left out
    assert same_version(sa, sb)
    assert distance(sa, sc) > 3 and not same_version(sa, sc)
    assert -(2**63) <= sa < 2**63  # a signed 64-bit int: the codec keeps it


def test_the_estimator_follows_the_history():
    base = 100.0
    prior = estimate_rate([], base)
    assert estimate_rate([100, 100, 100], base) > prior  # changed at every visit: faster
    assert estimate_rate([-100, -100, -100], base) < prior  # never changed: slower
    # Cho & Garcia-Molina with regular intervals: n visits, X changes -> -ln((n-X+.5)/(n+.5))/I
    # (the smoothing here is one half observation each way: close to it for many visits)
    hist = [100] * 4 + [-100] * 4
    assert estimate_rate(hist, base) == pytest.approx(-math.log(4.5 / 8.5) / 100, rel=0.25)


def test_adaptive_intervals_grow_for_static_pages_shrink_for_changing_ones_within_bounds():
    config = RecrawlConfig(mode="adaptive", interval=10, min_interval=1, max_interval=100)
    assert next_interval(config, State()) == 10
    assert next_interval(config, State(history=[-10])) == 12
    assert next_interval(config, State(history=[-10, -12])) > 12
    assert next_interval(config, State(history=[10])) == 9
    assert next_interval(config, State(history=[-10] * 8)) <= 100
    capped = RecrawlConfig(mode="adaptive", interval=10, min_interval=1, max_interval=20)
    assert next_interval(capped, State(history=[-10] * 8)) == 20
    # fixed: the interval whatever the history; a request's own interval wins
    fixed = RecrawlConfig(mode="fixed", interval=10)
    assert next_interval(fixed, State(history=[-10] * 8)) == 10
    assert next_interval(config, State(history=[-10]), wanted=3.0) == 3
    # a page changing much faster than the price of a fetch is not worth following
    assert optimal_interval(50 / 10, 10) == math.inf


def test_observe_adds_changed_and_unchanged_intervals_and_keeps_the_last_eight():
    state = State()
    observe(state, 1000, changed=True)  # the first fetch: nothing to observe
    assert (state.fetched, state.history) == (1000, [])
    observe(state, 1010, changed=False)
    observe(state, 1030, changed=True)
    assert state.history == [-10, 20]
    for t in range(1031, 1041):
        observe(state, t, changed=False)
    assert len(state.history) == 8 and state.fetched == 1040


def test_state_round_trips_through_the_codec_and_a_wrong_one_is_ignored():
    state = State(1700000000, 86400, -123456789012345678, '"abc-gzip"',
                  "Wed, 02 Dec 2026 03:39:42 GMT", [-86400, 3600], 1)
    payload = codec.encode(Request("http://h/p"))
    record = revisit_record(payload, state.to_meta(), 2.5, "h", 7)
    assert record[:3] == [2500, "h", -7]
    back = codec.decode(record[3], None, DEFAULT_REQUEST_CLASSES)
    assert State.from_meta(back.meta[STATE_META_KEY]) == state
    assert isinstance(state.to_meta()[4], int)  # an IMF-fixdate kept as its time
    odd = State(last_modified="Wednesday, 02-Dec-26 03:39:42 GMT")  # RFC 850: verbatim
    assert State.from_meta(odd.to_meta()).last_modified == odd.last_modified
    assert State.from_meta(["not", "a", "state"]) is None
    assert State.from_meta(None) is None


def test_the_last_outcome_is_kept_in_the_byte_the_gone_count_took():
    old = [1700000000, 600, 12345, None, None, [-300, 400], 1]  # written before: a count
    assert (State.from_meta(old).gone, State.from_meta(old).last) == (1, UNKNOWN)
    for last in range(len(OUTCOME_NAMES)):
        for gone in (0, 1, 3):
            state = State(1700000000, 600, 12345, history=[-300], gone=gone, last=last)
            back = State.from_meta(codec.decode_dict(codec.encode_dict(
                {"url": "http://h/p", "meta": {STATE_META_KEY: state.to_meta()}}))["meta"][
                STATE_META_KEY])
            assert (back.gone, back.last) == (gone, last)
    # one byte, as the count 0 took: a 304 and an unchanged 200 (and a 404) cost no byte more
    base = len(codec.encode_dict({"m": [*old[:-1], 0]}))
    for last, gone in ((NOT_MODIFIED, 0), (UNCHANGED, 0), (GONE, 1)):
        packed = State(1700000000, 600, 12345, history=[-300, 400], gone=gone,
                       last=last).to_meta()
        assert len(codec.encode_dict({"m": packed})) == base, (last, gone)


def test_a_pushed_start_request_loses_its_mark_in_the_record():
    pushed = codec.encode_dict({"url": "http://h/s", codec.PUSHED_FIELD: True})
    again = codec.decode(with_state(pushed, State().to_meta()), None, DEFAULT_REQUEST_CLASSES)
    assert codec.PUSHED_META_KEY not in again.meta


def test_record_size_with_a_50_byte_url_and_validators():
    url = "http://www.example-shop.com/catalog/item-12345.html"
    assert len(url) == 51
    state = State(1796182780, 86400, -4611686018427387904, '"5f1c-63a2b7c8e9d10"',
                  "Wed, 02 Dec 2026 03:39:42 GMT", [-86400, 86400, -172800], 0)
    record = revisit_record(codec.encode(Request(url)), state.to_meta(), 86400,
                            "www.example-shop.com", 0)
    line = f"{record[1]}\t{record[2]}\t".encode() + record[3]
    assert len(line) <= 160  # its list entry; the slot keys are shared (docs/recrawl.md)


@pytest.mark.parametrize(("name", "value"), [
    ("FLEET_RECRAWL", "sometimes"), ("FLEET_RECRAWL_INTERVAL", 0),
    ("FLEET_RECRAWL_MIN_INTERVAL", "x"), ("FLEET_RECRAWL_GONE_AFTER", 0),
    ("FLEET_RECRAWL_MAX", -1)])
def test_wrong_recrawl_settings_name_the_setting(name, value):
    with pytest.raises(FleetConfigError, match=name):
        recrawl_config({name: value})


def test_max_interval_below_min_is_refused_and_defaults_are_off():
    with pytest.raises(FleetConfigError, match="FLEET_RECRAWL_MAX_INTERVAL"):
        recrawl_config({"FLEET_RECRAWL_MIN_INTERVAL": 100, "FLEET_RECRAWL_MAX_INTERVAL": 50})
    assert recrawl_config({}) == RecrawlConfig()
    assert not RecrawlConfig().enabled
    assert recrawl_config({"FLEET_RECRAWL": "Adaptive"}).mode == "adaptive"


def test_a_host_override_sets_its_own_interval():
    config = recrawl_config({"FLEET_RECRAWL": "fixed", "FLEET_RECRAWL_INTERVAL": 100,
                             "FLEET_HOST_OVERRIDES": '{"News.example": {"recrawl_interval": 5,'
                                                     ' "rate": 1}}'})
    assert config.host_intervals == {"news.example": 5.0}
    assert next_interval(config.for_host("news.example"), State()) == 5
    assert next_interval(config.for_host("other.example"), State()) == 100
    with pytest.raises(FleetConfigError, match="recrawl_interval"):
        recrawl_config({"FLEET_HOST_OVERRIDES": {"h": {"recrawl_interval": 0}}})


def test_a_page_without_words_is_told_apart_by_its_bytes():
    from scrapy.http import Response

    from scrapy_fleet.recrawl.signature import response_signature

    one = response_signature(Response("http://h/a.pdf", body=b"%PDF-1.4 \x00\x01 v1"))
    two = response_signature(Response("http://h/a.pdf", body=b"%PDF-1.4 \x00\x01 v2"))
    assert not same_version(one, two)  # (a text signature would be 0 for both)
    assert one == response_signature(Response("http://h/a.pdf", body=b"%PDF-1.4 \x00\x01 v1"))
    page = html(f"<html><body><p>{TEXT}</p></body></html>")
    assert response_signature(page, near=True) == simhash64(page_text(page))


@pytest.mark.parametrize("value", [math.nan, math.inf, -5, 0, "abc", None, True])
def test_an_invalid_meta_interval_is_one_warning_and_the_page_is_kept(value, caplog):
    """Issue 22: meta fleet_recrawl neither False nor seconds > 0 is one WARNING naming the
    URL and the value; the response goes on to the callback and the default interval is
    used (NaN raised ValueError in round() and lost the page)."""
    from scrapy.utils.test import get_crawler

    from scrapy_fleet.recrawl.middleware import FleetRecrawlMiddleware
    from scrapy_fleet.recrawl.schedule import wanted_interval

    crawler = get_crawler(settings_dict={"FLEET_RECRAWL": "fixed",
                                         "FLEET_RECRAWL_INTERVAL": 600})
    mw = FleetRecrawlMiddleware.from_crawler(crawler)
    url = "http://example.test/page.html"
    request = Request(url, meta={"fleet_recrawl": value})
    response = HtmlResponse(url, body=TEXT.encode(), request=request)
    with caplog.at_level("WARNING"):
        out = mw.process_response(request, response)
    assert out is response
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert url in warnings[0] and repr(value) in warnings[0]
    assert wanted_interval(request.meta) is None
    assert next_interval(RecrawlConfig(mode="fixed", interval=600), State(),
                         wanted_interval(request.meta)) == 600


@pytest.mark.parametrize("value", [False, 600, 0.5])
def test_a_valid_meta_interval_is_no_warning(value, caplog):
    from scrapy.utils.test import get_crawler

    from scrapy_fleet.recrawl.middleware import FleetRecrawlMiddleware

    crawler = get_crawler(settings_dict={"FLEET_RECRAWL": "fixed"})
    mw = FleetRecrawlMiddleware.from_crawler(crawler)
    url = "http://example.test/page.html"
    request = Request(url, meta={"fleet_recrawl": value})
    with caplog.at_level("WARNING"):
        mw.process_response(request, HtmlResponse(url, body=TEXT.encode(), request=request))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
