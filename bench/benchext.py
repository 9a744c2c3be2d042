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

Where the rest of the crawl's time went, from engine start to the last item:
``blocked_at_last_item`` is the time the event loop sat in its selector (``select``/``epoll``:
nothing to run, waiting for a socket or a timer), ``runq_at_last_item`` the time the main
thread was runnable but waiting for a processor (``/proc/self/task/TID/schedstat``, field 2:
preempted by other processes; None where the kernel has no schedstat).
"""

from __future__ import annotations

import asyncio
import json
import threading
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
        self.blocked = 0.0  # seconds the event loop sat in its selector since engine start
        self.blocked_at_last_item = 0.0
        self.runq_at_engine_started: float | None = None
        self.runq_at_last_item: float | None = None

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
        self.runq_at_engine_started = self._runq()
        selector = getattr(asyncio.get_event_loop(), "_selector", None)
        if selector is not None:
            select = selector.select

            def timed_select(timeout: float | None = None) -> Any:
                t0 = time.perf_counter()
                try:
                    return select(timeout)
                finally:
                    self.blocked += time.perf_counter() - t0

            selector.select = timed_select

    @staticmethod
    def _runq() -> float | None:
        """Seconds the calling thread has waited on a run queue (Linux schedstat)."""
        try:
            with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as fh:
                return int(fh.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def on_item(self, item: Any, response: Any, spider: Any) -> None:
        now = time.time()
        if self.first_item is None:
            self.first_item = now
        self.last_item = now
        self.cpu_at_last_item = time.process_time()
        self.blocked_at_last_item = self.blocked
        runq = self._runq()
        if runq is not None and self.runq_at_engine_started is not None:
            self.runq_at_last_item = runq - self.runq_at_engine_started
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
                       "blocked_at_last_item": self.blocked_at_last_item,
                       "runq_at_last_item": self.runq_at_last_item,
                       "reason": reason, "stats": stats}, fh, default=str)
