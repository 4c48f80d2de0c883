"""Other replicas' writes into the view: LISTEN on one channel, re-read what changed, tell.

A writer sends ``NOTIFY tether, '<replica> <kind> <seq> <len(key)> <ms>\\n<key><payload><mac>'``
inside its transaction (so it is delivered only if it commits). ``mac`` (HMAC-SHA256, 16 bytes,
base64url) is keyed by a key derived from ``--store-key-file``'s: any role that may connect to the
database can send on the channel, and a notice without the right MAC is dropped unread. A
``message`` notice (``Store.publish``) is also dropped when it is older than a minute or seen before
(one captured by a listener and sent again). One task here collects notices, re-reads
the keys they name in one snapshot (a burst of notices costs one read), applies them to the
view, then calls the listeners, in the order the notices came. The listening connection
reconnects by itself; since notices may have been missed meanwhile, it then re-reads everything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from tether.controller.store.pgconn import CHANNEL, UNREACHABLE, connect
from tether.controller.store.pgview import Key, View, read_snapshot
from tether.controller.store.records import StoreChange
from tether.nodeagent.model import now_ms

log = structlog.get_logger("tether.controller.store")
RETRY_S = (0.1, 0.25, 0.5, 1.0, 2.0)  # reconnect / re-read backoff
MAC_BYTES = 16  # of HMAC-SHA256, sent as base64url without padding
MAC_CHARS = 22
MAC_LABEL = b"tether store notices v1"
MESSAGE_WINDOW_MS = 60_000  # a message notice older (or newer, clocks apart) than this is dropped
REFUSED_LOG_S = 60.0  # refused notices are logged at most this often
# The notice kind -> the view key it names.
_KEY_KIND = {
    "node": "node",
    "node_deleted": "node",
    "events": "node",
    "environment": "env",
    "environment_deleted": "env",
    "token": "token",
    "kv": "kv",
}


@dataclass(frozen=True)
class Notice:
    replica: str
    kind: str  # a StoreChange kind, or "reload" (everything, after a reconnect)
    key: str
    seq: int = 0
    payload: str = ""
    sent_ms: int = 0  # the sender's clock

    @property
    def view_key(self) -> Key | None:
        kind = _KEY_KIND.get(self.kind)
        return None if kind is None else (kind, self.key)


def mac_key(store_key: bytes) -> bytes:
    """The key that signs notices, derived from the key of ``--store-key-file`` (which it never is)."""
    return hmac.new(store_key, MAC_LABEL, hashlib.sha256).digest()


@dataclass(frozen=True)
class Sender:
    """Who writes notices: this replica's id, and the key (``mac_key``) that signs them."""

    replica: str
    key: bytes = field(repr=False)


def encode(sender: Sender, kind: str, key: str, seq: int = 0, payload: str = "") -> str:
    body = f"{sender.replica} {kind} {seq} {len(key)} {now_ms()}\n{key}{payload}"
    return body + _mac(sender.key, body)


def decode(text: str, key: bytes) -> Notice | None:
    """The notice in ``text``; None unless it is signed with ``key`` (and well formed)."""
    body, mac = text[:-MAC_CHARS], text[-MAC_CHARS:]
    if len(text) <= MAC_CHARS or not hmac.compare_digest(mac.encode(), _mac(key, body).encode()):
        return None
    try:
        head, rest = body.split("\n", 1)
        replica, kind, seq, size, sent = head.split(" ")
        n = int(size)
        return Notice(replica, kind, rest[:n], int(seq), rest[n:], int(sent))
    except ValueError:
        return None


def _mac(key: bytes, body: str) -> str:
    digest = hmac.new(key, body.encode(), hashlib.sha256).digest()[:MAC_BYTES]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class Sync:
    def __init__(
        self,
        url: str,
        sender: Sender,
        pool: AsyncConnectionPool[Any],
        view: View,
        emit: Callable[[StoreChange], None],
    ) -> None:
        self._url = url
        self._replica = sender.replica
        self._key = sender.key  # notices not signed with it are dropped
        self._seen: OrderedDict[tuple[str, int], float] = OrderedDict()  # message notices heard lately
        self._refused_logged = float("-inf")
        self.refused = 0  # notices dropped: not signed with the store's key, or replayed (tests)
        self._pool = pool
        self._view = view
        self._emit = emit
        self._pending: list[Notice] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._conn: psycopg.AsyncConnection[Any] | None = None  # the listening one
        self._waiters: list[asyncio.Future[None]] = []  # refresh() calls: set once their batch is applied
        self.reconnects = 0  # (tests, metrics)

    async def start(self) -> None:
        """LISTEN, then load the whole view (nothing written between is missed); StoreError if the
        database cannot be reached."""
        conn = self._conn = await self._subscribe()
        try:
            async with self._pool.connection() as read:
                snap = await read_snapshot(read, None)
        except BaseException:
            await self.close()
            raise
        self._view.apply(snap, snap.keys(), {})
        self._tasks = [
            asyncio.create_task(self._listener(conn), name="store-listen"),
            asyncio.create_task(self._worker(), name="store-sync"),
        ]

    async def close(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks = []
        if self._conn is not None:  # (a listener cancelled before it ran never closed it)
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def _subscribe(self) -> psycopg.AsyncConnection[Any]:
        conn = await connect(self._url)
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def refresh(self, kind: str, key: str) -> None:
        """Re-read one key (kind "node", "environment", "token", "kv") into the view now, and
        return once it is applied; StoreError-like exceptions of the database pass through."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._notice(Notice(self._replica, kind, key))
        await waiter

    def reload_soon(self) -> None:
        """Re-read the whole view (an own write's outcome is unknown; its notice is not heard)."""
        self._notice(Notice(self._replica, "reload", ""))

    def _notice(self, notice: Notice) -> None:
        self._pending.append(notice)
        self._wake.set()

    async def _listener(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        try:
            while True:
                await self._listen(conn)
                with contextlib.suppress(Exception):
                    await conn.close()
                conn = self._conn = await self._reconnect()
                self.reconnects += 1
                self._notice(Notice(self._replica, "reload", ""))  # what was missed meanwhile
        finally:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Hand over notices until the connection breaks (the database restarted, or is away)."""
        try:
            async for n in conn.notifies():
                notice = self._accept(n.payload, n.pid)
                if notice is not None:
                    self._notice(notice)
        except Exception as exc:
            log.warning("store notifications interrupted; reconnecting", error=" ".join(str(exc).split()))

    def _accept(self, text: str, pid: int) -> Notice | None:
        """The notice another replica sent; None for an own one, and for one not signed with the
        store's key (anyone who may connect can NOTIFY) or a message notice heard before."""
        notice = decode(text, self._key)
        if notice is None:
            self._refuse("not signed with this store's key", pid)
            return None
        if notice.replica == self._replica:
            return None
        if notice.kind == "message" and not self._fresh(notice):
            self._refuse("a message notice sent again, or over a minute old", pid)
            return None
        return notice

    def _fresh(self, notice: Notice) -> bool:
        """A message notice not heard before, sent within ``MESSAGE_WINDOW_MS`` (each replica
        numbers its messages: (replica, seq) is heard once)."""
        if abs(now_ms() - notice.sent_ms) > MESSAGE_WINDOW_MS:
            return False
        now, seen, ident = time.monotonic(), self._seen, (notice.replica, notice.seq)
        while seen and next(iter(seen.values())) < now - 2 * MESSAGE_WINDOW_MS / 1000:
            seen.popitem(last=False)  # past its window: a replay of it is refused as too old
        if ident in seen:
            return False
        seen[ident] = now
        return True

    def _refuse(self, why: str, pid: int) -> None:
        """Count a dropped notice; say so at most once a minute, never with its text."""
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_S:
            self._refused_logged = now
            log.warning(
                "store notification dropped (another database role sending on the channel? "
                "only tether's role should be able to connect)",
                why=why,
                channel=CHANNEL,
                sender_pid=pid,
                dropped=self.refused,
            )

    async def _reconnect(self) -> psycopg.AsyncConnection[Any]:
        attempt = 0
        while True:
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
            attempt += 1
            try:
                conn = await self._subscribe()
            except Exception:  # noqa: S112 (still away: keep trying)
                continue
            log.info("store notifications resumed")
            return conn

    async def _worker(self) -> None:
        attempt = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            waiters, self._waiters = self._waiters, []
            try:
                await self._process(batch)
                attempt = 0
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            except Exception as exc:  # the database is away: keep the notices, try again
                self._pending = batch + self._pending
                self._waiters[:0] = waiters
                if not isinstance(exc, UNREACHABLE):
                    log.exception("store re-read failed")
                await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
                self._wake.set()

    async def _process(self, batch: list[Notice]) -> None:
        reload = any(n.kind == "reload" for n in batch)
        named = {k for n in batch if (k := n.view_key) is not None}
        before = self._view.stamps(None if reload else named)
        old = {k: self._view.state(k) for k in (self._view.keys() | named if reload else named)}
        async with self._pool.connection() as conn:
            snap = await read_snapshot(conn, None if reload else named)
        keys = (self._view.keys() | snap.keys() | named) if reload else named
        for k in keys:
            old.setdefault(k, None)
        again = set(self._view.apply(snap, keys, before))
        if again:  # an own write landed meanwhile: read those keys again
            self._pending[:0] = [n for n in batch if n.view_key in again]
            self._wake.set()
        self._tell(batch, {k: old[k] for k in keys if k not in again}, named)

    def _tell(self, batch: list[Notice], applied: dict[Key, Any], named: set[Key]) -> None:
        """The listeners, in notice order: each re-read key once, then what a reload changed."""
        told: set[Key] = set()
        for notice in batch:
            key = notice.view_key
            if notice.kind == "message":
                self._call(StoreChange("message", notice.key, payload=notice.payload))
            elif key is not None and key in applied and key not in told:
                told.add(key)
                self._changes(key, applied[key], force=True)
        for key, old in applied.items():
            if key not in told and key not in named:
                self._changes(key, old, force=False)

    def _changes(self, key: Key, old: Any, force: bool) -> None:
        new = self._view.state(key)
        if not force and new == old:
            return
        kind, name = key
        if kind == "node":
            if new is None:
                self._call(StoreChange("node_deleted", name))
                return
            self._call(StoreChange("node", name))
            seq = new[2]
            if seq > (old[2] if old is not None else 0):
                self._call(StoreChange("events", name, seq=seq))
        elif kind == "env":
            self._call(StoreChange("environment" if new is not None else "environment_deleted", name))
        else:
            self._call(StoreChange("token" if kind == "token" else "kv", name))

    def _call(self, change: StoreChange) -> None:
        try:
            self._emit(change)
        except Exception:
            log.exception("store listener failed", change=change.kind, key=change.key)


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them; again if a cancellation was swallowed on the way (a
    race in Python 3.11's ``asyncio.wait_for``, which the pool uses, can lose one)."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.1)
    for task in tasks:
        with contextlib.suppress(BaseException):
            task.result()
