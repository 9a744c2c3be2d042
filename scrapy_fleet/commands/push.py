"""The push helper: validate URL / JSON request lines and push them into a crawl's frontier.

A line is either a plain URL or a JSON object with the request spec::

    {"url": "https://example.com/", "method": "POST", "headers": {"X-A": "1"},
     "body": "text", "cookies": {"k": "v"}, "meta": {...}, "cb_kwargs": {...},
     "callback": "parse_item", "errback": "on_error", "priority": 10, "dont_filter": false}

A browser page (scrapy-playwright) is asked for in meta, its page methods as objects:
``"meta": {"playwright": true, "playwright_page_methods": [{"method": "wait_for_selector",
"args": ["#done"], "kwargs": {}}]}``.

Every pushed line is a start request of the crawl: the worker that leases it passes it
through the spider middlewares' ``process_start`` before fetching it, as Scrapy does with the
spider's own start requests (``codec.PUSHED_FIELD``; FleetSpiderMiddleware's docstring).

Empty lines and lines starting with ``#`` are skipped.  A bad line is reported with its line
number and reason and skipped; the good lines around it are pushed.  Input is read lazily and
pushed in batches, so a file of any size takes constant memory.

Back pressure: when the frontier holds ``FLEET_QUEUE_MAX`` entries, the frontier script
refuses further pushes; the helper then waits until the frontier is below the low watermark
(``FLEET_QUEUE_LOW_WATERMARK`` of the max) and pushes the refused lines again, showing that it
waits.  With ``no_wait`` it stops instead (exit status 3), as it does when ``timeout``
seconds of waiting have passed.  Nothing is ever pushed past the cap.

Speed: one frontier call is in flight (in a thread, waiting on its socket without the GIL)
while the next batch is read and encoded; a plain URL line with Scrapy's default
fingerprinter skips the Request (:func:`plain_url_entry`: the same URL, payload and
fingerprint, computed directly).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, TextIO
from urllib.parse import urlsplit

import redis
from scrapy import Request

from scrapy_fleet import codec
from scrapy_fleet.commands.pushline import (
    DEFAULT_MAX_URL_LENGTH,
    json_line,
    parse_line,
    plain_url_entry,
)
from scrapy_fleet.errors import (
    FleetError,
    PushLineError,
    RedisUnavailableError,
    RequestEncodeError,
)
from scrapy_fleet.frontier.bloom import bloom_key
from scrapy_fleet.frontier.fingerprint import is_default_fingerprinter
from scrapy_fleet.frontier.protocol import CallResult, FrontierParams
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.redis_client import is_oom

__all__ = ["DEFAULT_MAX_URL_LENGTH", "PushLineError", "parse_line", "plain_url_entry"]

#: exit statuses of the push commands
EXIT_OK = 0
EXIT_REJECTED = 1  #: some lines were invalid (the valid ones were pushed)
EXIT_ERROR = 2  #: usage error, or Redis unreachable
EXIT_FULL = 3  #: the frontier stayed full (--no-wait, or --timeout expired); rest not pushed
EXIT_NO_CRAWL = 4  #: status, dead, failed, retry, top: Redis has no record of that crawl

#: lines per frontier call.  All new URLs over 1,000 hosts, frontier.lua takes ~16 µs of
#: Redis time per line (2026-12-01, bench_push.py --batches, queue buckets and blocked Bloom
#: filter, loaded machine): a call of 100 holds Redis ~1.7 ms, of 200 ~3.1 ms, for 45,300 vs
#: 52,000 URLs/s; 100 keeps every call under 2 ms (issue 12)
BATCH = 100


class PushTarget(Protocol):
    """What :func:`push_lines` pushes into: a crawl's partitions
    (commands/partitioned.py ``PartitionedPush``; one ``FrontierAdmin`` is one partition)."""

    @property
    def keys(self) -> CrawlKeys: ...

    @property
    def params(self) -> FrontierParams: ...

    @property
    def unreplicated(self) -> int: ...

    @property
    def wait_replicas(self) -> int: ...

    def size(self) -> int: ...

    def push(self, pushes: list[tuple[Any, ...]]) -> CallResult: ...


@dataclass
class PushReport:
    """Counts of one push run; ``errors`` holds ``(line number, reason)`` of rejected lines."""

    pushed: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)
    waited: float = 0.0  #: seconds spent waiting for room in the frontier
    stopped_full: bool = False  #: gave up on a full frontier (no_wait or timeout)
    first_unpushed_line: int | None = None  #: where to resume after stopped_full
    #: why it stopped: "frontier" (FLEET_QUEUE_MAX), "host" (FLEET_HOST_QUEUE_MAX of the
    #: first line not pushed), "memory" (Redis answered OOM)
    full_reason: str = ""
    #: the host key of the first line not pushed, when full_reason is "host"
    full_host: str = ""

    @property
    def exit_status(self) -> int:
        if self.stopped_full:
            return EXIT_FULL
        return EXIT_REJECTED if self.rejected else EXIT_OK


#: the byte-order mark some editors write at the start of a UTF-8 file
_BOM = "\ufeff"


def read_lines(sources: Iterable[str],
               files: Iterable[BinaryIO | TextIO]) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of the URL arguments then of each file, lazily; blank lines and
    ``#`` comments of the files skipped (an argument is always judged: an empty one is
    rejected, not dropped).  Line numbers count across the inputs, from 1.  A UTF-8 byte-order
    mark (U+FEFF) at the start of a file or of standard input is dropped.  Files are read as
    bytes: a line that is not UTF-8 keeps its bad bytes as surrogates, which
    :func:`parse_line` rejects, so one bad line never stops the others."""
    n = 0
    for text in sources:
        n += 1
        yield n, text
    for handle in files:
        first = True
        for raw in handle:
            n += 1
            text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            if first:  # a file saved "with BOM" (Notepad, PowerShell's Out-File)
                text, first = text.removeprefix(_BOM), False
            if text.strip() and not text.lstrip().startswith("#"):
                yield n, text


class FrontierFull(FleetError):
    """The frontier stayed full: ``no_wait`` was set or the ``timeout`` expired."""


def wait_for_room(admin: PushTarget, low: int, timeout: float | None,
                  on_wait: Callable[[int, float], None] | None = None,
                  poll: float = 0.5) -> float:
    """Block until the frontier's size is below *low*; returns the seconds waited.

    Raises:
        FrontierFull: *timeout* seconds (total, None = forever) passed first.
    """
    started = time.monotonic()
    while True:
        size = admin.size()
        waited = time.monotonic() - started
        if size < low:
            return waited
        if timeout is not None and waited >= timeout:
            raise FrontierFull(f"frontier still holds {size} entries after {waited:.0f} s")
        if on_wait:
            on_wait(size, waited)
        time.sleep(poll)


def until_memory(write: Callable[[], Any], no_wait: bool, timeout: float | None,
                 on_wait: Callable[[int, float], None] | None = None,
                 pause: float = 1.0) -> float:
    """Run *write* (a push's first writes: the crawl's claims) again every *pause* seconds
    while Redis answers OOM, as :func:`push_lines` does with its batches; returns the seconds
    waited.  *on_wait* is called with ``(-1, seconds so far)`` while it waits.

    Raises:
        FrontierFull: Redis stayed out of memory (*no_wait*, or *timeout* seconds passed).
    """
    waited = 0.0
    while True:
        try:
            write()
            return waited
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            if no_wait or (timeout is not None and waited >= timeout):
                raise FrontierFull(f"Redis is out of memory after {waited:.0f} s") from None
            if on_wait:
                on_wait(-1, waited)
            time.sleep(pause)
            waited += pause


def push_lines(admin: PushTarget, lines: Iterable[tuple[int, str]],
               fingerprint: Callable[[Request], bytes],
               max_url_length: int = DEFAULT_MAX_URL_LENGTH, dont_filter: bool = False,
               priority: int = 0, batch: int = BATCH,
               on_error: Callable[[int, str], None] | None = None,
               on_batch: Callable[[PushReport], None] | None = None,
               low_watermark: int | None = None, no_wait: bool = False,
               timeout: float | None = None,
               on_wait: Callable[[int, float], None] | None = None,
               has_method: Callable[[str], Any] | None = None,
               host_key: Callable[[str], str] | None = None, poll: float = 0.5) -> PushReport:
    """Validate and push *lines* in batches, waiting while the frontier is full.

    *low_watermark* (entries) is where a wait ends; None = the admin's ``queue_max``.
    *host_key* maps a URL to the key of its host (``politeness.host_key`` with the crawl's
    ``FLEET_HOST_KEY``; default: the host name), which the per-host bound and politeness use.
    A refused batch is tried again at most every *poll* seconds (a host at its bound can
    refuse lines while the frontier has room).
    Returns the counts; ``stopped_full`` tells that the frontier stayed full.

    Raises:
        RedisUnavailableError: Redis unreachable (batches already pushed stay pushed); the
            message says how many were pushed and the first line that may not be.
    """
    report = PushReport()
    queue_max = admin.params.queue_max
    low = low_watermark if low_watermark is not None else (queue_max or 0)
    deadline_left = timeout

    # a plain URL line skips the Request when the fingerprint is Scrapy's default one
    fast = is_default_fingerprinter(fingerprint)

    def entries() -> Iterator[tuple[int, tuple[bytes, int, bytes, int, str]]]:
        for lineno, text in lines:
            try:
                if fast and not json_line(text):
                    url, payload, digest = plain_url_entry(text, max_url_length, dont_filter,
                                                           priority)
                    key = b"" if dont_filter else bloom_key(digest)
                    line_priority = priority
                else:
                    request, d = parse_line(text, max_url_length, dont_filter, priority,
                                            has_method)
                    payload = codec.encode_dict(d)
                    url, line_priority = request.url, request.priority
                    key = b"" if request.dont_filter else bloom_key(fingerprint(request))
            except (PushLineError, RequestEncodeError) as exc:
                report.rejected += 1
                if len(report.errors) < 1000:
                    report.errors.append((lineno, str(exc)))
                if on_error:
                    on_error(lineno, str(exc))
                continue
            host = host_key(url) if host_key else urlsplit(url).hostname or ""
            yield lineno, (key, line_priority, payload, 0, host)

    pending: list[tuple[int, tuple[bytes, int, bytes, int, str]]] = []
    source = entries()
    exhausted = False

    def fill(into: list[Any], n: int) -> None:
        nonlocal exhausted
        while not exhausted and len(into) < n:
            try:
                into.append(next(source))
            except StopIteration:
                exhausted = True

    # one call in flight while the next batch is read and encoded (the call's thread waits
    # on the socket, without the GIL): Redis and the encoding overlap
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return _push_loop(admin, pending, fill, batch, report, queue_max, low, no_wait,
                          deadline_left, on_batch, on_wait, poll, pool)
    finally:
        pool.shutdown(wait=True)


def _push_loop(admin: PushTarget, pending: list[Any], fill: Callable[[list[Any], int], None],
               batch: int, report: PushReport, queue_max: int | None, low: int, no_wait: bool,
               deadline_left: float | None, on_batch: Callable[[PushReport], None] | None,
               on_wait: Callable[[int, float], None] | None, poll: float,
               pool: ThreadPoolExecutor) -> PushReport:
    while True:
        fill(pending, batch)
        if not pending:
            return report
        sent = pending[:batch]
        future = _submit(pool, admin.push, [entry for _, entry in sent])
        upcoming: list[Any] = []
        fill(upcoming, batch - (len(pending) - len(sent)))
        try:
            result = future.result()
        except RedisUnavailableError as exc:
            # what was pushed and from where to resume: the batch in flight may or may not
            # have been written (its reply was lost)
            raise RedisUnavailableError(
                f"{exc}; {report.pushed} pushed and {report.duplicates} duplicates before "
                f"(lines before {sent[0][0]}); line {sent[0][0]} and those after it are not "
                "pushed, or not all (the reply of their call was lost): pushing the same "
                "lines again is safe (the dupefilter drops those that are there; with "
                f"--dont-filter, push from line {sent[0][0]}: up to {len(sent)} of them "
                "twice)") from exc
        except redis.ResponseError as exc:
            pending.extend(upcoming)
            if not is_oom(exc):
                raise
            # Redis is out of memory: the call changed nothing; wait like for a full frontier
            if no_wait or (deadline_left is not None and deadline_left <= 0):
                report.stopped_full = True
                report.first_unpushed_line = pending[0][0]
                report.full_reason = "memory"
                return report
            if on_wait:
                on_wait(-1, report.waited)
            time.sleep(1.0)
            report.waited += 1.0
            if deadline_left is not None:
                deadline_left -= 1.0
            continue
        report.pushed += result.pushed
        report.duplicates += result.duplicates
        refused = set(result.refused)
        retry = [p for i, p in enumerate(sent) if i in refused]
        pending[:] = retry + pending[len(sent):] + upcoming
        if on_batch:
            on_batch(report)
        if not retry:
            continue
        reason = "frontier" if queue_max and result.size >= queue_max else "host"
        if no_wait or (deadline_left is not None and deadline_left <= 0):
            return _stopped_full(report, pending, reason)
        try:
            waited = wait_for_room(admin, max(low, 1), deadline_left, on_wait, poll)
        except FrontierFull:
            return _stopped_full(report, pending, reason)
        if waited < poll:  # refused by a host's bound: the frontier has room, the host not
            time.sleep(poll - waited)
            waited = poll
        report.waited += waited
        if deadline_left is not None:
            deadline_left -= waited


def _submit(pool: ThreadPoolExecutor, call: Callable[[Any], Any], arg: Any) -> Future[Any]:
    """``pool.submit(call, arg)``, returning once the pool's thread runs *call*.

    Without the wait the caller keeps the GIL: the thread that would send the call waits
    for it up to ``sys.getswitchinterval()`` (5 ms), longer than the caller takes to encode
    the next batch, and the call would not overlap the encoding at all.  Waiting here
    releases the GIL; the thread then holds it until the socket write or read inside *call*
    releases it again, by which time the request is on its way to Redis."""
    started = threading.Event()

    def run() -> Any:
        started.set()
        return call(arg)

    future = pool.submit(run)
    started.wait()
    return future


def _stopped_full(report: PushReport, pending: list[tuple[int, tuple[Any, ...]]],
                  reason: str) -> PushReport:
    """*report* for a push that gave up on a full frontier (*reason* "frontier" or "host")
    with the lines *pending* not pushed; names the host of the first one when it is full."""
    report.stopped_full = True
    report.first_unpushed_line = pending[0][0]
    report.full_reason = reason
    report.full_host = pending[0][1][4] if reason == "host" else ""
    return report


def default_fingerprinter() -> Callable[[Request], bytes]:
    """Scrapy's default request fingerprinter (what a project uses unless it sets
    ``REQUEST_FINGERPRINTER_CLASS``)."""
    from scrapy.utils.request import RequestFingerprinter

    return RequestFingerprinter().fingerprint


def print_error(lineno: int, reason: str) -> None:
    print(f"line {lineno}: rejected: {reason}", file=sys.stderr)
