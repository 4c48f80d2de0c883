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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import astuple, replace
from pathlib import Path
from typing import Any, TypeVar

from tether.controller.errors import StoreError, check_generation
from tether.controller.store.records import AuditRecord, EnvironmentRecord, NodeRecord, StepRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, now_ms

T = TypeVar("T")
WriteFn = Callable[[sqlite3.Connection], Any]
CommitObserver = Callable[[float, int], None]  # (seconds, writes) of each group commit

SCHEMA_VERSION = 5  # 4: the audit log (its table is made with the others, by SCHEMA); 5: nodes.hardware
KEEP_REVISIONS = 20  # an environment's past documents kept (and every one a node still runs)
KEEP_AUDIT_RECORDS = 100_000  # the audit log's newest successful records kept; older ones go as new come
KEEP_AUDIT_REFUSALS = 10_000  # its newest refusals (outcome not "ok"), kept apart: they never evict a change
AUDIT_DDL = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time_ms INTEGER NOT NULL, admin TEXT NOT NULL,
    fingerprint TEXT NOT NULL, method TEXT NOT NULL, environment TEXT NOT NULL, node TEXT NOT NULL,
    generation_before INTEGER NOT NULL, generation_after INTEGER NOT NULL, outcome TEXT NOT NULL,
    detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_by_environment ON audit (environment, id);
CREATE INDEX IF NOT EXISTS audit_refusals ON audit (id) WHERE outcome != 'ok';
"""
REVISIONS_DDL = """
CREATE TABLE IF NOT EXISTS environment_revisions (
    name TEXT NOT NULL, generation INTEGER NOT NULL, document TEXT NOT NULL, api_version TEXT NOT NULL,
    spec TEXT NOT NULL, created_ms INTEGER NOT NULL, agent_version TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (name, generation)) WITHOUT ROWID;
"""
SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (
    name TEXT PRIMARY KEY, document TEXT NOT NULL, api_version TEXT NOT NULL, spec TEXT NOT NULL,
    generation INTEGER NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL,
    agent_version TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL, environment TEXT NOT NULL, role TEXT NOT NULL,
    node_name TEXT NOT NULL, expires_ms INTEGER NOT NULL, max_uses INTEGER NOT NULL, uses INTEGER NOT NULL,
    revoked INTEGER NOT NULL, created_ms INTEGER NOT NULL, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY, environment TEXT NOT NULL, role TEXT NOT NULL, cert_fingerprint TEXT NOT NULL,
    prev_fingerprint TEXT NOT NULL DEFAULT '', key_hash TEXT NOT NULL, token_id TEXT NOT NULL,
    enrolled_ms INTEGER NOT NULL, revoked INTEGER NOT NULL DEFAULT 0, facts TEXT NOT NULL DEFAULT '{}',
    health TEXT NOT NULL DEFAULT '{}', last_seen_ms INTEGER NOT NULL DEFAULT 0,
    agent_version TEXT NOT NULL DEFAULT '', plan_generation INTEGER NOT NULL DEFAULT 0,
    plan_digest TEXT NOT NULL DEFAULT '', stored_seq INTEGER NOT NULL DEFAULT 0,
    agent_rolled_back_from TEXT NOT NULL DEFAULT '', hardware TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS nodes_by_env ON nodes (environment);
CREATE TABLE IF NOT EXISTS node_steps (
    node TEXT NOT NULL, ordinal INTEGER NOT NULL, name TEXT NOT NULL, digest TEXT NOT NULL,
    state TEXT NOT NULL, component TEXT NOT NULL, continue_on_error INTEGER NOT NULL,
    exit_code INTEGER NOT NULL DEFAULT 0, attempt INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
    observed TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (node, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    node TEXT NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL, kind INTEGER NOT NULL,
    step TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (node, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
"""
    + REVISIONS_DDL
    + AUDIT_DDL
)

NODE_FIELDS = {
    "environment",
    "role",
    "cert_fingerprint",
    "prev_fingerprint",
    "key_hash",
    "token_id",
    "enrolled_ms",
    "revoked",
    "facts",
    "health",
    "last_seen_ms",
    "agent_version",
    "agent_rolled_back_from",
    "hardware",
    "plan_generation",
    "plan_digest",
}

_STEP_STATE_BY_KIND = {
    EventKind.STARTED: "running",
    EventKind.WAITING: "waiting",
    EventKind.SUCCEEDED: "succeeded",
    EventKind.FAILED: "failed",
    EventKind.SKIPPED: "skipped",
}


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


_ENV_COLUMNS = "name, document, api_version, spec, generation, created_ms, updated_ms, agent_version"
_AUDIT_COLUMNS = (
    "time_ms, admin, fingerprint, method, environment, node, generation_before, generation_after, "
    "outcome, detail"
)


def _env(row: sqlite3.Row | tuple[Any, ...]) -> EnvironmentRecord:
    name, document, api_version, spec, generation, created, updated, agent_version = row
    return EnvironmentRecord(
        name, document, api_version, json.loads(spec), generation, created, updated, agent_version
    )


def _token(row: sqlite3.Row | tuple[Any, ...]) -> TokenRecord:
    (tid, secret_hash, env, role, node_name, expires, max_uses, uses, revoked, created, desc) = row
    return TokenRecord(
        tid, secret_hash, env, role, node_name, expires, max_uses, uses, bool(revoked), created, desc
    )


_NODE_COLUMNS = (
    "name, environment, role, cert_fingerprint, key_hash, token_id, enrolled_ms, revoked, facts, health, "
    "last_seen_ms, agent_version, plan_generation, plan_digest, stored_seq, prev_fingerprint, "
    "agent_rolled_back_from, hardware"
)


def _node(row: sqlite3.Row | tuple[Any, ...]) -> NodeRecord:
    (
        name,
        env,
        role,
        fp,
        key_hash,
        token_id,
        enrolled,
        revoked,
        facts,
        health,
        last_seen,
        version,
        generation,
        digest,
        stored_seq,
        prev_fp,
        rolled_back_from,
        hardware,
    ) = row
    return NodeRecord(
        name=name,
        environment=env,
        role=role,
        cert_fingerprint=fp,
        key_hash=key_hash,
        token_id=token_id,
        enrolled_ms=enrolled,
        revoked=bool(revoked),
        facts=json.loads(facts),
        health=json.loads(health),
        last_seen_ms=last_seen,
        agent_version=version,
        plan_generation=generation,
        plan_digest=digest,
        stored_seq=stored_seq,
        prev_fingerprint=prev_fp,
        agent_rolled_back_from=rolled_back_from,
        hardware=json.loads(hardware),
    )


def _encode(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return int(value)
    return value


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
    """``Store`` on one SQLite file."""

    def __init__(self, path: Path, observe_commit: CommitObserver | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
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
        row = None
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"the database schema {row[0]} is newer than this controller ({SCHEMA_VERSION}): "
                "run the controller version that wrote it, or restore a backup"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            if row is not None and int(row[0]) < 2:
                _migrate_to_2(conn)
            if row is not None and int(row[0]) < 3:
                _migrate_to_3(conn)
            if row is not None and int(row[0]) < 5:
                _migrate_to_5(conn)
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        await asyncio.to_thread(self._writer.close)
        self._read.close()

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
            row = conn.execute(f"SELECT {_ENV_COLUMNS} FROM environments WHERE name=?", (name,)).fetchone()
            check_generation(name, row[4] if row else None, expected_generation)  # in the same transaction
            agent = (row[7] if row else "") if agent_version is None else agent_version
            if row is not None and row[3] == spec_json and row[1] == document and row[7] == agent:
                return _env(row), False
            # Generations never repeat for a name, even across delete and re-create (caches key on them).
            last = conn.execute("SELECT value FROM meta WHERE key=?", (f"generation:{name}",)).fetchone()
            generation = max(row[4] if row else 0, int(last[0]) if last else 0) + 1
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"generation:{name}", str(generation)))
            created = row[5] if row else now
            values = (name, document, api_version, spec_json, generation, created, now, agent)
            conn.execute(
                f"INSERT OR REPLACE INTO environments ({_ENV_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", values
            )
            conn.execute(
                "INSERT OR REPLACE INTO environment_revisions VALUES (?,?,?,?,?,?,?)",
                (name, generation, document, api_version, spec_json, now, agent),
            )
            _prune_revisions(conn, name)
            return _env(values), True

        return await self._write(fn)

    def get_revision(self, name: str, generation: int) -> EnvironmentRecord | None:
        """Generation ``generation`` of an environment as it was applied (kept while a node runs
        it, and the last ``KEEP_REVISIONS``)."""
        rows = self._query(
            "SELECT name, document, api_version, spec, generation, created_ms, created_ms, agent_version "
            "FROM environment_revisions WHERE name=? AND generation=?",
            (name, generation),
        )
        return _env(rows[0]) if rows else None

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
        rows = self._query(f"SELECT {_ENV_COLUMNS} FROM environments WHERE name=?", (name,))
        if not rows:
            return None
        env = _env(rows[0])
        self._environments[name] = env
        return env

    def list_environments(self) -> list[EnvironmentRecord]:
        return [_env(r) for r in self._query(f"SELECT {_ENV_COLUMNS} FROM environments ORDER BY name")]

    async def delete_environment(self, name: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM environment_revisions WHERE name=?", (name,))
            return conn.execute("DELETE FROM environments WHERE name=?", (name,)).rowcount > 0

        return await self._write(fn)

    # -- tokens -------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO tokens VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    record.id,
                    record.secret_hash,
                    record.environment,
                    record.role,
                    record.node_name,
                    record.expires_ms,
                    record.max_uses,
                    record.uses,
                    int(record.revoked),
                    record.created_ms,
                    record.description,
                ),
            )

        await self._write(fn)

    def get_token(self, token_id: str) -> TokenRecord | None:
        rows = self._query("SELECT * FROM tokens WHERE id=?", (token_id,))
        return _token(rows[0]) if rows else None

    def list_tokens(self, environment: str = "") -> list[TokenRecord]:
        if environment:
            rows = self._query("SELECT * FROM tokens WHERE environment=? ORDER BY created_ms", (environment,))
        else:
            rows = self._query("SELECT * FROM tokens ORDER BY created_ms")
        return [_token(r) for r in rows]

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
            row = conn.execute("SELECT * FROM tokens WHERE id=?", (token_id,)).fetchone()
            token = _token(row) if row else None
            node_row = conn.execute(
                f"SELECT {_NODE_COLUMNS} FROM nodes WHERE name=?", (node_name,)
            ).fetchone()
            record, consume = decide(token, _node(node_row) if node_row else None)
            if consume:
                conn.execute("UPDATE tokens SET uses=uses+1 WHERE id=?", (token_id,))
                # A fresh enrollment is a new machine: it has run none of the old one's steps.
                conn.execute("DELETE FROM node_steps WHERE node=?", (node_name,))
            conn.execute(
                f"INSERT OR REPLACE INTO nodes ({_NODE_COLUMNS}) VALUES ({','.join('?' * 18)})",
                (
                    record.name,
                    record.environment,
                    record.role,
                    record.cert_fingerprint,
                    record.key_hash,
                    record.token_id,
                    record.enrolled_ms,
                    int(record.revoked),
                    json.dumps(dict(record.facts)),
                    json.dumps(dict(record.health)),
                    record.last_seen_ms,
                    record.agent_version,
                    record.plan_generation,
                    record.plan_digest,
                    record.stored_seq,
                    record.prev_fingerprint,
                    record.agent_rolled_back_from,
                    # A fresh machine under this name starts with no quarantine or condition.
                    "{}" if consume else json.dumps(dict(record.hardware)),
                ),
            )
            return record

        return await self._write(fn)

    # -- nodes --------------------------------------------------------------------------------

    def get_node(self, name: str) -> NodeRecord | None:
        rows = self._query(f"SELECT {_NODE_COLUMNS} FROM nodes WHERE name=?", (name,))
        return _node(rows[0]) if rows else None

    def list_nodes(self, environment: str = "") -> list[NodeRecord]:
        if environment:
            rows = self._query(
                f"SELECT {_NODE_COLUMNS} FROM nodes WHERE environment=? ORDER BY name", (environment,)
            )
        else:
            rows = self._query(f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY name")
        return [_node(r) for r in rows]

    def list_nodes_page(self, environment: str, after: str, limit: int) -> list[NodeRecord]:
        """Up to ``limit`` nodes named after ``after``, by name: one page of a keyset scan."""
        if environment:
            where, args = "name > ? AND environment=?", [after, environment]
        else:
            where, args = "name > ?", [after]
        sql = f"SELECT {_NODE_COLUMNS} FROM nodes WHERE {where} ORDER BY name LIMIT ?"
        return [_node(r) for r in self._query(sql, [*args, limit])]

    async def update_node(self, name: str, **fields: Any) -> None:
        unknown = set(fields) - NODE_FIELDS
        if unknown:
            raise ValueError(f"unknown node fields: {sorted(unknown)}")
        if not fields:
            return
        cols = ", ".join(f"{k}=?" for k in fields)
        values = [_encode(v) for v in fields.values()]

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
            rows = []
            for i, step in enumerate(plan.steps):
                prev = old.get(step.name)
                if prev is not None and prev[1] == step.digest:
                    state, exit_code, attempt, updated, message, observed = prev[2:]
                else:
                    state, exit_code, attempt, updated, message, observed = "pending", 0, 0, 0, "", "{}"
                rows.append(
                    (
                        name,
                        i,
                        step.name,
                        step.digest,
                        state,
                        step.component,
                        int(step.continue_on_error),
                        exit_code,
                        attempt,
                        updated,
                        message,
                        observed,
                    )
                )
            conn.executemany("INSERT INTO node_steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            conn.execute(
                "UPDATE nodes SET plan_generation=?, plan_digest=? WHERE name=?",
                (plan.generation, plan.digest, name),
            )

        await self._write(fn)

    def node_steps(self, name: str) -> list[StepRecord]:
        rows = self._query(
            "SELECT node, ordinal, name, digest, state, component, continue_on_error, exit_code, attempt, "
            "updated_ms, message, observed FROM node_steps WHERE node=? ORDER BY ordinal",
            (name,),
        )
        return [
            StepRecord(
                node=r[0],
                ordinal=r[1],
                name=r[2],
                digest=r[3],
                state=r[4],
                component=r[5],
                continue_on_error=bool(r[6]),
                exit_code=r[7],
                attempt=r[8],
                updated_ms=r[9],
                message=r[10],
                observed=json.loads(r[11]),
            )
            for r in rows
        ]

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
        rows = [_event_row(node, e) for e in events]

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
            _apply_step_events(conn, node, [e for e in events if e.seq > stored])
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
            conn.execute("INSERT OR IGNORE INTO events VALUES (?,?,?,?,?,?)", _event_row(node, gap))
            new_stored = _contiguous(conn, node, acked_seq)
            conn.execute("UPDATE nodes SET stored_seq=? WHERE name=?", (new_stored, node))
            return new_stored

        return await self._write(fn)

    def list_events(self, node: str, after_seq: int = 0, limit: int = 0) -> list[Event]:
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
            cur = conn.execute(f"INSERT INTO audit ({_AUDIT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", values)
            refusals = int(conn.execute("SELECT count(*) FROM audit WHERE outcome != 'ok'").fetchone()[0])
            changes = int(conn.execute("SELECT count(*) FROM audit").fetchone()[0]) - refusals
            for op, excess in (("!=", refusals - KEEP_AUDIT_REFUSALS), ("=", changes - KEEP_AUDIT_RECORDS)):
                if excess > 0:  # the oldest of that kind go (refusals by their index)
                    conn.execute(
                        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE outcome "
                        f"{op} 'ok' ORDER BY id LIMIT ?)",
                        (excess,),
                    )
            return replace(record, id=int(cur.lastrowid or 0))

        return await self._write(fn)

    def list_audit(
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
        sql = f"SELECT id, {_AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
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


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2 (in the caller's transaction): environments learn their agent version, and
    their past documents are kept, starting with the current one."""
    conn.execute("ALTER TABLE environments ADD COLUMN agent_version TEXT NOT NULL DEFAULT ''")
    conn.execute(REVISIONS_DDL)
    conn.execute(
        "INSERT OR IGNORE INTO environment_revisions "
        "SELECT name, generation, document, api_version, spec, updated_ms, agent_version FROM environments"
    )


def _migrate_to_3(conn: sqlite3.Connection) -> None:
    """Schema 2 -> 3: a node remembers the agent version it rolled back from."""
    conn.execute("ALTER TABLE nodes ADD COLUMN agent_rolled_back_from TEXT NOT NULL DEFAULT ''")


def _migrate_to_5(conn: sqlite3.Connection) -> None:
    """Schema 4 -> 5: a node keeps its hardware verdict (quarantine, releases, conditions)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(nodes)")}
    if "hardware" not in columns:
        conn.execute("ALTER TABLE nodes ADD COLUMN hardware TEXT NOT NULL DEFAULT '{}'")


def _prune_revisions(conn: sqlite3.Connection, name: str) -> None:
    """Forget documents older than the last ``KEEP_REVISIONS`` that no node of ``name`` runs."""
    keep = conn.execute(
        "SELECT generation FROM environment_revisions WHERE name=? ORDER BY generation DESC LIMIT 1 OFFSET ?",
        (name, KEEP_REVISIONS - 1),
    ).fetchone()
    if keep is None:
        return
    oldest_used = conn.execute(
        "SELECT MIN(plan_generation) FROM nodes WHERE environment=? AND plan_generation > 0", (name,)
    ).fetchone()[0]
    floor = min(keep[0], oldest_used) if oldest_used else keep[0]
    conn.execute("DELETE FROM environment_revisions WHERE name=? AND generation < ?", (name, floor))


def _apply_step_events(conn: sqlite3.Connection, node: str, events: Sequence[Event]) -> None:
    updates = []
    for e in events:
        state = "retrying" if e.kind is EventKind.FAILED and e.will_retry else _STEP_STATE_BY_KIND.get(e.kind)
        if state is None or not e.step:
            continue
        updates.append(
            (
                state,
                e.exit_code,
                e.attempt,
                e.time_ms,
                e.message,
                json.dumps(dict(e.observed), sort_keys=True) if e.observed else None,
                node,
                e.step,
                e.digest,
            )
        )
    if updates:
        conn.executemany(
            "UPDATE node_steps SET state=?, exit_code=?, attempt=?, updated_ms=?, message=?, "
            "observed=COALESCE(?, observed) WHERE node=? AND name=? AND digest=?",
            updates,
        )


def _contiguous(conn: sqlite3.Connection, node: str, start: int) -> int:
    """The highest seq up to which ``node``'s events are stored without a gap, counting from ``start``."""
    mark = start
    for (seq,) in conn.execute("SELECT seq FROM events WHERE node=? AND seq>? ORDER BY seq", (node, start)):
        if seq != mark + 1:
            break
        mark = seq
    return mark


def _event_row(node: str, e: Event) -> tuple[str, int, int, int, str, str]:
    """An ``events`` row: (node, seq, time, kind, step, the event as JSON)."""
    return (node, e.seq, e.time_ms, int(e.kind), e.step, json.dumps(e.to_json(), separators=(",", ":")))
