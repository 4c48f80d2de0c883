"""Singleton leases on PostgreSQL: session advisory locks held on one dedicated connection.

A replica that dies (or loses that connection) frees its locks with its session; a replica
that sees the connection break tells its ``lease_lost`` callbacks at once (a watcher waits on
the socket), and takes a new connection on its next ``try_lease``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

from tether.controller.store.pgconn import UNREACHABLE, connect
from tether.controller.store.pgsync import stop_tasks

log = structlog.get_logger("tether.controller.store")
WATCH_SLICE_S = 0.2  # the watcher lets a lease call use the connection this often


def lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key of lease ``name``."""
    digest = hashlib.sha256(f"tether.lease:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Leases:
    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._held: set[str] = set()
        self._callbacks: list[Callable[[str], None]] = []
        self._lock = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None

    def on_lost(self, callback: Callable[[str], None]) -> None:
        self._callbacks.append(callback)

    async def try_lease(self, name: str) -> bool:
        async with self._lock:
            if name in self._held and self._conn is not None and not self._conn.closed:
                return True  # (a second lock would nest: one release must free it)
            try:
                conn = await self._connection()
                cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(name),))
                row = await cur.fetchone()
            except Exception as exc:  # the database is away: not held (lost ones were told)
                self._lost(exc)
                return False
            if row is not None and row[0]:
                self._held.add(name)
                return True
            return False

    async def release_lease(self, name: str) -> None:
        async with self._lock:
            if name not in self._held:
                return
            self._held.discard(name)
            if self._conn is not None:
                with contextlib.suppress(*UNREACHABLE):
                    await self._conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(name),))

    async def close(self) -> None:
        """Release everything (by closing the session); no callback runs."""
        self._held.clear()
        if self._watch is not None:
            await stop_tasks([self._watch])
            self._watch = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = await connect(self._url)
            self._watch = asyncio.create_task(self._watcher(self._conn), name="store-lease-watch")
        return self._conn

    async def _watcher(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Wait on the connection's socket: a break is seen the moment it happens."""
        try:
            while True:
                async for _ in conn.notifies(timeout=WATCH_SLICE_S):
                    pass
                await asyncio.sleep(0)  # let a waiting lease call take the connection
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if conn is self._conn:
                self._lost(exc)

    def _lost(self, exc: BaseException) -> None:
        """The session is gone, and every lock it held with it: tell who cares, at once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._closing = asyncio.get_running_loop().create_task(_close(conn))
        held, self._held = sorted(self._held), set()
        if held:
            log.warning("store leases lost", leases=held, error=" ".join(str(exc).split()))
        for name in held:
            for callback in list(self._callbacks):
                try:
                    callback(name)
                except Exception:
                    log.exception("lease_lost callback failed", lease=name)


async def _close(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
