"""Durable local item sink: one JSON line per item, written before the request is acknowledged.

Scrapy's feed exports (``-O file``) buffer items in memory and know nothing of the fleet's
acknowledgements, so a killed worker can lose the items of requests the fleet already counts
as done.  This pipeline writes each item with one ``write(2)`` on a file opened with
``O_APPEND`` before ``process_item`` returns; the scheduler acknowledges a request only after
the engine has finished with it, which includes the item pipelines of every item it yielded.
With ``FLEET_JSONL_FSYNC = True`` each line is also ``fsync``-ed (survives a power cut, not
only a killed process).

A program reading a file while a worker writes it may find the last line unfinished: Linux
makes one ``write(2)`` visible a page at a time, so a line straddling a 4 KiB boundary can be
read up to the boundary first.  Read up to the last newline (tests/support.py, read_items).
"""

from __future__ import annotations

import json
import os
import re
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from scrapy.exceptions import NotConfigured

from scrapy_fleet.config import FleetConfig
from scrapy_fleet.errors import FleetConfigError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def prepare_path(config: FleetConfig, spider_name: str) -> str:
    """The file ``FLEET_JSONL_PATH`` names for this worker (placeholders filled in), its
    folder created when missing, and checked to be writable: the start-up check calls it
    before the crawl starts (startup.py), the pipeline when it opens.

    Raises:
        FleetConfigError: the path is a folder, its folder cannot be created (a missing
            parent that cannot be made, a file in the way, no permission) or the file cannot
            be opened for appending; the message names the setting, the path and the cause.
    """
    assert config.jsonl.path
    values = {
        "worker": re.sub(r"[^A-Za-z0-9_.-]", "_", config.worker_id),
        "pid": os.getpid(),
        "spider": spider_name,
        "crawl_id": config.crawl_id or spider_name,
    }
    path = config.jsonl.path % values
    if os.path.isdir(path):
        raise FleetConfigError(f"FLEET_JSONL_PATH={config.jsonl.path!r} is invalid: "
                               f"{path!r} is a directory")
    folder = os.path.dirname(path)
    blocking = _file_in_the_way(folder)
    if blocking:
        raise FleetConfigError(f"FLEET_JSONL_PATH={config.jsonl.path!r} is invalid: its folder "
                               f"{folder!r} cannot exist: {blocking!r} is a file")
    try:
        if folder:
            os.makedirs(folder, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as exc:
        raise FleetConfigError(f"FLEET_JSONL_PATH={config.jsonl.path!r} is invalid: cannot "
                               f"write {path!r}: {exc.strerror or exc}") from exc
    return path


def _file_in_the_way(folder: str) -> str:
    """The nearest existing ancestor of *folder* (or itself) when it is not a folder, else
    ``""``."""
    current = os.path.abspath(folder or ".")
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return ""
        current = parent
    return "" if os.path.isdir(current) else current


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if ItemAdapter.is_item(value):
        return ItemAdapter(value).asdict()
    raise TypeError(f"Object of type {type(value).__qualname__} is not JSON serializable")


class JsonLinesPipeline:
    """Append items as JSON lines to ``FLEET_JSONL_PATH``.

    The path may hold ``%(worker)s`` (worker id, made file-name safe), ``%(pid)s``,
    ``%(spider)s`` and ``%(crawl_id)s``.  Stats: ``fleet/jsonl/items``, ``fleet/jsonl/bytes``.

    Raises:
        NotConfigured: when ``FLEET_JSONL_PATH`` is not set (the add-on always lists it).
        TypeError: from ``process_item`` for a field JSON cannot represent (Scrapy counts it
            as an item error; the fleet records the item's request as failed,
            ``item/TypeError``: docs/failures.md).
    """

    def __init__(self, crawler: Crawler, config: FleetConfig) -> None:
        if not config.jsonl.path:
            raise NotConfigured("FLEET_JSONL_PATH is not set")
        self.crawler = crawler
        self.config = config
        self.path = ""
        self._fd: int | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> JsonLinesPipeline:
        return cls(crawler, FleetConfig.from_settings(crawler.settings))

    def open_spider(self, spider: Any = None) -> None:
        spider = spider or self.crawler.spider
        self.path = prepare_path(self.config, getattr(spider, "name", "spider"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def process_item(self, item: Any, spider: Any = None) -> Any:
        assert self._fd is not None
        line = json.dumps(ItemAdapter(item).asdict(), ensure_ascii=False,
                          default=_json_default) + "\n"
        data = line.encode("utf-8")
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if self.config.jsonl.fsync:
            os.fsync(self._fd)
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("fleet/jsonl/items")
            stats.inc_value("fleet/jsonl/bytes", len(data))
        return item

    def close_spider(self, spider: Any = None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
