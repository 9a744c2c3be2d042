"""Scrapy's default request fingerprint computed without its per-request machinery.

``scrapy.utils.request.fingerprint`` (what Scrapy's ``RequestFingerprinter`` returns) is the
SHA-1 of ``json.dumps({"method", "url": canonicalize_url(url), "body": body hex, "headers":
{}}, sort_keys=True)``; for each request it also builds that dict, a cache key and a
``WeakKeyDictionary`` entry, which cost about as much as ``canonicalize_url`` itself.  For a
GET without a body (nearly every link) the fingerprint depends on the URL string alone, so:

* :func:`default_fingerprint` writes the same JSON from the canonical URL directly (the push
  helper's fast path, ``commands.push.plain_url_entry``);
* :func:`url_bloom_key` remembers the Bloom key of the last :data:`URL_KEY_CACHE` URLs: a
  link found on many pages (a site's navigation, most links of a crawl) is canonicalized and
  hashed once per worker.  ``RedisBloomDupeFilter.bloom_key`` uses it when the crawler's
  fingerprinter is Scrapy's own (:func:`is_default_fingerprinter`).

Both give exactly Scrapy's bytes (tests/unit/test_fingerprint.py compares them over varied URLs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

from w3lib.url import canonicalize_url

from scrapy_fleet.frontier.bloom import bloom_key

if TYPE_CHECKING:
    from scrapy import Request

#: the fingerprint JSON of a GET without body or included headers, up to its URL: what
#: ``json.dumps({"method": "GET", "url": u, "body": "", "headers": {}}, sort_keys=True)``
#: writes in ``scrapy.utils.request.fingerprint``
FP_HEAD = '{"body": "", "headers": {}, "method": "GET", "url": '

#: URLs whose Bloom key one process remembers (least recently used forgotten first):
#: ~32,768 x (URL + 12-byte key + ~100 B of cache entry), 4-8 MB at most
URL_KEY_CACHE = 32768


def default_fingerprint(canonical_url: str) -> bytes:
    """The 20-byte ``scrapy.utils.request.fingerprint`` of a GET of *canonical_url* (already
    ``w3lib.url.canonicalize_url``-ed) without a body, when no headers are included."""
    return hashlib.sha1((FP_HEAD + json.dumps(canonical_url) + "}").encode()).digest()


@lru_cache(maxsize=URL_KEY_CACHE)
def url_bloom_key(url: str) -> bytes:
    """``bloom.bloom_key(scrapy.utils.request.fingerprint(Request(url)))`` for a GET of the
    request URL *url* (``Request.url``: already safe-encoded) without a body and without
    ``meta["verbatim_url"]``; cached per URL (:data:`URL_KEY_CACHE`).

    Raises:
        ValueError: from ``canonicalize_url`` for a URL it cannot parse (as Scrapy's would).
    """
    return bloom_key(default_fingerprint(canonicalize_url(url)))


def is_default_fingerprinter(fingerprint: Callable[[Request], bytes]) -> bool:
    """Whether *fingerprint* is the bound ``fingerprint`` method of Scrapy's own
    ``RequestFingerprinter`` (not a subclass, not a project's ``REQUEST_FINGERPRINTER_CLASS``):
    then :func:`default_fingerprint` and :func:`url_bloom_key` give its bytes without a
    Request."""
    from scrapy.utils.request import RequestFingerprinter
    from scrapy.utils.request import fingerprint as scrapy_fingerprint

    owner = getattr(fingerprint, "__self__", None)
    return (type(owner) is RequestFingerprinter
            and getattr(fingerprint, "__func__", None) is RequestFingerprinter.fingerprint
            and getattr(owner, "_fingerprint", None) is scrapy_fingerprint)


def fast_bloom_key(request: Request) -> bytes | None:
    """:func:`url_bloom_key` of *request* when its default fingerprint depends on its URL
    alone (a GET without a body, no ``verbatim_url``), else None (compute it the usual way)."""
    if request.method != "GET" or request.body or request.meta.get("verbatim_url"):
        return None
    return url_bloom_key(request.url)
