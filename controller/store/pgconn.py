"""Connections to PostgreSQL: the settings every one of ours uses, and the one-line error."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from tether.controller.errors import StoreError

CHANNEL = "tether"  # the one LISTEN/NOTIFY channel
CONNECT_TIMEOUT_S = 5
# A peer that vanished (no FIN) is noticed by TCP keepalives within ~15 s.
SETTINGS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "application_name": "tether-controller",
    # ... and the server notices a replica that vanished (host lost, partition) within ~20 s, which
    # ends its session and frees its advisory locks: the singleton lease moves to another replica.
    "options": "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=5",
}
# Errors that mean the database cannot be reached (or the connection broke), not a bad statement.
UNREACHABLE = (psycopg.OperationalError, PoolTimeout, OSError)


def connection_kwargs() -> dict[str, Any]:
    """What every connection is opened with (pool or not)."""
    return {**SETTINGS, "autocommit": True, "prepare_threshold": 1}


INVALID_URL = "invalid --store URL: check its form and percent-encoding"


async def connect(url: str) -> psycopg.AsyncConnection[Any]:
    """One autocommit connection, or StoreError: "store unavailable: ..." (the database cannot be
    reached, or refused us), ``INVALID_URL`` for any other error (psycopg puts the URL's text,
    its password included, in the message of a URL it cannot parse: never shown)."""
    try:
        return await psycopg.AsyncConnection.connect(url, **connection_kwargs())
    except UNREACHABLE as exc:
        raise unavailable(exc, url) from None
    except psycopg.Error:
        raise StoreError(INVALID_URL) from None


def unavailable(exc: BaseException, url: str = "") -> StoreError:
    """One clear line, never the password."""
    if isinstance(exc, PoolTimeout):  # the pool could not connect: say to where
        text = f"cannot reach {describe(url)} ({exc})"
    else:
        text = " ".join(str(exc).split()) or type(exc).__name__
    for secret in passwords(url):
        text = text.replace(secret, "***")
    return StoreError(f"store unavailable: {text}")


def check_url(url: str) -> None:
    """StoreError ``INVALID_URL`` when libpq cannot parse ``url`` (never with its text)."""
    try:
        conninfo_to_dict(url)
    except psycopg.Error:
        raise StoreError(INVALID_URL) from None


def passwords(url: str) -> list[str]:
    """The password in ``url``, as libpq reads it and as written (percent-encoded); none: []."""
    found: list[str] = []
    with contextlib.suppress(psycopg.Error):
        found.append(str(conninfo_to_dict(url).get("password") or ""))
    with contextlib.suppress(ValueError):
        found.append(urlsplit(url).password or "")
    return sorted({p for p in found if p}, key=len, reverse=True)


def describe(url: str) -> str:
    """The URL without its password (for logs and messages)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(invalid URL)"
    user, host, port, db = (str(info.get(k, "")) for k in ("user", "host", "port", "dbname"))
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"
