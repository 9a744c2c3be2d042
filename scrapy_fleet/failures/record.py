"""The record of a request that failed for good, and the reasons it is filed under.

A record travels with the request's acknowledgement (``SyncBatch.acks``, third element) and
lua/failed.lua stores it in the crawl's ``failed`` hash, adding the server time (``at``, ms)
and the encoded request (``data``, codec.py: never pickle).  The record is a msgpack map of
strings and integers (Redis's cmsgpack reads it)::

    {url, method, reason, message, status, attempts, worker, host}

Reasons (one short, stable name per kind, for counting and ``--reason``):

* ``download/<exception class>``: the download failed after the retries (``TimeoutError``,
  ``DNSLookupError``, ``ConnectionRefusedError``...);
* ``http/<status>``: the final answer's status is one the spider does not handle (Scrapy's
  ``HttpErrorMiddleware`` would raise ``HttpError`` for it), after the retries;
* ``spider/<exception class>``: the callback or errback raised;
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
    Redis); ``data``: the encoded request (set by Redis)."""

    url: str
    method: str
    reason: str
    message: str = ""
    status: int = 0
    attempts: int = 1
    worker: str = ""
    host: str = ""
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
                   at=number("at"), data=data if isinstance(data, bytes) else b"")

    def to_json(self) -> dict[str, Any]:
        """The record without its encoded request, for ``--json`` listings."""
        d = asdict(self)
        del d["data"]
        return d


def reason_for(exc: BaseException, where: str) -> str:
    """The reason of a failure by exception *exc*, raised by the download (*where*
    ``"download"``) or the spider (``"spider"``); ``fleet_reason`` wins when the exception has
    one."""
    fleet_reason = getattr(exc, "fleet_reason", None)
    if isinstance(fleet_reason, str) and fleet_reason:
        return fleet_reason
    return f"{where}/{type(exc).__name__}"
