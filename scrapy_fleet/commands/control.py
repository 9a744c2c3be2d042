"""``pause``, ``resume`` and ``host block|unblock`` (issue 34, docs/control.md).

Each writes the control state into every partition of the crawl (lua/control.lua, atomic per
partition): the frontier call reads it atomically there (lua/step_control.lua), so a paused
crawl or host gets no lease from then on.  ``pause`` (of the crawl or of hosts) and ``host
block`` then wait until every live worker reports holding the new generation (its frontier
calls say which it holds: ``ctlseen``), because a worker holds back the requests it leased
before only once it has seen it (frontier/control.py): when the command returns, no request
of the paused crawl or host starts any more.  A worker is live when it called within
:data:`LIVE_MS`; one that does not confirm within ``--wait`` seconds is named, exit status 1.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import sys
import time
from typing import Any

from scrapy_fleet import lua
from scrapy_fleet.commands import push
from scrapy_fleet.frontier import control as worker_control
from scrapy_fleet.frontier.admin import FrontierAdmin
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.politeness.hosts import host_key

#: a worker that called the frontier within this many ms must confirm a pause
LIVE_MS = 15_000
#: seconds a pause waits for the workers' confirmation by default (--wait)
DEFAULT_WAIT = 30.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds of *text*: a positive number with an optional unit ``ms``, ``s`` (default),
    ``m``, ``h`` or ``d`` (``90``, ``1.5m``, ``2h``).

    Raises:
        ValueError: *text* is not of that form, or is 0.
    """
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"cannot read duration {text!r} (a positive number with an "
                         "optional unit ms, s, m, h or d, e.g. 90s, 5m, 2h)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def who() -> str:
    """The operator named in the record: ``user@host`` of this process (the user from the
    environment, else the password database: ``getpass.getuser``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # (no name for this uid)
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"{user}@{socket.gethostname()}"


def _parts(admin: FrontierAdmin, parts: int) -> list[CrawlKeys]:
    return admin.keys.all_partitions(parts) if parts > 1 else [admin.keys]


def write(admin: FrontierAdmin, parts: int, op: str, hosts: list[str], seconds: float,
          why: str) -> int:
    """Write control operation *op* (lua/control.lua) into every partition; returns the
    generation written (the highest: every partition gets the same one unless a command ran
    meanwhile)."""
    script = lua.load(admin.client, "control.lua")
    all_keys = _parts(admin, parts)
    gens = [int((admin.client.get(k.ctl) or b"0").split(b"|")[0] or 0) for k in all_keys]
    proposed = max(gens) + 1
    written = 0
    for k in all_keys:
        reply = script(keys=k.control_keys(),
                       args=[op, proposed, int(seconds * 1000), who(), why, *hosts])
        written = max(written, int(reply[0]))
    return written


def unconfirmed(admin: FrontierAdmin, parts: int, gen: int) -> list[str]:
    """The live workers (a call within LIVE_MS, in any partition) that hold no generation
    >= *gen* yet (their latest report over the partitions) and hold a lease.

    A worker that holds no lease (none under its id in ``held``, read after the control was
    written) cannot start a request before its next frontier call, and that call's lease step
    reads the control atomically: it need not confirm.  So an idle worker, which calls only
    at its heartbeat (FLEET_HEARTBEAT_INTERVAL, 5 s), does not hold the command back."""
    now = admin.server_ms()
    live: set[str] = set()
    seen: dict[str, int] = {}
    all_keys = _parts(admin, parts)
    for k in all_keys:
        live.update(w.decode() for w in admin.client.zrangebyscore(k.workers, now - LIVE_MS,
                                                                   "+inf"))
        for w, g in admin.client.hgetall(k.ctlseen).items():
            seen[w.decode()] = max(seen.get(w.decode(), 0), int(g))
    missing = [w for w in live if seen.get(w, 0) < gen]
    return sorted(w for w in missing if _holds_leases(admin, all_keys, w))


def _holds_leases(admin: FrontierAdmin, all_keys: list[CrawlKeys], worker: str) -> bool:
    """Whether *worker* holds a lease in any partition (its members ``<worker>\t<entry>`` of
    ``held``, lua/step_lease.lua; a stale member left by an acknowledgement counts, which
    only makes the command wait for that worker)."""
    low, high = b"[" + worker.encode() + b"\t", b"[" + worker.encode() + b"\t\xff"
    # (ZRANGE ... BYLEX: a command of the admin role's, as ZRANGEBYLEX is not)
    return any(admin.client.zrange(k.held, low, high, bylex=True, offset=0, num=1)
               for k in all_keys)


def wait_confirmed(admin: FrontierAdmin, parts: int, gen: int, wait: float) -> list[str]:
    """Wait (up to *wait* s) until every live worker holds *gen*; the ones that did not."""
    deadline = time.monotonic() + wait
    while True:
        missing = unconfirmed(admin, parts, gen)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.05)


def host_name(text: str) -> str:
    """The crawl's name of the host an operator typed: *text* as a host name, ``host:port``
    or a URL, lower case, without scheme, port or path (``LOCALHOST:8013`` and
    ``http://localhost:8013/`` are ``localhost``, as ``FLEET_HOST_KEY = "host"`` names it).

    Raises:
        ValueError: *text* names no host (empty, or not a URL's authority).
    """
    text = text.strip()
    if not text:
        raise ValueError("--host needs a host name (got an empty one)")
    try:
        name = host_key(text if "://" in text else f"http://{text}") if text else ""
    except ValueError:
        name = ""
    if not name:
        raise ValueError(f"--host needs a host name (got {text!r})")
    return name


def _hosts_of(opts: Any) -> list[str] | None:
    """The ``--host`` options as host names (None, with one line on stderr, when one names
    no host)."""
    try:
        return [host_name(h) for h in (getattr(opts, "host", None) or [])]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _confirm(admin: FrontierAdmin, parts: int, gen: int, opts: Any, what: str) -> int:
    missing = wait_confirmed(admin, parts, gen, getattr(opts, "wait", None) or DEFAULT_WAIT)
    if missing:
        print(f"warning: {what} is stored (generation {gen}) but {len(missing)} live "
              f"worker(s) did not confirm it in time: {', '.join(missing)}; they may still "
              "start requests until their next frontier call", file=sys.stderr)
        return push.EXIT_REJECTED
    print(f"{what}: every live worker holds it (generation {gen})")
    return push.EXIT_OK


def _bad_wait(opts: Any) -> bool:
    """Whether ``--wait`` is not a positive number of seconds (said in one line)."""
    wait = getattr(opts, "wait", None)
    if wait is None or wait > 0:
        return False
    print(f"error: --wait takes a positive number of seconds (got {wait})", file=sys.stderr)
    return True


def run_pause(admin: FrontierAdmin, urls: list[str], opts: Any, parts: int) -> int:
    """``pause CRAWL [--host H ...] [--for DURATION] [--reason TEXT] [--wait S]``."""
    hosts = _hosts_of(opts)
    if hosts is None or _bad_wait(opts):
        return push.EXIT_ERROR
    seconds = 0.0
    if getattr(opts, "pause_for", None) is not None:
        try:
            seconds = parse_duration(opts.pause_for)
        except ValueError as exc:
            print(f"error: --for: {exc}", file=sys.stderr)
            return push.EXIT_ERROR
    why = opts.reason or ""
    gen = write(admin, parts, "hpause" if hosts else "pause", hosts, seconds, why)
    target = (f"hosts {', '.join(hosts)} of " if hosts else "") + f"crawl {admin.keys.crawl_id!r}"
    span = f" for {seconds:g} s" if seconds else " until resumed"
    return _confirm(admin, parts, gen, opts, f"paused {target}{span}")


def run_resume(admin: FrontierAdmin, urls: list[str], opts: Any, parts: int) -> int:
    """``resume CRAWL [--host H ...]``: leases come back at the workers' next calls."""
    hosts = _hosts_of(opts)
    if hosts is None:
        return push.EXIT_ERROR
    gen = write(admin, parts, "hresume" if hosts else "resume", hosts, 0, opts.reason or "")
    target = (f"hosts {', '.join(hosts)} of " if hosts else "") + f"crawl {admin.keys.crawl_id!r}"
    print(f"resumed {target} (generation {gen})")
    return push.EXIT_OK


def host_override(opts: Any) -> str:
    """The ``"T|burst|cap|rate"`` override of ``host set``'s options (empty parts: kept).

    Raises:
        ValueError: no option, --rate and --delay together, or a value out of range.
    """
    rate, delay, conc = (getattr(opts, n, None) for n in ("set_rate", "set_delay",
                                                          "set_concurrency"))
    if rate is None and delay is None and conc is None:
        raise ValueError("host set needs --rate R, --delay S or --concurrency N (or --clear)")
    if rate is not None and delay is not None:
        raise ValueError("--rate and --delay both set the interval: give one")
    if (rate is not None and not rate > 0) or (delay is not None and not delay >= 0) or (
            conc is not None and conc < 1):
        raise ValueError("--rate must be > 0 (requests/s), --delay >= 0 (s), --concurrency "
                         ">= 1")
    interval, flag = "", ""
    if rate is not None:
        interval, flag = f"{1000 / rate:.3f}", "1"
    elif delay is not None:
        interval, flag = f"{delay * 1000:.3f}", "0"
    return f"{interval}||{conc if conc is not None else ''}|{flag}"


def _host_set(admin: FrontierAdmin, host: str, opts: Any, parts: int) -> int:
    """``host set CRAWL HOST --rate R | --delay S | --concurrency N | --clear``."""
    if getattr(opts, "clear", False):
        gen = write(admin, parts, "hclear", [host], 0, "")
        print(f"cleared the live override of host {host} (generation {gen})")
        return push.EXIT_OK
    try:
        value = host_override(opts)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    gen = write(admin, parts, "hconf", [host, value], 0, "")
    print(f"host {host}: live override {value!r} (T ms|burst|cap|rate) from its next lease "
          f"(generation {gen})")
    return push.EXIT_OK


def run_host(admin: FrontierAdmin, urls: list[str], opts: Any, parts: int) -> int:
    """``host block|unblock|set CRAWL HOST``: a host paused until unblocked (its queue kept),
    or its politeness overridden live."""
    verb = getattr(opts, "host_verb", None)
    if verb not in ("block", "unblock", "set") or len(urls) != 1 or not urls[0].strip():
        print("error: usage: host block|unblock|set CRAWL HOST (one non-empty host)",
              file=sys.stderr)
        return push.EXIT_ERROR
    try:
        host = host_name(urls[0])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return push.EXIT_ERROR
    if _bad_wait(opts):
        return push.EXIT_ERROR
    if verb == "set":
        return _host_set(admin, host, opts, parts)
    if verb == "unblock":
        if not any(admin.client.hexists(k.ctlhosts, host) for k in _parts(admin, parts)):
            # (nothing written: no generation spent on a no-op, no worker asked to confirm)
            print(f"host {host} of crawl {admin.keys.crawl_id!r} was not blocked or paused: "
                  "nothing to unblock")
            return push.EXIT_OK
        gen = write(admin, parts, "hresume", [host], 0, "")
        print(f"unblocked host {host} of crawl {admin.keys.crawl_id!r} (generation {gen})")
        return push.EXIT_OK
    gen = write(admin, parts, "block", [host], 0, opts.reason or "")
    return _confirm(admin, parts, gen, opts,
                    f"blocked host {host} of crawl {admin.keys.crawl_id!r}")


#: the least-privilege role of each action (scrapy_fleet/acl.py): a pause stops the crawl
#: (``host block|unblock|set`` run through commands/host.py, the ``host`` action)
ACL_ROLES = {"pause": "admin", "resume": "admin"}


def ACTIONS(action: Any) -> list[Any]:
    """The rows of cli.ACTIONS for these commands, built with its *action* class."""
    return [
        action("pause", "pause the crawl, or hosts of it (--host): no request starts after "
               "it returns", "[--host H ...] [--for DURATION] [--reason TEXT] [--wait S]",
               lambda c: run_pause(c.crawl, c.urls, c.opts, c.parts), needs_state=True),
        action("resume", "resume a paused crawl, or hosts of it (--host)", "[--host H ...]",
               lambda c: run_resume(c.crawl, c.urls, c.opts, c.parts), needs_state=True),
    ]


def add_arguments(parser: Any) -> None:
    """The options of these commands (``--host`` and ``--reason`` are shared with others)."""
    parser.add_argument("--for", dest="pause_for", default=None, metavar="DURATION",
                        help="pause: resume by itself after DURATION (90s, 5m, 2h; Redis's "
                             "clock)")
    parser.add_argument("--rate", dest="set_rate", type=float, default=None, metavar="R",
                        help="host set: requests/s to the host, fleet-wide (GCRA)")
    parser.add_argument("--delay", dest="set_delay", type=float, default=None, metavar="S",
                        help="host set: seconds between two requests to the host")
    parser.add_argument("--concurrency", dest="set_concurrency", type=int, default=None,
                        metavar="N", help="host set: requests in flight to the host at most")
    parser.add_argument("--clear", action="store_true",
                        help="host set: remove the host's live override")
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT, metavar="SECONDS",
                        help="pause, host block: wait at most this long for every live worker "
                             "to confirm (default %(default)s)")


def read_state(admin: FrontierAdmin) -> dict[str, Any] | None:
    """The crawl's control (frontier/control.py ``read_state``) of the first partition:
    every partition holds all of it."""
    return worker_control.read_state(admin.client, admin.keys, admin.server_ms())
