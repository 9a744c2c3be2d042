"""``RedisSpider`` and ``RedisCrawlSpider`` for projects that drop the scrapy-redis
dependency: the same names, attributes and start-data formats, fed by the fleet
(:mod:`scrapy_fleet.compat.feeder`; docs/from-scrapy-redis.md).

Attributes, read as scrapy-redis reads them (scrapy_redis/spiders.py ``setup_redis``):

* ``redis_key``: the start key, ``%(name)s`` replaced by the spider's name; default
  ``REDIS_START_URLS_KEY``, else ``"<name>:start_urls"``;
* ``redis_batch_size``: entries a worker takes at a time; default
  ``REDIS_START_URLS_BATCH_SIZE``, else ``CONCURRENT_REQUESTS``;
* ``redis_encoding``: of the entries; default ``REDIS_ENCODING``, else UTF-8.

The key's type is ``REDIS_START_URLS_AS_SET``/``_AS_ZSET``'s, as in scrapy-redis.  An entry
is a URL, or a JSON object with ``url`` and optional ``method`` (default GET) and ``meta``,
its other fields sent as form data (:meth:`RedisMixin.make_request_from_data`); every
request is ``dont_filter`` (an entry pushed twice is fetched twice, as in scrapy-redis).
Without the add-on these spiders have no start requests (nothing reads the key).
"""

from __future__ import annotations

import json
from typing import Any

from scrapy import FormRequest, Request
from scrapy.spiders import CrawlSpider, Spider

#: scrapy-redis's default start key (``%(name)s``: the spider's name)
START_URLS_KEY = "%(name)s:start_urls"


class RedisMixin:
    """Start data from a Redis key, read by the fleet (module docstring)."""

    redis_key: str | None = None
    redis_batch_size: int | None = None
    redis_encoding: str | None = None
    name: str

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)  # type: ignore[misc]
        spider.setup_redis(crawler)
        return spider

    def setup_redis(self, crawler: Any) -> None:
        """Resolve ``redis_key``, ``redis_batch_size`` and ``redis_encoding`` from *crawler*'s
        settings (module docstring).

        Raises:
            ValueError: an empty key, or a batch size that is not a positive integer.
        """
        settings = crawler.settings
        key = self.redis_key or settings.get("REDIS_START_URLS_KEY") or START_URLS_KEY
        self.redis_key = str(key) % {"name": self.name}
        if not self.redis_key.strip():
            raise ValueError("redis_key must not be empty")
        size = self.redis_batch_size or settings.get("REDIS_START_URLS_BATCH_SIZE") or \
            settings.getint("CONCURRENT_REQUESTS", 16)
        try:
            self.redis_batch_size = int(size)
        except (TypeError, ValueError):
            raise ValueError(f"redis_batch_size must be an integer, not {size!r}") from None
        if self.redis_batch_size < 1:
            raise ValueError(f"redis_batch_size must be at least 1, not {size!r}")
        self.redis_encoding = self.redis_encoding or settings.get("REDIS_ENCODING") or "utf-8"

    async def start(self) -> Any:
        """No start requests of its own: the fleet reads ``redis_key``."""
        return
        yield  # an async generator that yields nothing

    def make_request_from_data(self, data: bytes | str) -> Request | None:
        """The request of one start entry *data*: a URL, or a JSON object with ``url``,
        optional ``method`` (upper-cased) and ``meta``, its other fields sent as form data
        (``FormRequest``: in the query string of a GET, the body of a POST).  None for a JSON
        object without ``url`` (the fleet moves the entry to the key's bad list).

        Raises:
            UnicodeDecodeError: *data* is not in ``redis_encoding``.
            ValueError: a JSON object whose ``meta`` is not an object.
        """
        text = data.decode(self.redis_encoding or "utf-8") if isinstance(data, bytes) \
            else data
        fields = _json_object(text)
        if fields is None:
            return FormRequest(text.strip(), dont_filter=True)
        url = fields.pop("url", None)
        if not url:
            return None
        method = str(fields.pop("method", "GET")).upper()
        meta = fields.pop("meta", None) or {}
        if not isinstance(meta, dict):
            raise ValueError(f"meta must be a JSON object, not {meta!r}")
        return FormRequest(str(url), method=method, formdata=fields or None, meta=meta,
                           dont_filter=True)


def _json_object(text: str) -> dict[str, Any] | None:
    """*text* parsed when it is a JSON object, else None (a plain URL)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class RedisSpider(RedisMixin, Spider):
    """A ``scrapy.Spider`` whose start data comes from ``redis_key`` (module docstring)."""


class RedisCrawlSpider(RedisMixin, CrawlSpider):
    """A ``CrawlSpider`` whose start data comes from ``redis_key`` (module docstring)."""
