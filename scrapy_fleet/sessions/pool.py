"""Session records and pools in Redis (issue 32 items 2 and 4, docs/sessions.md).

A pool (by default one per site: the request's host) holds ``FLEET_SESSION_POOL_SIZE``
drawable sessions.  A session is a record (HASH ``keys.CrawlKeys.session(id)``: pool, state,
reason, uses, errors, created, last_used, generation, jar, exit, owner...), its id
``"<pool part>-<n>"`` (:func:`~scrapy_fleet.keys.naming.session_pool_part`), and its cookies are the
fleet cookie jar named :func:`jar_name` (sessions/jar.py).  Every operation is one call of
lua/sessions.lua (atomic): :class:`SessionPools` for the workers (redis-py asyncio), the
functions at the end for ``scrapy fleet sessions`` (a blocking client).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scrapy_fleet import lua
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.keys.naming import session_pool_part
from scrapy_fleet.sessions.settings import SessionConfig

#: ``meta`` key: the proxy exit of the request's session (set by the sessions middleware from
#: its record, "" while unbound; read by the proxy middleware, issue 32 item 3)
EXIT_META = "fleet_session_exit"
#: the reasons a session is retired for when its exit can no longer carry it
EXIT_REASONS = ("exit_banned", "exit_dead", "exit_drained")
#: the record fields ``scrapy fleet sessions`` shows, in order
RECORD_FIELDS = ("pool", "state", "reason", "uses", "errors", "generation", "created",
                 "last_used", "retired_at", "exit")


def jar_name(session_id: str) -> str:
    """The fleet cookie jar (``meta["cookiejar"]``) of pool session *session_id*."""
    return "session:" + session_id


def pool_part_of(session_id: str) -> str:
    """The pool part of a session id (``"<pool part>-<n>"``).

    Raises:
        ValueError: *session_id* is not of that form.
    """
    part, sep, n = session_id.rpartition("-")
    if not sep or not part or not n.isdigit():
        raise ValueError(f"{session_id!r} is not a session id (<pool>-<number>)")
    return part


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Drawn:
    """A session as a worker sees it: ``state`` (new, relogin, active, retired, unknown;
    claim's ``claimed``/``wait``; done's ``lost``), ``generation`` (its login count) and
    ``exit`` (the proxy exit it is bound to, "" none or not known from the reply)."""

    id: str
    state: str
    generation: int
    exit: str = ""
    #: the slot a draw or pin with a :class:`SlotAsk` got: ``taken`` (the ticket's), ``wait``
    #: (none free: ask again in :attr:`wait` seconds), "" (nothing asked or not active)
    slot: str = ""
    wait: float = 0.0

    @property
    def jar(self) -> str:
        return jar_name(self.id)


@dataclass(frozen=True)
class SlotAsk:
    """The slot work a draw, pin or take call does besides its own (politeness per session):
    free the slots *gives* (``"<session id>|<ticket>"``: the answers since the worker's last
    call), then take a slot named *ticket* ("" none) that runs out after *ttl* seconds."""

    ticket: str = ""
    ttl: float = 0.0
    gives: Sequence[str] = ()


class SessionPools:
    """The session pools of one crawl, through a redis-py asyncio client.

    Raises:
        redis.RedisError, OSError: from any call when Redis fails.
    """

    def __init__(self, client: Any, keys: CrawlKeys, config: SessionConfig,
                 login: bool) -> None:
        """*login*: new sessions need a login (the spider declares one)."""
        self.client = client
        self.keys = keys
        self.config = config
        self.login = login
        self._script = lua.load(client, "sessions.lua")

    def _keys(self, part: str, session_id: str = "") -> list[str]:
        return script_keys(self.keys, part, session_id)

    async def _on(self, op: str, session_id: str, *args: Any) -> list[Any]:
        return await _on_session(self._script, self.keys, op, session_id, *args)

    def _drawn(self, session_id: str, reply: list[Any]) -> Drawn:
        return drawn_of(session_id, reply)

    def _slot_args(self, ask: SlotAsk | None) -> list[Any]:
        """The SLOT arguments of lua/sessions.lua for *ask* (none: nothing freed or taken)."""
        if ask is None:
            return []
        c = self.config
        return [self.keys.session_slots_prefix, " ".join(ask.gives), ask.ticket,
                c.concurrency, int(c.delay * 1000), int(ask.ttl * 1000)]

    async def draw(self, pool: str, ask: SlotAsk | None = None) -> Drawn:
        """The least used drawable session of *pool* (created when the pool has fewer than
        ``pool_size``; past ``max_uses``/``max_age``/``max_idle`` retired first), one use
        counted; with *ask*, in the same call, its gives freed and (the session being
        active) a slot taken: :attr:`Drawn.slot`."""
        part = session_pool_part(pool)
        c = self.config
        reply = await self._script(keys=self._keys(part), args=[
            "draw", pool, part, self.keys.session_prefix, c.pool_size, c.max_uses,
            int(c.max_age * 1000), int(self.login), int(c.max_idle * 1000),
            *self._slot_args(ask)])
        return Drawn(_text(reply[0]), _text(reply[1]), int(reply[2]),
                     _text(reply[3]) if len(reply) > 3 else "", *_slot_of(reply, 4))

    async def pin(self, session_id: str, ask: SlotAsk | None = None) -> Drawn:
        """Session *session_id*, one use counted (state ``unknown``: no such record;
        ``retired``: retired, now by its limits or before); with *ask*, as :meth:`draw`."""
        reply = await self._on("pin", session_id, self.config.max_uses,
                               int(self.config.max_age * 1000),
                               int(self.config.max_idle * 1000), *self._slot_args(ask))
        if len(reply) < 5:
            return self._drawn(session_id, reply)
        return Drawn(session_id, _text(reply[0]), int(reply[1]), _text(reply[2]),
                     *_slot_of(reply, 3))

    async def state(self, session_id: str) -> Drawn:
        return self._drawn(session_id, await self._on("state", session_id))

    async def claim(self, session_id: str, worker: str) -> Drawn:
        """Claim *session_id*'s login (state ``claimed``: the caller runs it; ``wait``:
        another worker holds the claim)."""
        return self._drawn(session_id, await self._on(
            "claim", session_id, worker, int(self.config.login_timeout * 1000)))

    async def done(self, session_id: str, worker: str, ok: bool, reason: str = "") -> Drawn:
        """End *worker*'s login of *session_id*: active at a new generation, or retired
        with *reason* (state ``lost``: the claim had run out and was taken over)."""
        return self._drawn(session_id, await self._on("done", session_id, worker, int(ok),
                                                      reason))

    async def relogin(self, session_id: str, generation: int) -> Drawn:
        """A response of *generation* failed the validity check: the session needs a login
        (once per generation), or is retired (reason ``check``) at ``max_errors``."""
        return self._drawn(session_id, await self._on("relogin", session_id, generation,
                                                      self.config.max_errors))

    async def passed(self, session_id: str, generation: int) -> None:
        """A response of *generation* passed the validity check (the errors in a row: 0)."""
        await self._on("ok", session_id, generation)

    async def retire(self, session_id: str, reason: str) -> bool:
        """Retire *session_id* with *reason*; False when it was retired already."""
        return bool((await self._on("retire", session_id, reason))[0])

    async def take(self, session_id: str, ticket: str, ttl: float,
                   gives: Sequence[str] = ()) -> tuple[str, float]:
        """A slot for one request of *session_id* (``FLEET_SESSION_CONCURRENCY`` requests in
        flight, ``FLEET_SESSION_DELAY`` between two): (``"taken"``, 0), (``"wait"``, seconds
        to wait before asking again), or (``"retired"``/``"unknown"``, 0).  *ticket* names
        the slot; it runs out after *ttl* seconds (a dead worker's).  The slots *gives* are
        freed first, in the same call."""
        c = self.config
        extra = [self.keys.session_slots_prefix, " ".join(gives)] if gives else []
        reply = await self._on("take", session_id, ticket, c.concurrency, int(c.delay * 1000),
                               int(ttl * 1000), *extra)
        state = _text(reply[0])
        return state, (int(reply[1]) / 1000 if state == "wait" else 0.0)

    async def give(self, session_id: str, ticket: str) -> bool:
        """Free *ticket*'s slot of *session_id*; False when it had run out or was given."""
        return bool((await self._on("give", session_id, ticket))[0])

    async def give_all(self, gives: Sequence[str]) -> int:
        """Free the slots *gives* (``"<session id>|<ticket>"``, of any sessions) in one
        call; how many were held (the others had run out or were freed)."""
        return int(await self._script(keys=[self.keys.session_pools], args=[
            "gives", self.keys.session_slots_prefix, " ".join(gives)]))

    async def bind(self, session_id: str, exit_id: str) -> Drawn:
        """See :meth:`ExitBindings.bind`."""
        return self._drawn(session_id, await self._on("bind", session_id, exit_id))


def _slot_of(reply: list[Any], at: int) -> tuple[str, float]:
    """The (slot, wait in seconds) of a draw or pin reply, from its element *at* on."""
    if len(reply) <= at + 1:
        return "", 0.0
    return _text(reply[at]), int(reply[at + 1]) / 1000


def script_keys(keys: CrawlKeys, part: str, session_id: str = "") -> list[str]:
    """The KEYS of one lua/sessions.lua call about *session_id* of pool part *part* (a draw:
    no session)."""
    record = keys.session(session_id) if session_id else keys.session_pools
    return [keys.session_pools, keys.session_pool(part), keys.session_pool_info(part), record,
            keys.cookie_jar(jar_name(session_id)) if session_id else record,
            keys.session_slots(session_id) if session_id else record]


async def _on_session(script: Any, keys: CrawlKeys, op: str, session_id: str,
                      *args: Any) -> list[Any]:
    reply = await script(keys=script_keys(keys, pool_part_of(session_id), session_id),
                         args=[op, session_id, *args])
    return list(reply) if isinstance(reply, list) else [reply]


def drawn_of(session_id: str, reply: list[Any]) -> Drawn:
    """A per-session reply of lua/sessions.lua as a :class:`Drawn` (its exit: the last
    element of the replies that carry one, of 3 elements or more)."""
    return Drawn(session_id, _text(reply[0]), int(reply[1]),
                 _text(reply[-1]) if len(reply) > 2 else "")


class ExitBindings:
    """What the proxy middleware needs of the sessions (issue 32 item 3): bind a session to
    the exit that carries its first request, retire it when that exit can no longer carry
    it.  One lua/sessions.lua call each (atomic), through a redis-py asyncio client.

    Raises:
        redis.RedisError, OSError: from any call when Redis fails.
    """

    def __init__(self, client: Any, keys: CrawlKeys) -> None:
        self.client = client
        self.keys = keys
        self._script = lua.load(client, "sessions.lua")

    async def bind(self, session_id: str, exit_id: str) -> Drawn:
        """Bind *session_id* to *exit_id* unless it is bound already; the session after:
        ``exit`` is the exit it is bound to (the first binding wins), ``state`` ``retired``:
        not bound, ``unknown``: no such record.

        Raises:
            ValueError: *session_id* is not a session id.
        """
        return drawn_of(session_id, await _on_session(self._script, self.keys, "bind",
                                                      session_id, exit_id))

    async def retire(self, session_id: str, reason: str) -> bool:
        """Retire *session_id* with *reason* (one of :data:`EXIT_REASONS`); False when it
        was retired already."""
        reply = await _on_session(self._script, self.keys, "retire", session_id, reason)
        return bool(reply[0])


def _decode(mapping: dict[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in mapping.items()}


def pool_names(client: Any, keys: CrawlKeys) -> list[str]:
    """The crawl's session pools, sorted (blocking client)."""
    return sorted(_text(p) for p in client.smembers(keys.session_pools))


def pool_report(client: Any, keys: CrawlKeys, pool: str) -> dict[str, Any]:
    """One pool as ``scrapy fleet sessions`` shows it: ``counters`` (the pool's HASH:
    created, logins, check_failed, retired:<reason>), ``sessions`` (id -> record fields,
    drawable ones first, then the retired ones still on record)."""
    part = session_pool_part(pool)
    counters = {k: int(v) for k, v in _decode(client.hgetall(keys.session_pool_info(part)))
                .items() if k != "next"}
    last = int(client.hget(keys.session_pool_info(part), "next") or 0)
    sessions: dict[str, dict[str, str]] = {}
    for n in range(1, last + 1):
        sid = f"{part}-{n}"
        record = _decode(client.hgetall(keys.session(sid)))
        if record:
            sessions[sid] = {f: record.get(f, "") for f in RECORD_FIELDS}
    return {"pool": pool, "counters": counters, "sessions": sessions}


def pools_summary(client: Any, keys: CrawlKeys) -> dict[str, dict[str, Any]]:
    """The session pools as ``status``, ``top``, the dashboard and ``/metrics`` show them
    (blocking client; empty without pools): pool name -> ``active`` (drawable sessions that
    are logged in, or need none), ``drawable`` (not retired), ``logins`` (logins that
    succeeded), ``check_failed`` (failed validity checks that asked a login), ``retired``
    (reason -> sessions).  Reads: the pools' SET, then per pool its counters, its drawable
    ids and their states (O(pool size))."""
    out: dict[str, dict[str, Any]] = {}
    for pool in pool_names(client, keys):
        part = session_pool_part(pool)
        counters = _decode(client.hgetall(keys.session_pool_info(part)))
        ids = [_text(i) for i in client.zrange(keys.session_pool(part), 0, -1)]
        pipe = client.pipeline(transaction=False)
        for sid in ids:
            pipe.hget(keys.session(sid), "state")
        states = [_text(s) for s in pipe.execute()] if ids else []
        out[pool] = {"active": states.count("active"), "drawable": len(ids),
                     "logins": int(counters.get("logins", 0)),
                     "check_failed": int(counters.get("check_failed", 0)),
                     "retired": {k.split(":", 1)[1]: int(v) for k, v in counters.items()
                                 if k.startswith("retired:")}}
    return out


def retire_session(client: Any, keys: CrawlKeys, session_id: str, reason: str) -> str:
    """Retire *session_id* (blocking client): ``"retired"``, ``"already"`` (retired before)
    or ``"unknown"`` (no such record).

    Raises:
        ValueError: *session_id* is not a session id.
    """
    part = pool_part_of(session_id)
    if not client.exists(keys.session(session_id)):
        return "unknown"
    script = lua.load(client, "sessions.lua")
    record = keys.session(session_id)
    done = script(keys=[keys.session_pools, keys.session_pool(part),
                        keys.session_pool_info(part), record, record],
                  args=["retire", session_id, reason])
    return "retired" if int(done) else "already"
