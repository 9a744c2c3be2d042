"""What every key class of the package shares: a fixed key name read as an attribute
(:class:`Key`), and how a free-form name (a session, a pool) goes into a key name."""

from __future__ import annotations

from typing import Protocol


class HasBase(Protocol):
    """A key class: every key it names starts with its ``base`` (a prefix and a hash tag)."""

    @property
    def base(self) -> str: ...


class Key:
    """A fixed key name of a crawl or pool, read as an attribute: ``keys.leases`` is
    ``<base>:leases`` (the owner's ``base``); its doc is the ``#:`` comment above it."""

    __slots__ = ("suffix",)

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, obj: HasBase, owner: type | None = None) -> str:
        return f"{obj.base}:{self.suffix}"


def session_pool_part(pool: str) -> str:
    """The part of a pool's name that its session ids start with: kept when short and plain,
    else hashed (a session id is ``"<this>-<n>"``, always plain)."""
    return session_part(pool)


def session_part(session: str) -> str:
    """A session key as it goes into a key name: kept when short and plain, else hashed."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9_.:\-]{1,100}", session):
        return session
    return "h" + hashlib.blake2b(session.encode("utf-8", "surrogatepass"),
                                 digest_size=16).hexdigest()
