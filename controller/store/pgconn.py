"""Connections to PostgreSQL: the settings every one of ours uses, and the one-line error."""

from __future__ import annotations

from typing import Any

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
}
# Errors that mean the database cannot be reached (or the connection broke), not a bad statement.
UNREACHABLE = (psycopg.OperationalError, PoolTimeout, OSError)


def connection_kwargs() -> dict[str, Any]:
    """What every connection is opened with (pool or not)."""
    return {**SETTINGS, "autocommit": True, "prepare_threshold": 1}


async def connect(url: str) -> psycopg.AsyncConnection[Any]:
    """One autocommit connection, or StoreError ("store unavailable: ...")."""
    try:
        return await psycopg.AsyncConnection.connect(url, **connection_kwargs())
    except UNREACHABLE as exc:
        raise unavailable(exc, url) from None


def unavailable(exc: BaseException, url: str = "") -> StoreError:
    """One clear line, never the password."""
    if isinstance(exc, PoolTimeout):  # the pool could not connect: say to where
        text = f"cannot reach {describe(url)} ({exc})"
    else:
        text = " ".join(str(exc).split()) or type(exc).__name__
    secret = _password(url)
    if secret:
        text = text.replace(secret, "***")
    return StoreError(f"store unavailable: {text}")


def _password(url: str) -> str:
    try:
        return str(conninfo_to_dict(url).get("password") or "")
    except psycopg.ProgrammingError:
        return ""


def describe(url: str) -> str:
    """The URL without its password (for logs and messages)."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(invalid URL)"
    user, host, port, db = (str(info.get(k, "")) for k in ("user", "host", "port", "dbname"))
    return f"postgresql://{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"
