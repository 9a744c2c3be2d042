"""The pump's wait for a poke (frontier/pump.py wait_set): one loop turn, a timer otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from scrapy_fleet.frontier.wake import wait_set


async def _turns_after_set(wait: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Loop turns from ``set()`` of an event that ``wait(event)`` is waiting on to the
    moment ``wait`` returns (1: the turn right after the one that set it)."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    turns = 0
    resumed_at: list[int] = []

    async def waiter() -> None:
        await wait(event)
        resumed_at.append(turns)

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)  # the waiter is waiting now

    def tick() -> None:
        nonlocal turns
        turns += 1
        if not task.done():
            loop.call_soon(tick)

    loop.call_soon(tick)  # runs first in each turn: counts the turns
    event.set()
    await task
    return resumed_at[0]


def test_a_poke_resumes_the_waiter_at_the_next_loop_turn():
    async def old(event: asyncio.Event) -> None:  # what the pump did before
        await asyncio.wait_for(event.wait(), 30.0)

    async def main() -> tuple[int, int]:
        return (await _turns_after_set(lambda event: wait_set(event, 30.0)),
                await _turns_after_set(old))

    ours, wait_for = asyncio.run(main())
    assert ours == 1
    assert wait_for == 2


async def _turns_when_set(wait: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Loop turns ``wait(event)`` takes on an event that is set already."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    event.set()
    turns = 0
    done = False

    def tick() -> None:
        nonlocal turns
        turns += 1
        if not done:
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.sleep(0)
    before = turns
    await wait(event)
    done = True
    return turns - before


def test_an_event_set_during_the_call_costs_no_loop_turn():
    # the pump's usual case on a busy worker: poked while its frontier call was under way
    async def old(event: asyncio.Event) -> None:
        await asyncio.wait_for(event.wait(), 30.0)

    async def main() -> tuple[int, int]:
        return (await _turns_when_set(lambda event: wait_set(event, 30.0)),
                await _turns_when_set(old))

    assert asyncio.run(main()) == (0, 3)


def test_the_timeout_sets_the_event():
    async def main() -> list[tuple[str, bool]]:
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, bool]] = []
        # the loop runs timers in the order of their due times: this one, due before the
        # wait's timeout (set after it), sees the wait going on, however slow the machine
        loop.call_later(0.02, lambda: seen.append(("before the timeout, over", task.done())))
        task = asyncio.ensure_future(wait_set(event, 0.05))
        await task
        seen.append(("returned, event set", event.is_set()))
        return seen

    assert asyncio.run(main()) == [("before the timeout, over", False),
                                   ("returned, event set", True)]


def test_a_cancelled_wait_leaves_no_timer_to_set_the_event_later():
    async def main() -> bool:
        event = asyncio.Event()
        waiter = asyncio.ensure_future(wait_set(event, 0.05))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await asyncio.sleep(0.15)  # past the timeout
        return event.is_set()

    assert asyncio.run(main()) is False
