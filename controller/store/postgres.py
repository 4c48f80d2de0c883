"""The replicated store: PostgreSQL through psycopg 3 (async) and a connection pool.

Reads are synchronous and answered from an in-memory view (``pgview``) loaded at open: this
replica's writes update it when they commit, other replicas' arrive by LISTEN/NOTIFY
(``pgsync``). Events and the audit log are read from the database (``list_events``,
``list_audit`` are async). Enrollments and events are group-committed (``pgbatch``); every
other write is one short transaction. No call blocks the event loop. docs/store.md says more.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import itertools
import json
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from tether.controller.errors import StoreError
from tether.controller.store.migrations import migrate_postgres
from tether.controller.store.pgbatch import Batcher
from tether.controller.store.pgconn import (
    CHANNEL,
    CONNECT_TIMEOUT_S,
    UNREACHABLE,
    connect,
    connection_kwargs,
    describe,
    unavailable,
)
from tether.controller.store.pglease import Leases
from tether.controller.store.pgnodes import ATTEMPTS, Writes, append_audit
from tether.controller.store.pgsync import Sender, Sync, encode, mac_key, stop_tasks
from tether.controller.store.pgview import View
from tether.controller.store.pgwrites import (
    Append,
    Appended,
    Enrolled,
    Enrollment,
    append_batch,
    enroll_batch,
    fetchall,
)
from tether.controller.store.records import (
    AuditRecord,
    EnvironmentRecord,
    NodeRecord,
    StepRecord,
    StoreChange,
)
from tether.controller.store.rows import AUDIT_COLUMNS
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event

CommitObserver = Callable[[float, int], None]
log = structlog.get_logger("tether.controller.store")
POOL_TIMEOUT_S = 5.0  # a call waits this long for a connection, then: "store unavailable: ..."
# The pool retries a connection it could not make after 1 s, 2 s, ... for this long, then gives it
# up and makes a new one when a call waits for one. psycopg_pool's default (5 min) lets the retries
# drift 16 s, 32 s ... apart during an outage: writes would fail that long after the database is back.
RECONNECT_S = 5.0
# A published payload; its notice adds the topic (<= 200), a header (< 100) and the MAC (22):
# well under PostgreSQL's 8000-byte NOTIFY limit. intents.PAYLOAD_BYTES keeps whole notices <= 4000.
MAX_MESSAGE_BYTES = 4000
REFRESH_TIMEOUT_S = 3.0  # refresh_node waits this long for the database, then answers from the view


class PostgresStore(Writes):
    """``Store`` on PostgreSQL, shared by every replica."""

    kind = "postgresql"

    def __init__(
        self,
        url: str,
        pool: AsyncConnectionPool[Any],
        observe_commit: CommitObserver | None,
        notify_key: bytes,
    ) -> None:
        self.url = url
        self.replica_id = uuid.uuid4().hex
        self._sender = Sender(self.replica_id, mac_key(notify_key))
        self._messages = itertools.count(1)  # numbers this replica's message notices (heard once each)
        self._pool = pool
        self._observe = observe_commit
        self._view = View()
        self._listeners: list[Callable[[StoreChange], None]] = []
        self._sync = Sync(url, self._sender, pool, self._view, self._emit)
        self._leases = Leases(url)
        self._enrollments: Batcher[Enrollment, NodeRecord] = Batcher(self._enroll_flush, alone=_alone)
        self._appends: Batcher[Append, int] = Batcher(self._append_flush, alone=_alone)

    @classmethod
    async def open(
        cls,
        url: str,
        observe_commit: CommitObserver | None = None,
        min_connections: int = 2,
        max_connections: int = 16,
        notify_key: bytes | None = None,
    ) -> PostgresStore:
        """Connect, apply the migrations (under their lock), load the view; StoreError if the
        database cannot be reached (saying why: refused, authentication, no such database).
        ``notify_key`` (required): the key of ``--store-key-file``; the notices between replicas
        are signed with a key derived from it, and any other notice is dropped."""
        if not notify_key:
            raise StoreError(
                "a PostgreSQL store needs the key of --store-key-file (notify_key): it signs the "
                "notices between replicas"
            )
        first = await connect(url)
        try:
            applied = await migrate_postgres(first)
        except UNREACHABLE as exc:
            raise unavailable(exc, url) from None
        except psycopg.Error as exc:  # e.g. a user who may not create tables: one line, not a traceback
            raise StoreError(f"cannot migrate the store's schema: {' '.join(str(exc).split())}") from None
        finally:
            await first.close()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=min_connections,
            max_size=max_connections,
            kwargs=connection_kwargs(),
            open=False,
            timeout=POOL_TIMEOUT_S,
            reconnect_timeout=RECONNECT_S,
            name="tether-store",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            store = cls(url, pool, observe_commit, notify_key)
            await store._sync.start()
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, UNREACHABLE):
                raise unavailable(exc, url) from None
            raise
        log.info("store opened", store=describe(url), migrations=applied, replica=store.replica_id)
        return store

    async def close(self) -> None:
        await self._enrollments.drain()
        await self._appends.drain()
        await self._sync.close()
        await self._leases.close()
        if self._checking is not None:
            await stop_tasks([self._checking])
        await self._pool.close()

    async def _read(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """One query outside any transaction (events, audit); a connection that broke since its
        last use (the database restarted) is replaced and the query asked again."""
        for attempt in range(ATTEMPTS):
            try:
                async with self._pool.connection() as conn:
                    return await fetchall(conn, sql, args)
            except UNREACHABLE as exc:
                if attempt == ATTEMPTS - 1 or isinstance(exc, PoolTimeout):
                    raise unavailable(exc, self.url) from None
                await self._recheck()
        raise AssertionError("not reached")

    # -- replicas -------------------------------------------------------------------------------

    def _unsure(self) -> None:
        self._sync.reload_soon()

    async def refresh_node(self, name: str) -> NodeRecord | None:
        """The node as the database has it now: re-read into the view first (a node enrolled
        through another replica a moment ago, whose notice has not arrived yet). The view's
        record when the database does not answer within a few seconds."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._sync.refresh("node", name)), REFRESH_TIMEOUT_S)
        return self.get_node(name)

    def subscribe(self, listener: Callable[[StoreChange], None]) -> None:
        self._listeners.append(listener)

    def _emit(self, change: StoreChange) -> None:
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # one listener's bug must not keep the change from the others
                log.exception("store listener failed", change=change.kind, key=change.key)

    async def publish(self, topic: str, payload: str) -> None:
        if len(payload.encode()) > MAX_MESSAGE_BYTES or len(topic.encode()) > 200:
            raise ValueError(f"a store message is at most {MAX_MESSAGE_BYTES} bytes (topic 200)")
        message = encode(self._sender, "message", topic, next(self._messages), payload)
        try:
            async with self._pool.connection() as conn:
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, message))
        except UNREACHABLE as exc:
            raise unavailable(exc, self.url) from None

    async def try_lease(self, name: str) -> bool:
        return await self._leases.try_lease(name)

    async def release_lease(self, name: str) -> None:
        await self._leases.release_lease(name)

    def lease_lost(self, callback: Callable[[str], None]) -> None:
        self._leases.on_lost(callback)

    # -- reads (the view) -----------------------------------------------------------------------

    def get_environment(self, name: str) -> EnvironmentRecord | None:
        return self._view.environments.get(name)

    def get_revision(self, name: str, generation: int) -> EnvironmentRecord | None:
        return self._view.revisions.get(name, {}).get(generation)

    def list_environments(self) -> list[EnvironmentRecord]:
        return [self._view.environments[n] for n in sorted(self._view.environments)]

    def get_token(self, token_id: str) -> TokenRecord | None:
        return self._view.tokens.get(token_id)

    def list_tokens(self, environment: str = "") -> list[TokenRecord]:
        tokens = [t for t in self._view.tokens.values() if not environment or t.environment == environment]
        return sorted(tokens, key=lambda t: (t.created_ms, t.id))

    def get_node(self, name: str) -> NodeRecord | None:
        return self._view.nodes.get(name)

    def list_nodes(self, environment: str = "") -> list[NodeRecord]:
        nodes = self._view.nodes
        return [nodes[n] for n in self._view.names if not environment or nodes[n].environment == environment]

    def list_nodes_page(self, environment: str, after: str, limit: int) -> list[NodeRecord]:
        view = self._view
        out: list[NodeRecord] = []
        for name in view.names[_after(view.names, after) :]:
            node = view.nodes[name]
            if not environment or node.environment == environment:
                out.append(node)
                if len(out) >= limit:
                    break
        return out

    def node_steps(self, name: str) -> list[StepRecord]:
        return list(self._view.steps.get(name, ()))

    def max_seq(self, node: str) -> int:
        return self._view.max_seq.get(node, 0)

    def kv_get(self, key: str) -> bytes | None:
        return self._view.kv.get(key)

    def kv_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self._view.kv if k.startswith(prefix))

    # -- enrollments and events (group-committed) -----------------------------------------------

    async def enroll_node(
        self,
        token_id: str,
        node_name: str,
        decide: Callable[[TokenRecord | None, NodeRecord | None], tuple[NodeRecord, bool]],
    ) -> NodeRecord:
        """Atomically check a join token, use it, and write the node (see SqliteStore)."""
        return await self._enrollments.submit(Enrollment(token_id, node_name, decide))

    async def _enroll_flush(self, items: list[Enrollment]) -> list[NodeRecord | BaseException]:
        done: Enrolled = await self._tx(lambda conn: enroll_batch(conn, items, self._sender), len(items))
        view = self._view
        for tid, (token, rev) in done.tokens.items():
            view.own(("token", tid), rev, functools.partial(view.set_token, tid, token))
        for name, row in done.nodes.items():
            self._node_written(row, [] if name in done.cleared else None)
        return done.results

    async def append_events(self, node: str, events: Sequence[Event]) -> int:
        """Store events idempotently by (node, seq); returns the highest contiguous stored seq."""
        return await self._appends.submit(Append(node, list(events)))

    async def _append_flush(self, items: list[Append]) -> list[int | BaseException]:
        done: Appended = await self._tx(lambda conn: append_batch(conn, items, self._sender), len(items))
        for name, row in done.nodes.items():
            self._node_written(row, done.steps.get(name))
        return done.results

    async def list_events(self, node: str, after_seq: int = 0, limit: int = 0) -> list[Event]:
        sql = "SELECT body FROM events WHERE node=%s AND seq>%s ORDER BY seq"
        args: list[Any] = [node, after_seq]
        if limit:
            sql += " LIMIT %s"
            args.append(limit)
        return [Event.from_json(json.loads(r[0])) for r in await self._read(sql, args)]

    # -- audit log ------------------------------------------------------------------------------

    async def append_audit(self, record: AuditRecord) -> AuditRecord:
        """Store ``record`` under the next id; retention as in SqliteStore."""
        return await self._tx(functools.partial(append_audit, record=record))

    async def list_audit(
        self, environment: str = "", before_id: int = 0, limit: int = 100, environments: Collection[str] = ()
    ) -> list[AuditRecord]:
        where: list[str] = ["id < %s"]
        args: list[Any] = [before_id or (1 << 63) - 1]
        if environment:
            where.append("environment = %s")
            args.append(environment)
        if environments:
            where.append("environment = ANY(%s)")
            args.append(sorted(environments))
        sql = f"SELECT id, {AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT %s"
        return [AuditRecord(*r) for r in await self._read(sql, [*args, limit])]


def _after(names: list[str], after: str) -> int:
    return bisect.bisect_right(names, after)


def _alone(exc: Exception) -> bool:
    """A batch failed on one bad item (not the database away): try each alone."""
    return isinstance(exc, psycopg.Error) and not isinstance(exc, (psycopg.OperationalError, StoreError))
