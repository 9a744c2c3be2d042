"""Scrapy extension used by the benchmarks (enabled on the command line, never by a project).

``-s 'EXTENSIONS={"benchext.BenchStats": 0}' -s BENCH_STATS_PATH=FILE`` writes, when the
spider closes, one JSON object to FILE::

    {"engine_started": t, "first_item": t, "last_item": t, "items": n, "closed": t,
     "cpu_at_engine_started": c, "cpu_at_last_item": c,
     "roundtrips_at_last_item": n, "stats": {...every Scrapy stat, datetimes as ISO...}}

``roundtrips_at_last_item`` is the ``fleet/redis/roundtrips`` stat when the last item was
scraped: the calls of the crawl itself, without those of the idle wait before closing.

Times are ``time.time()`` seconds of the worker process; ``cpu_at_*`` are its CPU seconds
(``time.process_time()``: user + system, every thread), so the CPU of the crawl itself is
``cpu_at_last_item - cpu_at_engine_started`` (start-up and the idle wait left out).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured


class BenchStats:
    def __init__(self, crawler: Any, path: str) -> None:
        self.crawler = crawler
        self.path = path
        self.engine_started: float | None = None
        self.cpu_at_engine_started: float | None = None
        self.cpu_at_last_item: float | None = None
        self.first_item: float | None = None
        self.last_item: float | None = None
        self.items = 0
        self.roundtrips_at_last_item = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> BenchStats:
        path = crawler.settings.get("BENCH_STATS_PATH")
        if not path:
            raise NotConfigured("BENCH_STATS_PATH not set")
        ext = cls(crawler, path)
        crawler.signals.connect(ext.on_engine_started, signal=signals.engine_started)
        crawler.signals.connect(ext.on_item, signal=signals.item_scraped)
        crawler.signals.connect(ext.on_closed, signal=signals.spider_closed)
        return ext

    def on_engine_started(self) -> None:
        self.engine_started = time.time()
        self.cpu_at_engine_started = time.process_time()

    def on_item(self, item: Any, response: Any, spider: Any) -> None:
        now = time.time()
        if self.first_item is None:
            self.first_item = now
        self.last_item = now
        self.cpu_at_last_item = time.process_time()
        self.items += 1
        self.roundtrips_at_last_item = self.crawler.stats.get_value("fleet/redis/roundtrips", 0)

    def on_closed(self, spider: Any, reason: str) -> None:
        stats = {k: (v.isoformat() if isinstance(v, datetime) else v)
                 for k, v in self.crawler.stats.get_stats().items()}
        with open(self.path, "w", encoding="utf-8") as fh:
            json.dump({"engine_started": self.engine_started, "first_item": self.first_item,
                       "last_item": self.last_item, "items": self.items, "closed": time.time(),
                       "cpu_at_engine_started": self.cpu_at_engine_started,
                       "cpu_at_last_item": self.cpu_at_last_item,
                       "roundtrips_at_last_item": self.roundtrips_at_last_item,
                       "reason": reason, "stats": stats}, fh, default=str)
