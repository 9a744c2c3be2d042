"""scrapy-redis's request fingerprint, for a project that keeps the seen fingerprints of a
scrapy-redis crawl it imports (docs/from-scrapy-redis.md).

scrapy-redis's ``RFPDupeFilter.request_fingerprint`` (scrapy_redis/dupefilter.py, 0.9) stores
the hex SHA-1 of ``json.dumps({"method", "url": w3lib canonicalize_url(url), "body": body
hex}, sort_keys=True)``.  Scrapy's own fingerprint (``scrapy.utils.request.fingerprint``)
adds ``"headers": {}`` to that JSON, so the two never match: a fleet using Scrapy's
fingerprinter cannot use scrapy-redis's fingerprints.  Set
``REQUEST_FINGERPRINTER_CLASS = "scrapy_fleet.compat.fingerprint.ScrapyRedisFingerprinter"``
and the fleet's Bloom keys are made from the same 20 bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scrapy import Request
from w3lib.url import canonicalize_url


def scrapy_redis_fingerprint(request: Request) -> bytes:
    """The 20 bytes whose hex scrapy-redis's dupefilter stores for *request*."""
    data = {"method": request.method, "url": canonicalize_url(request.url),
            "body": (request.body or b"").hex()}
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).digest()


class ScrapyRedisFingerprinter:
    """A ``REQUEST_FINGERPRINTER_CLASS`` giving scrapy-redis's fingerprints (module
    docstring)."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> ScrapyRedisFingerprinter:
        return cls()

    def fingerprint(self, request: Request) -> bytes:
        return scrapy_redis_fingerprint(request)


#: requests the import compares both fingerprints on
PROBES = (Request("http://example.com/a?b=1&a=2"),
          Request("http://example.com/", method="POST", body=b"k=v"))


def matches(fingerprint: Any) -> bool:
    """Does *fingerprint* (the fleet's fingerprinter's method) give scrapy-redis's bytes?"""
    return all(fingerprint(r) == scrapy_redis_fingerprint(r) for r in PROBES)
