"""sessions/slots.py ``GiveBacks``: given-back session slots ride on the worker's next call,
or go in one batch of their own a turn of the event loop later (no Redis here: the send is a
recording coroutine)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from scrapy_fleet.sessions.slots import GiveBacks


def test_gives_ride_on_a_call_of_the_same_turn_else_go_in_one_batch():
    sent: list[tuple[str, ...]] = []

    async def send(gives: Sequence[str]) -> None:
        sent.append(tuple(gives))

    async def main() -> dict[str, object]:
        backs = GiveBacks(send)
        backs.add("s-1|a")
        backs.add("s-2|b")
        rode = backs.take()  # a draw of the same turn carries them
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        after_ride = list(sent)
        backs.add("s-1|c")
        backs.add("s-1|d")
        await asyncio.sleep(0)  # nothing took them: one batch, a turn later
        await asyncio.sleep(0)
        batched = list(sent)
        backs.add("s-3|e")
        await backs.flush()  # (closing)
        return {"rode": rode, "after_ride": after_ride, "batched": batched, "end": sent,
                "left": backs.take()}

    out = asyncio.run(main())
    assert out["rode"] == ("s-1|a", "s-2|b")
    assert out["after_ride"] == []
    assert out["batched"] == [("s-1|c", "s-1|d")]
    assert out["end"] == [("s-1|c", "s-1|d"), ("s-3|e",)]
    assert out["left"] == ()


def test_a_failed_send_is_logged_not_raised():
    async def send(gives: Sequence[str]) -> None:
        raise ConnectionError("redis gone")

    async def main() -> None:
        backs = GiveBacks(send)
        backs.add("s-1|a")
        await asyncio.sleep(0)
        await backs.flush()

    asyncio.run(main())  # the tickets run out by themselves
