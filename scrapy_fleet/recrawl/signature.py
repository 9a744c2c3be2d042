"""Signatures of a page's version (docs/recrawl.md, "What changed").

* :func:`items_digest`: a page whose callback yields items is compared by what it extracts:
  one 64-bit digest of its item set (each item's fields, canonical JSON, minus the fields
  named to be ignored; the set's digests sorted, so the order of the items does not count).
* :func:`text_signature`: a page without items is compared by its visible text (HTML: the
  text nodes outside ``script``, ``style``, ``noscript`` and ``template``): a 64-bit hash of
  its whitespace-separated words, every word kept (digits and punctuation included: a price,
  a date, a count); only whitespace and what is outside the visible text are ignored.
* :func:`simhash64` (opt-in, ``FLEET_RECRAWL_NEAR_DUPLICATES``): for pages with rotating
  noise: the simhash of the text's word 3-shingles, lowercased, words with a digit left out;
  two versions at most :data:`SAME_DISTANCE` bits apart are one version (Manku et al. 2007;
  research note: Hamming <= 3).  It cannot see a change of a number.
* XML (a sitemap, a feed), and a page without words: a hash of its bytes.

All values are signed 64-bit ints (msgpack and the codec keep them as they are).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable
from typing import Any

#: signatures at most this many bits apart are the same version
SAME_DISTANCE = 3

_WORD = re.compile(r"\w+", re.UNICODE)
_SKIP = "script|style|noscript|template"
_TEXT_XPATH = f"//body//text()[not(ancestor::*[self::{_SKIP.replace('|', ' or self::')}])]"


def page_text(response: Any) -> str:
    """The visible text of *response* (a Scrapy response): the HTML's text nodes outside
    scripts and styles, a text response's whole text, "" for a binary one."""
    from scrapy.http import HtmlResponse, TextResponse

    if isinstance(response, HtmlResponse):
        try:
            nodes = response.xpath(_TEXT_XPATH).getall()
        except ValueError:  # not parseable as HTML
            return response.text
        if not nodes:
            nodes = response.xpath("//text()").getall()
        return " ".join(nodes)
    if isinstance(response, TextResponse):
        return response.text
    return ""


def simhash64(text: str) -> int:
    """The 64-bit simhash of *text*'s word 3-shingles, as a signed 64-bit int (msgpack and the
    codec keep it as is).  Words with a digit are left out; an empty text gives 0."""
    words = [w for w in _WORD.findall(text.lower()) if not any(ch.isdigit() for ch in w)]
    if len(words) >= 3:
        feats = [" ".join(words[i:i + 3]) for i in range(len(words) - 2)]
    else:
        feats = words
    if not feats:
        return 0
    acc = [0] * 64
    for feat in feats:
        h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "big")
        for bit in range(64):
            acc[bit] += 1 if (h >> bit) & 1 else -1
    value = 0
    for bit in range(64):
        if acc[bit] > 0:
            value |= 1 << bit
    return value - (1 << 64) if value >= 1 << 63 else value


def _signed(digest: bytes) -> int:
    value = int.from_bytes(digest, "big")
    return value - (1 << 64) if value >= 1 << 63 else value


def _hash64(data: bytes) -> int:
    return _signed(hashlib.blake2b(data, digest_size=8).digest())


def text_signature(text: str) -> int:
    """64-bit hash (signed) of *text*'s whitespace-separated words, every one kept: a change
    of one digit or one word is a new signature, a change of whitespace alone is not."""
    return _hash64(" ".join(text.split()).encode("utf-8", "surrogatepass"))


def is_data(response: Any) -> bool:
    """True for XML (a sitemap, a feed): signed by its bytes and compared before the callback
    (a changed ``<lastmod>`` or one more ``<loc>`` among thousands is a new version)."""
    from scrapy.http import XmlResponse

    return isinstance(response, XmlResponse)


def response_signature(response: Any, near: bool = False) -> int:
    """The signature of the version of *response*'s page (a Scrapy response) from its text:
    :func:`text_signature` of its visible text (*near*: :func:`simhash64`, which leaves
    numbers out); for a page without words (binary, an image, a PDF, an empty page) and XML
    (:func:`is_data`) a 64-bit hash of its bytes, so that such a page's versions are told
    apart exactly."""
    text = "" if is_data(response) else page_text(response)
    if _WORD.search(text):
        value = simhash64(text) if near else text_signature(text)
        if value != 0:
            return value
    return _hash64(response.body)


def _canonical(fields: dict[Any, Any]) -> bytes:
    try:
        text = json.dumps(fields, sort_keys=True, default=repr, ensure_ascii=False,
                          separators=(",", ":"))
    except (TypeError, ValueError):  # keys of mixed types, a circular value
        text = repr(sorted((repr(k), repr(v)) for k, v in fields.items()))
    return text.encode("utf-8", "surrogatepass")


def item_digest(item: Any, ignore: Collection[str] = ()) -> int:
    """64-bit digest (signed) of an item's fields (itemadapter: a dict, an Item, a dataclass,
    an attrs object), their names and values as canonical JSON (values JSON cannot write
    by their ``repr``), the fields named in *ignore* left out, and the item's type unless it
    is a dict."""
    from itemadapter import ItemAdapter

    fields = {k: v for k, v in ItemAdapter(item).asdict().items() if k not in ignore}
    kind = b"" if isinstance(item, dict) else type(item).__qualname__.encode()
    return _hash64(kind + b"\0" + _canonical(fields))


def items_digest(digests: Iterable[int]) -> int:
    """One 64-bit digest (signed) of a page's item set from its items' :func:`item_digest`:
    the same items in another order give the same digest, one item more or less another."""
    ordered = sorted(d & 0xFFFFFFFFFFFFFFFF for d in digests)
    return _hash64(b"items" + b"".join(d.to_bytes(8, "big") for d in ordered))


def distance(a: int, b: int) -> int:
    """Bits in which signatures *a* and *b* differ (0..64)."""
    return bin((a ^ b) & 0xFFFFFFFFFFFFFFFF).count("1")


def same_version(a: int | None, b: int | None) -> bool:
    """True when *a* and *b* are signatures of one version (None: unknown, never the same)."""
    return a is not None and b is not None and distance(a, b) <= SAME_DISTANCE
