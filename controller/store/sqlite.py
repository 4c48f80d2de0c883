"""The embedded store: one SQLite file in WAL mode.

Writes go through one writer thread that commits in groups: every write
queued while the previous commit was running lands in the next transaction
(each in its own savepoint), so thousands of agents share a few fsyncs per
second and an acknowledged event is on disk (``synchronous=FULL``). Reads use
a separate connection and never wait for the writer.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any, TypeVar

import tether.controller.store.base as base
from tether.controller.errors import StoreError, check_generation
from tether.controller.store.migrations import SQLITE_VERSION, migrate_sqlite
from tether.controller.store.records import (
    AuditRecord,
    EnvironmentRecord,
    NodeRecord,
    StepRecord,
    StoreChange,
)
from tether.controller.store.rows import (
    AUDIT_COLUMNS,
    ENV_COLUMNS,
    NODE_COLUMNS,
    NODE_FIELDS,
    STEP_COLUMNS,
    TOKEN_COLUMNS,
    encode_json,
    env_record,
    event_row,
    node_record,
    node_values,
    plan_step_rows,
    step_record,
    step_updates,
    token_record,
    token_values,
)
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, now_ms

T = TypeVar("T")
WriteFn = Callable[[sqlite3.Connection], Any]
CommitObserver = Callable[[float, int], None]  # (seconds, writes) of each group commit

SCHEMA_VERSION = SQLITE_VERSION
KEEP_REVISIONS = base.KEEP_REVISIONS  # for imports; both backends read base's at call time


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class _Writer:
    """One thread, one connection, group commit."""

    def __init__(self, path: Path, max_batch: int = 512, observe: CommitObserver | None = None) -> None:
        self._conn = _connect(path)
        self._observe = observe
        self._queue: queue.SimpleQueue[tuple[WriteFn, asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._max_batch = max_batch
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: WriteFn) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put((fn, fut))
        return fut

    def run_sync(self, fn: WriteFn) -> Any:
        """Run ``fn`` on the writer's connection before the loop uses it (start-up, migrations)."""
        return fn(self._conn)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        self._conn.close()

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[tuple[WriteFn, asyncio.Future[Any]]]) -> None:
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        conn = self._conn
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
            for fn, fut in batch:
                conn.execute("SAVEPOINT w")
                try:
                    result = fn(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO w")
                    conn.execute("RELEASE w")
                    outcomes.append((fut, None, exc))
                else:
                    conn.execute("RELEASE w")
                    outcomes.append((fut, result, None))
            conn.execute("COMMIT")
        except Exception as exc:  # the commit itself failed: nobody's write landed
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(fut, None, exc) for _, fut in batch]
        if self._observe is not None:  # before anyone is told: what they see next includes it
            self._observe(time.perf_counter() - started, len(batch))
        # One wake-up of each waiting event loop per commit, not one per write.
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_resolve_all, items)


_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


def _resolve_all(outcomes: list[_Outcome]) -> None:
    for fut, result, error in outcomes:
        if fut.done():
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)


def _open(
    path: Path, migrate: WriteFn, observe: CommitObserver | None = None
) -> tuple[_Writer, sqlite3.Connection]:
    """The writer (schema migrated) and the read connection, or StoreError naming the file."""
    writer: _Writer | None = None
    try:
        writer = _Writer(path, observe=observe)
        writer.run_sync(migrate)
        read = _connect(path)
        read.execute("SELECT COUNT(*) FROM nodes").fetchone()
    except (sqlite3.DatabaseError, StoreError) as exc:
        if writer is not None:
            writer.close()
        if isinstance(exc, StoreError):
            raise
        raise StoreError(
            f"cannot open the controller database {path}: {exc}; restore it from a backup "
            f"(docs/operations.md) or move it aside to start with an empty store"
        ) from None
    return writer, read


class SqliteStore:
    """``Store`` on one SQLite file (one replica: no listener is ever called, every lease is granted)."""

    kind = "sqlite"

    def __init__(self, path: Path, observe_commit: CommitObserver | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.replica_id = uuid.uuid4().hex
        self.path = path
        self._writer, self._read = _open(path, self._migrate, observe_commit)
        for suffix in ("", "-wal", "-shm"):
            p = path.with_name(path.name + suffix)
            if p.exists():
                p.chmod(0o600)
        self._read_lock = threading.Lock()
        # Parsed environments, checked against (generation, created, updated) on every read: the
        # planner and the cluster code ask for one on every stream and event batch, and the
        # document and spec columns are large.
        self._environments: dict[str, EnvironmentRecord] = {}

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        migrate_sqlite(conn)

    async def close(self) -> None:
        await asyncio.to_thread(self._writer.close)
        self._read.close()

    # -- replicas: one process owns the file, so there is nobody to hear from or tell -----------

    def subscribe(self, listener: Callable[[StoreChange], None]) -> None:
        """No other replica writes this file: ``listener`` is never called."""

    async def publish(self, topic: str, payload: str) -> None:
        """No other replica to tell."""

    async def try_lease(self, name: str) -> bool:
        return True

    async def release_lease(self, name: str) -> None:
        """Nothing is held."""

    def lease_lost(self, callback: Callable[[str], None]) -> None:
        """A lease on the one replica is never lost."""

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        result: T = await self._writer.submit(fn)
        return result

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._read_lock:
            return self._read.execute(sql, args).fetchall()

    # -- environments -------------------------------------------------------------------------

    async def put_environment(
        self,
        name: str,
        document: str,
        api_version: str,
        spec: Mapping[str, Any],
        agent_version: str | None = None,
        expected_generation: int = 0,
    ) -> tuple[EnvironmentRecord, bool]:
        spec_json = json.dumps(spec, sort_keys=True)

        def fn(conn: sqlite3.Connection) -> tuple[EnvironmentRecord, bool]:
            now = now_ms()
            row = conn.execute(f"SELECT {ENV_COLUMNS} FROM environments WHERE name=?", (name,)).fetchone()
            check_generation(name, row[4] if row else None, expected_generation)  # in the same transaction
            agent = (row[7] if row else "") if agent_version is None else agent_version
            if row is not None and row[3] == spec_json and row[1] == document and row[7] == agent:
                return env_record(row), False
            # Generations never repeat for a name, even across delete and re-create (caches key on them).
            last = conn.execute("SELECT value FROM meta WHERE key=?", (f"generation:{name}",)).fetchone()
            generation = max(row[4] if row else 0, int(last[0]) if last else 0) + 1
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"generation:{name}", str(generation)))
            created = row[5] if row else now
            values = (name, document, api_version, spec_json, generation, created, now, agent)
            conn.execute(
                f"INSERT OR REPLACE INTO environments ({ENV_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", values
            )
            conn.execute(
                "INSERT OR REPLACE INTO environment_revisions VALUES (?,?,?,?,?,?,?)",
                (name, generation, document, api_version, spec_json, now, agent),
            )
            _prune_revisions(conn, name)
            return env_record(values), True

        return await self._write(fn)

    def get_revision(self, name: str, generation: int) -> EnvironmentRecord | None:
        """Generation ``generation`` of an environment as it was applied (kept while a node runs
        it, and the last ``KEEP_REVISIONS``)."""
        rows = self._query(
            "SELECT name, document, api_version, spec, generation, created_ms, created_ms, agent_version "
            "FROM environment_revisions WHERE name=? AND generation=?",
            (name, generation),
        )
        return env_record(rows[0]) if rows else None

    def get_environment(self, name: str) -> EnvironmentRecord | None:
        rows = self._query(
            "SELECT generation, created_ms, updated_ms FROM environments WHERE name=?", (name,)
        )
        if not rows:
            self._environments.pop(name, None)
            return None
        cached = self._environments.get(name)
        if cached is not None and (cached.generation, cached.created_ms, cached.updated_ms) == rows[0]:
            return cached
        rows = self._query(f"SELECT {ENV_COLUMNS} FROM environments WHERE name=?", (name,))
        if not rows:
            return None
        env = env_record(rows[0])
        self._environments[name] = env
        return env

    def list_environments(self) -> list[EnvironmentRecord]:
        return [env_record(r) for r in self._query(f"SELECT {ENV_COLUMNS} FROM environments ORDER BY name")]

    async def delete_environment(self, name: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM environment_revisions WHERE name=?", (name,))
            return conn.execute("DELETE FROM environments WHERE name=?", (name,)).rowcount > 0

        return await self._write(fn)

    # -- tokens -------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", token_values(record)
            )

        await self._write(fn)

    def get_token(self, token_id: str) -> TokenRecord | None:
        rows = self._query(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE id=?", (token_id,))
        return token_record(rows[0]) if rows else None

    def list_tokens(self, environment: str = "") -> list[TokenRecord]:
        if environment:
            rows = self._query(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE environment=? ORDER BY created_ms", (environment,)
            )
        else:
            rows = self._query(f"SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_ms")
        return [token_record(r) for r in rows]

    async def revoke_token(self, token_id: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("UPDATE tokens SET revoked=1 WHERE id=?", (token_id,)).rowcount > 0

        return await self._write(fn)

    async def enroll_node(
        self,
        token_id: str,
        node_name: str,
        decide: Callable[[TokenRecord | None, NodeRecord | None], tuple[NodeRecord, bool]],
    ) -> NodeRecord:
        """Atomically check a join token, use it, and write the node.

        ``decide(token, existing_node)`` raises to refuse, or returns the node
        record to store and whether the token is consumed (an idempotent retry
        by the same key is not a second use).
        """

        def fn(conn: sqlite3.Connection) -> NodeRecord:
            row = conn.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE id=?", (token_id,)).fetchone()
            token = token_record(row) if row else None
            node_row = conn.execute(f"SELECT {NODE_COLUMNS} FROM nodes WHERE name=?", (node_name,)).fetchone()
            record, consume = decide(token, node_record(node_row) if node_row else None)
            if consume:
                conn.execute("UPDATE tokens SET uses=uses+1 WHERE id=?", (token_id,))
                # A fresh enrollment is a new machine: it has run none of the old one's steps.
                conn.execute("DELETE FROM node_steps WHERE node=?", (node_name,))
            # A fresh machine under this name starts with no quarantine or condition.
            hardware = "{}" if consume else json.dumps(dict(record.hardware))
            conn.execute(
                f"INSERT OR REPLACE INTO nodes ({NODE_COLUMNS}) VALUES ({','.join('?' * 18)})",
                node_values(record, hardware),
            )
            return record

        return await self._write(fn)

    # -- nodes --------------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeRecord | None:
        rows = self._query(f"SELECT {NODE_COLUMNS} FROM nodes WHERE name=?", (name,))
        return node_record(rows[0]) if rows else None

    def list_nodes(self, environment: str = "") -> list[NodeRecord]:
        if environment:
            rows = self._query(
                f"SELECT {NODE_COLUMNS} FROM nodes WHERE environment=? ORDER BY name", (environment,)
            )
        else:
            rows = self._query(f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY name")
        return [node_record(r) for r in rows]

    def list_nodes_page(self, environment: str, after: str, limit: int) -> list[NodeRecord]:
        """Up to ``limit`` nodes named after ``after``, by name: one page of a keyset scan."""
        if environment:
            where, args = "name > ? AND environment=?", [after, environment]
        else:
            where, args = "name > ?", [after]
        sql = f"SELECT {NODE_COLUMNS} FROM nodes WHERE {where} ORDER BY name LIMIT ?"
        return [node_record(r) for r in self._query(sql, [*args, limit])]

    async def update_node(self, name: str, **fields: Any) -> None:
        unknown = set(fields) - NODE_FIELDS
        if unknown:
            raise ValueError(f"unknown node fields: {sorted(unknown)}")
        if not fields:
            return
        cols = ", ".join(f"{k}=?" for k in fields)
        values = [_sqlite_value(v) for v in fields.values()]

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(f"UPDATE nodes SET {cols} WHERE name=?", (*values, name))

        await self._write(fn)

    async def patch_node_hardware(self, name: str, changes: Mapping[str, Any]) -> None:
        """Set keys of the node's ``hardware`` record (None removes one) in one write: the gate
        (quarantine, released) and the drift watch (conditions) never overwrite each other."""
        patch = dict(changes)

        def fn(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT hardware FROM nodes WHERE name=?", (name,)).fetchone()
            if row is None:
                return
            hardware = json.loads(row[0])
            for key, value in patch.items():
                if value is None:
                    hardware.pop(key, None)
                else:
                    hardware[key] = value
            conn.execute(
                "UPDATE nodes SET hardware=? WHERE name=?", (json.dumps(hardware, sort_keys=True), name)
            )

        await self._write(fn)

    async def set_node_plan(self, name: str, plan: Plan) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            old = {
                r[0]: r
                for r in conn.execute(
                    "SELECT name, digest, state, exit_code, attempt, updated_ms, message, observed "
                    "FROM node_steps WHERE node=?",
                    (name,),
                )
            }
            conn.execute("DELETE FROM node_steps WHERE node=?", (name,))
            rows = plan_step_rows(name, plan.steps, old)
            conn.executemany("INSERT INTO node_steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            conn.execute(
                "UPDATE nodes SET plan_generation=?, plan_digest=? WHERE name=?",
                (plan.generation, plan.digest, name),
            )

        await self._write(fn)

    def node_steps(self, name: str) -> list[StepRecord]:
        rows = self._query(f"SELECT {STEP_COLUMNS} FROM node_steps WHERE node=? ORDER BY ordinal", (name,))
        return [step_record(r) for r in rows]

    async def reset_steps(self, name: str, steps: Sequence[str]) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            if steps:
                conn.executemany(
                    "UPDATE node_steps SET state='pending' WHERE node=? AND name=?",
                    [(name, s) for s in steps],
                )
            else:
                conn.execute("UPDATE node_steps SET state='pending' WHERE node=?", (name,))

        await self._write(fn)

    async def delete_node(self, name: str) -> bool:
        """Forget a node: its record, its steps and every event it reported, in one transaction."""

        def fn(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM node_steps WHERE node=?", (name,))
            conn.execute("DELETE FROM events WHERE node=?", (name,))
            return conn.execute("DELETE FROM nodes WHERE name=?", (name,)).rowcount > 0

        return await self._write(fn)

    # -- events -------------------------------------------------------------------------------

    async def append_events(self, node: str, events: Sequence[Event]) -> int:
        """Store events idempotently by (node, seq); returns the highest contiguous stored seq."""
        rows = [event_row(node, e) for e in events]

        def fn(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT stored_seq FROM nodes WHERE name=?", (node,)).fetchone()
            if row is None:
                raise KeyError(f"unknown node {node!r}")
            stored = int(row[0])
            fresh = [r for r in rows if r[1] > stored]
            if not fresh:
                return stored
            conn.executemany("INSERT OR IGNORE INTO events VALUES (?,?,?,?,?,?)", fresh)
            # Advance the contiguous mark over what is stored now (events beyond an old gap included).
            new_stored = _contiguous(conn, node, stored)
            _apply_step_events(conn, step_updates(node, [e for e in events if e.seq > stored]))
            conn.execute("UPDATE nodes SET stored_seq=? WHERE name=?", (new_stored, node))
            return new_stored

        return await self._write(fn)

    async def accept_acked(self, node: str, acked_seq: int) -> int:
        """The agent says events up to ``acked_seq`` were acknowledged, and this store is behind
        (restored from an earlier copy): record the gap as one event (at the first missing number)
        and take the agent's boundary, so its outbox drains. Returns the new stored seq."""

        def fn(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT stored_seq FROM nodes WHERE name=?", (node,)).fetchone()
            if row is None:
                raise KeyError(f"unknown node {node!r}")
            stored = int(row[0])
            if acked_seq <= stored:
                return stored
            gap = Event(
                kind=EventKind.INFO,
                seq=stored + 1,
                time_ms=now_ms(),
                message=(
                    f"events {stored + 1}..{acked_seq} were acknowledged before this controller's "
                    "store was restored from an earlier copy; they are missing here"
                ),
            )
            conn.execute("INSERT OR IGNORE INTO events VALUES (?,?,?,?,?,?)", event_row(node, gap))
            new_stored = _contiguous(conn, node, acked_seq)
            conn.execute("UPDATE nodes SET stored_seq=? WHERE name=?", (new_stored, node))
            return new_stored

        return await self._write(fn)

    async def list_events(self, node: str, after_seq: int = 0, limit: int = 0) -> list[Event]:
        sql = "SELECT body FROM events WHERE node=? AND seq>? ORDER BY seq"
        args: list[Any] = [node, after_seq]
        if limit:
            sql += " LIMIT ?"
            args.append(limit)
        return [Event.from_json(json.loads(r[0])) for r in self._query(sql, args)]

    def max_seq(self, node: str) -> int:
        rows = self._query("SELECT MAX(seq) FROM events WHERE node=?", (node,))
        return int(rows[0][0] or 0)

    # -- audit log ----------------------------------------------------------------------------

    async def append_audit(self, record: AuditRecord) -> AuditRecord:
        """Store ``record`` under the next id; the oldest go past ``KEEP_AUDIT_RECORDS`` successful
        records or ``KEEP_AUDIT_REFUSALS`` refusals, each bound trimmed apart (refusals, which any
        admin can cause, never push a change out)."""
        values = astuple(record)[1:]

        def fn(conn: sqlite3.Connection) -> AuditRecord:
            cur = conn.execute(f"INSERT INTO audit ({AUDIT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", values)
            refusals = int(conn.execute("SELECT count(*) FROM audit WHERE outcome != 'ok'").fetchone()[0])
            changes = int(conn.execute("SELECT count(*) FROM audit").fetchone()[0]) - refusals
            for op, excess in (
                ("!=", refusals - base.KEEP_AUDIT_REFUSALS),
                ("=", changes - base.KEEP_AUDIT_RECORDS),
            ):
                if excess > 0:  # the oldest of that kind go (refusals by their index)
                    conn.execute(
                        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE outcome "
                        f"{op} 'ok' ORDER BY id LIMIT ?)",
                        (excess,),
                    )
            return replace(record, id=int(cur.lastrowid or 0))

        return await self._write(fn)

    async def list_audit(
        self, environment: str = "", before_id: int = 0, limit: int = 100, environments: Collection[str] = ()
    ) -> list[AuditRecord]:
        where: list[str] = ["id < ?"]
        args: list[Any] = [before_id or (1 << 63) - 1]  # 0: from the newest
        if environment:
            where.append("environment = ?")
            args.append(environment)
        if environments:
            where.append(f"environment IN ({','.join('?' * len(environments))})")
            args.extend(sorted(environments))
        sql = f"SELECT id, {AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
        return [AuditRecord(*r) for r in self._query(sql, [*args, limit])]

    # -- key/value ----------------------------------------------------------------------------

    async def kv_put(self, key: str, value: bytes) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO kv VALUES (?,?)", (key, value))

        await self._write(fn)

    async def kv_put_if_absent(self, key: str, value: bytes) -> bytes:
        def fn(conn: sqlite3.Connection) -> bytes:
            conn.execute("INSERT OR IGNORE INTO kv VALUES (?,?)", (key, value))
            row = conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
            return bytes(row[0])

        return await self._write(fn)

    async def refresh_node(self, name: str) -> NodeRecord | None:
        return self.get_node(name)  # one replica: what it reads is what the file holds

    def kv_keys(self, prefix: str) -> list[str]:
        rows = self._query(
            "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key", (prefix, prefix + "\uffff")
        )
        return [r[0] for r in rows]

    def kv_get(self, key: str) -> bytes | None:
        rows = self._query("SELECT value FROM kv WHERE key=?", (key,))
        return bytes(rows[0][0]) if rows else None

    async def kv_delete(self, key: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM kv WHERE key=?", (key,))

        await self._write(fn)


def _prune_revisions(conn: sqlite3.Connection, name: str) -> None:
    """Forget documents older than the last ``KEEP_REVISIONS`` that no node of ``name`` runs."""
    keep = conn.execute(
        "SELECT generation FROM environment_revisions WHERE name=? ORDER BY generation DESC LIMIT 1 OFFSET ?",
        (name, base.KEEP_REVISIONS - 1),
    ).fetchone()
    if keep is None:
        return
    oldest_used = conn.execute(
        "SELECT MIN(plan_generation) FROM nodes WHERE environment=? AND plan_generation > 0", (name,)
    ).fetchone()[0]
    floor = min(keep[0], oldest_used) if oldest_used else keep[0]
    conn.execute("DELETE FROM environment_revisions WHERE name=? AND generation < ?", (name, floor))


def _contiguous(conn: sqlite3.Connection, node: str, start: int) -> int:
    """The highest seq up to which ``node``'s events are stored without a gap, counting from ``start``."""
    mark = start
    for (seq,) in conn.execute("SELECT seq FROM events WHERE node=? AND seq>? ORDER BY seq", (node, start)):
        if seq != mark + 1:
            break
        mark = seq
    return mark


def _apply_step_events(conn: sqlite3.Connection, updates: list[tuple[Any, ...]]) -> None:
    if updates:
        conn.executemany(
            "UPDATE node_steps SET state=?, exit_code=?, attempt=?, updated_ms=?, message=?, "
            "observed=COALESCE(?, observed) WHERE node=? AND name=? AND digest=?",
            updates,
        )


def _sqlite_value(value: Any) -> Any:
    value = encode_json(value)
    return int(value) if isinstance(value, bool) else value
