"""Stored responses: what a fetch worker hands to a parse worker through the frontier.

A stored response is a frontier entry of the pseudo-host ``~parse`` (``STAGE_HOST``) whose
payload is format version 2 (version 1 is a request, see codec.py)::

    0x02 msgpack {
      "q": bytes   the request as the response's callback sees it (codec version 1: the
                   request after redirects, with the meta that can travel)
      "u": str     response URL           "s": int   HTTP status
      "h": [[name, [value, ...]], ...]    response headers (bytes)
      "b": bytes   body, zstd-compressed when "z" is "zstd" (Zstandard, RFC 8878), else raw
      "z": str     "zstd" or ""           "c": str   response class (import path)
      "f": [str]   response flags         "p": str|None  protocol   "i": str|None  peer IP
    }

Never pickle: the response class is rebuilt only when it is one of Scrapy's own
(``scrapy.http.*`` subclasses of ``Response``); the request goes through the codec's
allow-list of request classes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import zstandard
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.misc import load_object

from scrapy_fleet import codec
from scrapy_fleet.errors import RequestDecodeError

VERSION = 2
_HEADER = bytes([VERSION])
#: zstd level 3: about 6x on HTML at some 300 MB/s (the library's default level)
ZSTD_LEVEL = 3
#: bodies smaller than this are stored raw (compression would not pay for its frame)
MIN_COMPRESS = 256


def is_stored(payload: bytes) -> bool:
    """Is this frontier payload a stored response (format version 2)?"""
    return payload[:1] == _HEADER


def encode(response: Response, spider: Spider | None) -> bytes:
    """The frontier payload of *response* (see module docstring).

    Raises:
        RequestEncodeError: its request cannot be stored (a callback that is not a spider
            method, a live object in meta).
    """
    request = response.request
    assert request is not None
    body = response.body
    compressed = len(body) >= MIN_COMPRESS
    if compressed:
        body = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
    record = {
        "q": codec.encode(request, spider),
        "u": response.url,
        "s": response.status,
        "h": [[k, list(v)] for k, v in response.headers.items()],
        "b": body,
        "z": "zstd" if compressed else "",
        "c": codec.class_path(type(response)),
        "f": list(response.flags),
        "p": response.protocol,
        "i": str(response.ip_address) if response.ip_address is not None else None,
    }
    return _HEADER + msgpack.packb(record, use_bin_type=True)


@dataclass
class StoredResponse:
    """A decoded stored response; :meth:`response` rebuilds the Response for a request."""

    url: str
    status: int
    headers: list[tuple[bytes, list[bytes]]]
    body: bytes
    cls: type[Response]
    flags: list[str]
    protocol: str | None
    ip: str | None
    size: int  #: bytes of the stored payload

    def response(self, request: Request) -> Response:
        """The response *request*'s callback gets (flag ``fleet-stored`` added)."""
        ip = None
        if self.ip:
            try:
                ip = ipaddress.ip_address(self.ip)
            except ValueError:
                ip = None
        return self.cls(url=self.url, status=self.status, headers=self.headers,
                        body=self.body, flags=[*self.flags, "fleet-stored"], request=request,
                        ip_address=ip, protocol=self.protocol)


def _response_class(path: Any) -> type[Response]:
    if not isinstance(path, str) or not path.startswith("scrapy.http."):
        raise RequestDecodeError(f"stored response class {path!r} is not one of scrapy.http")
    try:
        cls = load_object(path)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise RequestDecodeError(f"cannot import response class {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Response)):
        raise RequestDecodeError(f"{path!r} is not a Response class")
    return cls


def decode(payload: bytes, spider: Spider | None,
           allowed_classes: Iterable[str]) -> tuple[Request, StoredResponse]:
    """The request and the stored response of a format-2 payload.

    Raises:
        RequestDecodeError: corrupt record, unknown compression, a class not allowed.
    """
    try:
        raw = msgpack.unpackb(payload[1:], raw=False)
    except Exception as exc:
        raise RequestDecodeError(f"corrupt stored response: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("q"), bytes):
        raise RequestDecodeError("corrupt stored response: no request")
    request = codec.decode(raw["q"], spider, allowed_classes)
    body = raw.get("b", b"")
    if not isinstance(body, bytes):
        raise RequestDecodeError("corrupt stored response: bad body")
    if raw.get("z") == "zstd":
        try:
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        except zstandard.ZstdError as exc:
            raise RequestDecodeError(f"corrupt stored response body: {exc}") from exc
    elif raw.get("z") not in ("", None):
        raise RequestDecodeError(f"unknown body compression {raw.get('z')!r}")
    try:
        headers = [(bytes(k), [bytes(v) for v in vs]) for k, vs in raw.get("h", [])]
        stored = StoredResponse(
            url=str(raw["u"]), status=int(raw["s"]), headers=headers, body=body,
            cls=_response_class(raw.get("c")), flags=[str(f) for f in raw.get("f", [])],
            protocol=raw.get("p"), ip=raw.get("i"), size=len(payload))
    except (KeyError, TypeError, ValueError) as exc:
        raise RequestDecodeError(f"corrupt stored response: {exc!r}") from exc
    return request, stored
