"""``scrapy fleet host SUBCOMMAND CRAWL HOST [...]``: operations on one host of a crawl (issue
34 item 2; docs/control.md).  :data:`SUBCOMMANDS` maps each subcommand to its handler: this
module has ``drop``; ``block``, ``unblock`` and ``set`` are commands/control.py's (state the
lease step reads).

The command line reads ``host drop CRAWL HOST``: cli.py and fleet.py move the subcommand
after the crawl (:func:`reorder`), so that the action sees ``CRAWL`` as its crawl and
``[SUBCOMMAND, HOST, ...]`` as its arguments.  Runs as the ``admin`` ACL role.

``drop`` deletes the host's queued entries (or moves them into the dead letters with reason
``dropped``, ``--dead-letter``) in slices of :data:`SLICE` entries, one atomic call of
lua/host_drop.lua each, so no Redis command runs long; every count stays exact (the queue's,
the host's, ``pushed = acked + dead_lettered + dropped + in the frontier``).  The host's
leased and deferred entries are left to finish.  Exit statuses: 0 done; 1 declined (no
``--yes`` and the answer was not yes); 2 bad input (no host, an unknown subcommand); 4 an
unknown crawl; 1 a host the crawl does not have.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from scrapy_fleet import lua
from scrapy_fleet.commands import control, push
from scrapy_fleet.frontier import listing
from scrapy_fleet.keys.calls import DROP_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.partition import partition_of

#: entries removed per call of lua/host_drop.lua (each call well under 10 ms:
#: bench/bench_host_drop.py); into the dead letters (a msgpack record and an HSET field each)
SLICE = 2000
SLICE_DEAD = 500


def reorder(args: list[str]) -> list[str]:
    """Positional arguments ``host SUB CRAWL REST...`` (a known SUB) as ``host CRAWL SUB
    REST...``; others unchanged (:func:`usage_error` then refuses an unknown SUB)."""
    if (len(args) >= 3 and args[0] == "host" and args[1] in SUBCOMMANDS
            and args[2] not in SUBCOMMANDS):
        return [args[0], args[2], args[1], *args[3:]]
    return args


def usage_error(args: list[str]) -> str | None:
    """The one line refusing ``host CRAWL SUB ...`` arguments (*args*: after the crawl) whose
    SUB is not a subcommand, before Redis is asked anything; None when they are fine."""
    if args and args[0] in SUBCOMMANDS:
        return None
    got = repr(args[0]) if args else "none"
    return f"error: host takes a subcommand: {', '.join(SUBCOMMANDS)} (got {got})"


def drop(client: Any, keys: CrawlKeys, host: str, dead_letter: bool,
         on_slice: Callable[[int, int, float], None] | None = None) -> int:
    """Remove *host*'s queued entries (*keys*: its partition's) in slices of :data:`SLICE`
    (:data:`SLICE_DEAD` into the dead letters);
    returns how many.  *on_slice(removed, left, seconds)* is called after each slice.

    Raises:
        redis.RedisError: when Redis cannot be reached (the slices done stay done; run it
            again to go on).
    """
    script = lua.load(client, "host_drop.lua")
    call_keys = keys.call_keys(DROP_CALL)
    total = 0
    while True:
        t0 = time.perf_counter()
        removed, left = script(keys=call_keys, args=[host, SLICE_DEAD if dead_letter else SLICE,
                                                     "1" if dead_letter else "0"])
        total += int(removed)
        if on_slice is not None:
            on_slice(int(removed), int(left), time.perf_counter() - t0)
        if int(left) == 0 or int(removed) == 0:
            return total


def run_drop(ctx: Any, args: list[str]) -> int:
    """``host drop CRAWL HOST [--dead-letter] [--yes]``."""
    if len(args) != 1:
        print("error: host drop takes one HOST", file=sys.stderr)
        return push.EXIT_ERROR
    host = args[0]
    keys = ctx.crawl.keys
    if ctx.parts > 1:
        keys = keys.partition(partition_of(host, ctx.parts), ctx.parts)
    client = ctx.crawl.client
    if not listing.host_known(client, keys, host):
        print(f"error: crawl {ctx.crawl.keys.crawl_id!r} has no host {host!r} (see "
              "`hosts CRAWL`)", file=sys.stderr)
        return push.EXIT_REJECTED
    where = "into the dead letters (reason dropped)" if ctx.opts.dead_letter else "for good"
    if not ctx.opts.yes:
        try:
            answer = ctx.confirm(f"drop the queued entries of host {host!r} of crawl "
                                 f"{ctx.crawl.keys.crawl_id!r} {where}? [y/N] ")
        except (EOFError, OSError):  # (no terminal: no)
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("declined: nothing dropped")
            return push.EXIT_REJECTED
    total = drop(client, keys, host, ctx.opts.dead_letter)
    print(f"dropped {total} queued entries of host {host!r} {where} (crawl "
          f"{ctx.crawl.keys.crawl_id!r}; its leased and deferred entries are left to finish)")
    return push.EXIT_OK


def _control(verb: str) -> Callable[[Any, list[str]], int]:
    """The handler of ``host VERB CRAWL HOST`` for a verb of commands/control.py (block,
    unblock, set: state the lease step reads)."""
    def run(ctx: Any, args: list[str]) -> int:
        ctx.opts.host_verb = verb
        return control.run_host(ctx.crawl, args, ctx.opts, ctx.parts)
    return run


#: subcommand -> handler(ctx, its arguments after the subcommand)
SUBCOMMANDS: dict[str, Callable[[Any, list[str]], int]] = {
    "drop": run_drop, "block": _control("block"), "unblock": _control("unblock"),
    "set": _control("set")}


def run_host(ctx: Any) -> int:
    """The ``host`` action: ``ctx.urls`` is ``[SUBCOMMAND, ARGS...]``."""
    if error := usage_error(ctx.urls):
        print(error, file=sys.stderr)
        return push.EXIT_ERROR
    return SUBCOMMANDS[ctx.urls[0]](ctx, ctx.urls[1:])


def add_arguments(parser: Any) -> None:
    """The options of ``host`` (``--yes`` is purge's too)."""
    parser.add_argument("--dead-letter", action="store_true",
                        help="host drop: move the entries into the dead letters (reason "
                             "dropped) instead of deleting them")


#: the action's row (registry.py ``Action`` keyword arguments)
ROW: dict[str, Any] = {
    "name": "host", "summary": "operate on one host of the crawl: drop (its queued entries, "
    "in bounded slices), block|unblock (no lease, queue kept), set (a live politeness "
    "override)", "args": "drop|block|unblock|set HOST [--dead-letter] [--yes] [--reason TEXT] "
    "[--wait S] [--rate R | --delay S] [--concurrency N] [--clear]", "run": run_host,
    "takes_urls": True, "needs_state": True}
#: its ACL role (registry.py ACL_ROLES)
ROLES = {"host": "admin"}
