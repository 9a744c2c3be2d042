"""Secrets of connection URLs (``FLEET_REDIS_URL``, ``FLEET_MONGO_URI``) kept out of logs and
error messages."""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

#: URL options whose values may be secrets: Redis's ``password`` query option, MongoDB's TLS
#: key passwords and ``authMechanismProperties``
_SECRET_OPTIONS = re.compile(
    r"(?i)\b((?:password|tlsCertificateKeyFilePassword|sslClientCertificateKeyPassword"
    r"|sslPEMKeyPassword|authMechanismProperties)=)[^&#]*")


def userinfo(url: str) -> tuple[str, str, str | None, str]:
    """``(scheme://, user, password or None, rest)`` of *url*, leniently.

    Everything up to the LAST ``@`` counts as user info, so that a password with unescaped
    ``@``, ``/`` or ``?`` (which the client libraries refuse, a common cause of a bad URL) is
    still hidden; when in doubt more is hidden, never less.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return scheme + sep, "", None, rest
    info, _, rest = rest.rpartition("@")
    user, colon, password = info.partition(":")
    return scheme + sep, user, password if colon else None, rest


def redact(url: str) -> str:
    """*url* for logs: the password replaced by ``***``, and the values of the options that may
    hold secrets (``password=``, ``tlsCertificateKeyFilePassword``...) too."""
    scheme, user, password, rest = userinfo(url)
    if password is not None:
        rest = f"{user}:***@{rest}"
    elif user:
        rest = f"{user}@{rest}"
    return _SECRET_OPTIONS.sub(r"\1***", scheme + rest)


def scrub(text: str, url: str) -> str:
    """*text* (an error message) without *url*'s password, raw or percent-decoded."""
    password = userinfo(url)[2]
    for secret in {password, unquote_plus(password)} if password else ():
        text = text.replace(secret, "***")
    return text


def cookie_header(value: str, set_cookie: bool = False) -> str:
    """A ``Cookie`` header value for logs: each ``name=value`` pair as ``name=***``; with
    *set_cookie*, a ``Set-Cookie`` value: its first pair hidden so, its attributes (Path,
    Domain, Expires...) kept."""
    pairs = value.split(";")
    hidden = pairs[:1] if set_cookie else pairs
    out = [pair.split("=", 1)[0].strip() + "=***" if "=" in pair else pair.strip()
           for pair in hidden]
    return "; ".join(out + [pair.strip() for pair in pairs[len(hidden):]])
