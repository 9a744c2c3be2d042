"""Content signature of a page: simhash64 of its text, robust to the noise that makes byte
hashes of most pages differ between two downloads (ads, timestamps, tokens).

The text is the page's visible words (HTML: the text nodes outside ``script``, ``style``,
``noscript`` and ``template``), lowercased; words containing a digit are dropped (dates,
counters, session tokens); the features are the word 3-shingles (single words for a page of
fewer than 3).  Two versions whose signatures differ in at most :data:`SAME_DISTANCE` bits
are the same version (Manku et al. 2007; research note: Hamming <= 3).
"""

from __future__ import annotations

import hashlib
import re
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


def response_signature(response: Any) -> int:
    """The signature of a version of *response*'s page: :func:`simhash64` of its text; for a
    page without words (binary, an image, a PDF, an empty page) and for XML (a sitemap, a
    feed: data, where a changed ``<lastmod>`` or one more ``<loc>`` among thousands is a new
    version that the text's simhash would not see) a 64-bit hash of its bytes, so that such
    a page's versions are told apart exactly."""
    from scrapy.http import XmlResponse

    text = "" if isinstance(response, XmlResponse) else page_text(response)
    if _WORD.search(text):
        value = simhash64(text)
        if value != 0:
            return value
    value = int.from_bytes(hashlib.blake2b(response.body, digest_size=8).digest(), "big")
    return value - (1 << 64) if value >= 1 << 63 else value


def distance(a: int, b: int) -> int:
    """Bits in which signatures *a* and *b* differ (0..64)."""
    return bin((a ^ b) & 0xFFFFFFFFFFFFFFFF).count("1")


def same_version(a: int | None, b: int | None) -> bool:
    """True when *a* and *b* are signatures of one version (None: unknown, never the same)."""
    return a is not None and b is not None and distance(a, b) <= SAME_DISTANCE
