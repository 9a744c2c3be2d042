"""What the worker's other components may ask of its scheduler: a :class:`LeaseLedger`.

The scheduler (frontier/scheduler.py) publishes its lease book (frontier/book.py) once on
the crawler when it opens (``engine_hooks.publish_ledger``); the middlewares, the failure
watch and the MongoDB pipeline get it with ``engine_hooks.ledger_of(crawler)`` (None when
no fleet scheduler runs) and use these members only, typed, instead of probing the
scheduler with ``getattr``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scrapy import Request


class LeaseLedger(Protocol):
    """The leases this worker holds and what its components tell it about them."""

    #: True while the spider middleware may still push start requests (no idle close)
    start_active: bool

    @property
    def closing(self) -> bool:
        """True once the scheduler closes (its last frontier call is under way or done)."""

    @property
    def draining(self) -> bool:
        """True once the worker drains (SIGTERM): it takes no new work."""

    @property
    def outbox_size(self) -> int:
        """Requests buffered but not pushed yet."""

    def first_unpushed_start(self) -> int | None:
        """The yield index of the first start request not pushed yet, None when all were."""

    def note_parent(self, child: Request, parent: Request | None) -> None:
        """*child* was found on the page of *parent* (the lease its push goes with)."""

    def hold_left(self, host: str) -> float:
        """Seconds *host* is still on hold, as of the last frontier call (no I/O)."""

    def note_hold(self, host: str, seconds: float) -> None:
        """Put *host* on hold for *seconds* at once (the fleet learns it at the next call)."""

    def download_over(self, request: Request, report: tuple[object, ...] | None = None
                      ) -> None:
        """The host's concurrency slot of leased *request* can go; *report*: (outcome 0
        clean / 1 overload / 2 neither, latency ms or -1, reason, proxy exit id or "") for the
        host's adaptive controller (lua/adaptive.lua), sent with the slot."""

    def note_exit_wait(self, request: Request, why: str | None) -> None:
        """*request* waits for a proxy exit (*why*), or no longer (None)."""

    def give_back(self, request: Request) -> bool:
        """Release the lease of *request* to the frontier; False when it is not held."""

    def dead_letter(self, request: Request, reason: str) -> bool:
        """Send leased *request* to the dead letters; False when it is not held."""

    def note_failure(self, request: Request, record: bytes) -> bool:
        """Record *request* as failed (*record*: an encoded FailureRecord) with its
        acknowledgement; False when it is not a lease of this worker."""

    def note_revisit(self, request: Request, state: list[object] | None,
                     interval: float = 0.0) -> bool:
        """recrawl: revisit *request* in *interval* s with *state* (None: not revisited),
        written with its acknowledgement; False when it is not a lease of this worker."""

    def send_safe(self, request: Request) -> bool:
        """May leased *request* leave for the network now (no I/O)?  False while this worker,
        after a stall that may have made it dead to the partition the request was leased
        from, waits for a frontier call to say whether it still holds that lease."""

    def lost_lease(self, request: Request) -> bool:
        """Was *request* leased by this worker, and is that lease lost (leased again
        elsewhere)?"""

    def withhold_acknowledgements(self, reason: str) -> None:
        """Acknowledge nothing more (a sink failed for good): leases go back on expiry."""
