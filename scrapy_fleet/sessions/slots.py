"""The session slots a worker gives back (politeness per session, issue 32 item 5,
docs/sessions.md "Politeness per session").

A request of a capped session holds one of its slots from its draw (or pin) until its answer
or failure; giving it back needs a Redis call.  :class:`GiveBacks` keeps the slots to give
back so that they ride on the worker's next sessions call (a draw, pin or take carries them:
lua/sessions.lua frees them before its own work, in the same script call), and sends those
that no such call took by the next turn of the event loop in one call of their own (``gives``).
So a slot is free again at most one turn of the loop after its answer, and a worker whose
answers and next requests meet (as a busy worker's do) pays no round trip for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

logger = logging.getLogger(__name__)


class GiveBacks:
    """Slots (``"<session id>|<ticket>"``) to give back; *send* frees a batch of them in
    Redis (``SessionPools.give_all`` with the worker's back-off).  Must be used on the
    running asyncio loop."""

    def __init__(self, send: Callable[[Sequence[str]], Awaitable[object]]) -> None:
        self._send = send
        self._pending: list[str] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, slot: str) -> None:
        """Give *slot* back with the next sessions call, at the latest at the next turn of
        the event loop."""
        self._pending.append(slot)
        if not self._scheduled:
            self._scheduled = True
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (a signal sent outside the loop's callbacks)
                loop = asyncio.get_event_loop()
            loop.call_soon(self._send_rest)

    def take(self) -> tuple[str, ...]:
        """The slots to give back, handed to the caller's call (which must send them)."""
        pending, self._pending = tuple(self._pending), []
        return pending

    def _send_rest(self) -> None:
        self._scheduled = False
        pending = self.take()
        if pending:
            self._tasks.add(task := asyncio.ensure_future(self._give(pending)))
            task.add_done_callback(self._tasks.discard)

    async def _give(self, pending: Sequence[str]) -> None:
        try:
            await self._send(pending)
        except Exception as exc:  # (a closing worker, Redis gone: the tickets run out)
            logger.debug("giving back %d session slots failed: %r", len(pending), exc)

    async def flush(self) -> None:
        """Send what is pending now and wait for the sends under way (the worker closes)."""
        pending = self.take()
        if pending:
            await self._give(pending)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
