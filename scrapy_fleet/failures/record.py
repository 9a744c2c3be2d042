"""The record of a request that failed for good, and the reasons it is filed under.

A record travels with the request's acknowledgement (``CallBatch.acks``: the ``Ack`` record's
``failure``, frontier/records.py) and lua/failed.lua stores it in the crawl's ``failed`` hash,
adding the server time (``at``, ms) and the encoded request (``data``, codec.py: never
pickle).  The record is a msgpack map of strings and integers (Redis's cmsgpack reads it)::

    {url, method, reason, message, status, attempts, worker, host, parent}

Reasons (one short, stable name per kind, for counting and ``--reason``):

* ``download/<exception class>``: the download failed after the retries (``TimeoutError``,
  ``DNSLookupError``, ``ConnectionRefusedError``...);
* ``http/<status>``: the final answer's status is one the spider does not handle (Scrapy's
  ``HttpErrorMiddleware`` would raise ``HttpError`` for it), after the retries;
* ``spider/<exception class>``: the callback or errback raised;
* ``item/<exception class>``: an item pipeline raised (other than ``DropItem``) for an
  item the callback yielded: the item was not written;
* ``codec/<exception class>``: a request the callback (or the spider's start) yielded that
  the fleet's codec cannot store (a lambda callback, a meta value it cannot encode): its
  record keeps its URL and its parent's (``parent``), and as its request the parent's, whose
  callback yields it again once the spider is fixed (no request when it has no parent);
* the ``fleet_reason`` attribute of any exception that has one (``proxies.ProxyBanError``
  after the proxy retries, for example), as it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import msgpack

#: longest message kept (characters)
MESSAGE_MAX = 300


@dataclass(frozen=True)
class FailureRecord:
    """One failed request.  ``status``: the last HTTP status (0 when there was no answer);
    ``attempts``: downloads tried (``retry_times + 1``); ``at``: server time in ms (set by
    Redis); ``data``: the encoded request (set by Redis); ``parent``: the URL of the request
    whose callback yielded it, for a request that could not be stored (``codec/...``)."""

    url: str
    method: str
    reason: str
    message: str = ""
    status: int = 0
    attempts: int = 1
    worker: str = ""
    host: str = ""
    parent: str = ""
    at: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        """The msgpack map sent with the acknowledgement (without ``at`` and ``data``)."""
        d = asdict(self)
        del d["at"], d["data"]
        d["message"] = d["message"][:MESSAGE_MAX]
        return msgpack.packb(d, use_bin_type=False)  # Redis's cmsgpack cannot read "bin"

    @classmethod
    def decode(cls, raw: bytes) -> FailureRecord:
        """A record as stored by lua/failed.lua.

        Raises:
            ValueError: *raw* is not such a record.
        """
        try:
            d = msgpack.unpackb(raw, raw=True)
        except Exception as exc:
            raise ValueError(f"unreadable failure record: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError("unreadable failure record: not a map")

        def text(name: str) -> str:
            value = d.get(name.encode(), b"")
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

        def number(name: str) -> int:
            value = d.get(name.encode(), 0)
            return value if isinstance(value, int) else 0

        data = d.get(b"data", b"")
        return cls(url=text("url"), method=text("method"), reason=text("reason"),
                   message=text("message"), status=number("status"),
                   attempts=number("attempts"), worker=text("worker"), host=text("host"),
                   parent=text("parent"), at=number("at"),
                   data=data if isinstance(data, bytes) else b"")

    def to_json(self) -> dict[str, Any]:
        """The record without its encoded request, for ``--json`` listings."""
        d = asdict(self)
        del d["data"]
        return d


def reason_for(exc: BaseException, where: str) -> str:
    """The reason of a failure by exception *exc*, raised by the download (*where*
    ``"download"``), the spider (``"spider"``), an item pipeline (``"item"``) or the codec
    (``"codec"``); ``fleet_reason`` wins when the exception has one."""
    fleet_reason = getattr(exc, "fleet_reason", None)
    if isinstance(fleet_reason, str) and fleet_reason:
        return fleet_reason
    return f"{where}/{type(exc).__name__}"
