"""The pump's wait for a poke (:func:`wait_set`), apart from frontier/pump.py to keep that
module's size in bounds."""

from __future__ import annotations

import asyncio

__all__ = ["wait_set"]


async def wait_set(event: asyncio.Event, timeout: float) -> None:
    """Wait until *event* is set, setting it after *timeout* seconds if nothing else does
    (so it is always set on return; a pump woken by its poll timer does what a poke asks).

    ``asyncio.wait_for(event.wait(), timeout)`` runs the wait in a task of its own: its caller
    resumes two loop turns after ``set()`` (here one), and three on an event set already (the
    pump's usual case: poked during its previous call; here none).  On a worker's loop each
    turn lasts as long as the callbacks queued before it (parsing), so every freed host slot
    reached the frontier that much later (tests/unit/test_pump_wake.py counts the turns).
    """
    if event.is_set():
        return
    timer = asyncio.get_running_loop().call_later(timeout, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()
