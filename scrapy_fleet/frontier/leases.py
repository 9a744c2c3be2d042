"""A worker's leases and buffered requests (the pump's records), and the failure record of a
request the codec cannot store (docs/failures.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_fleet.failures.record import FailureRecord
from scrapy_fleet.frontier.records import Ack
from scrapy_fleet.politeness import hosts as politeness

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_fleet.config import FleetConfig

#: (url, bloom key, priority, payload, host, delay ms, lastmod s) of a buffered request; the
#: payload of a known duplicate is the Request itself and its host "" (encoded only if it
#: must be sent: LeaseBook.materialize, frontier/book.py); lastmod: a sitemap's <lastmod>
#: (0: none; docs/recrawl.md)
Out = tuple[str, bytes, int, "bytes | Request", str, int, int]


class Lease:
    __slots__ = ("children", "downloaded", "entry_id", "failure", "lost", "payload", "report",
                 "revisit", "token", "unstorable", "url")

    def __init__(self, entry_id: str, token: int) -> None:
        self.entry_id = entry_id
        self.token = token
        self.lost = False
        self.downloaded = False  #: its download is over (its host's slot is given back)
        #: its download report (outcome, latency ms, reason, exit id): lua/adaptive.lua
        self.report: tuple[object, ...] | None = None
        self.children: list[Out] = []  #: links found by this request, sent with its ack
        self.failure: bytes | None = None  #: its failure record, sent with its ack
        #: failure records of the links it found that could not be encoded, sent with its ack
        self.unstorable: list[bytes] = []
        self.url = ""  #: its request's URL (set when the engine takes it)
        self.payload = b""  #: its request as leased (encoded)
        #: recrawl: its revisit record, sent with its ack (None: none, b"": not revisited)
        self.revisit: list[object] | bytes | None = None

    def download_report(self) -> tuple[object, ...]:
        """Its download over in a CallBatch: id, token, and its report when it has one."""
        if self.report is None:
            return (self.entry_id, self.token)
        return (self.entry_id, self.token, *self.report)

    def ack(self) -> Ack:
        """Its acknowledgement in a CallBatch (frontier/records.py): id, token, and what goes
        with it (failure record, unstorable links' records, revisit record)."""
        return Ack(self.entry_id, self.token, self.failure, self.unstorable, 0, self.revisit)


def unstorable_record(request: Request, reason: str, message: str, config: FleetConfig,
                      parent_url: str = "") -> bytes:
    """The encoded failure record (``FailureRecord.encode``) of *request*, which the codec
    cannot store (*reason* ``codec/<error class>``, *message* the codec's error);
    *parent_url*: the URL of the leased request whose callback yielded it ("" for none)."""
    return FailureRecord(
        url=request.url, method=request.method, reason=reason, message=message,
        attempts=0, worker=config.worker_id,
        host=politeness.host_key(request.url, config.politeness.host_key),
        parent=parent_url).encode()


def callback_failure(lease: Lease, exc: BaseException, config: FleetConfig) -> bytes:
    """The failure record (``spider/CallbackError``) of leased *lease*, whose entry names a
    callback the spider cannot take (``codec.callback_problem``); sets ``lease.url``."""
    from scrapy_fleet import codec

    try:
        d = codec.decode_dict(lease.payload)
        url, method = str(d.get("url", "")), str(d.get("method") or "GET")
    except ValueError:  # (codec.decode read it before: not reached)
        url, method = "", "GET"
    lease.url = url
    return FailureRecord(url=url, method=method, reason="spider/CallbackError",
                         message=str(exc), worker=config.worker_id,
                         host=politeness.host_key(url, config.politeness.host_key)).encode()
