"""A tracked URL's record for the schedule (lua/step_revisit.lua): its request as it was
leased, with its new state in meta, and where it goes (host, score, interval)."""

from __future__ import annotations

from typing import Any

from scrapy_fleet import codec
from scrapy_fleet.recrawl.schedule import STATE_META_KEY


def with_state(payload: bytes, state: list[Any]) -> bytes:
    """*payload* (an encoded request, codec.py) with meta ``fleet_rv`` set to *state*; a
    pushed start request's mark is dropped (a revisit does not meet ``process_start`` again).

    Raises:
        RequestDecodeError: *payload* is not an encoded request.
        RequestEncodeError: *state* holds a value the codec cannot carry.
    """
    d = codec.decode_dict(payload)
    d.pop(codec.PUSHED_FIELD, None)
    meta = dict(d.get("meta") or {})
    meta[STATE_META_KEY] = state
    d["meta"] = meta
    return codec.encode_dict(d)


def revisit_record(payload: bytes, state: list[Any], interval: float, host: str,
                   priority: int, key: bytes = b"") -> list[Any]:
    """The sixth element of an acknowledgement (frontier/protocol.py): ``[interval ms, host,
    score, payload with state]``, score = -priority (the queue's order); with the request's
    12-byte Bloom *key*, ``[..., key, last fetch (epoch s)]`` besides (the place entry a
    sitemap's ``<lastmod>`` finds it by: lua/step_revisit.lua).

    Raises:
        RequestDecodeError: *payload* is not an encoded request.
        RequestEncodeError: *state* holds a value the codec cannot carry.
    """
    record = [int(interval * 1000), host, -int(priority), with_state(payload, state)]
    if len(key) == 12:
        fetched = state[0] if state and isinstance(state[0], int) else 0
        record += [key, fetched]
    return record
