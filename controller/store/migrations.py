"""Versioned schema migrations for both backends, applied at open under a lock.

Each backend keeps a table of the versions applied (``schema_migrations``); a store applies the
missing ones in order in one transaction: SQLite under ``BEGIN IMMEDIATE``, PostgreSQL under
``pg_advisory_xact_lock`` (replicas starting at once apply them once). A database from a newer
controller is refused. SQLite files from before the table (``meta.schema_version`` 1..5) are
migrated in place as before. ``tether-controller migrate`` runs :func:`apply` by hand.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tether.controller.errors import StoreError

if TYPE_CHECKING:
    from psycopg import AsyncConnection

# -- SQLite ------------------------------------------------------------------------------------

SQLITE_VERSION = 5  # the newest SQLite migration (also kept in meta.schema_version for old controllers)
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
SQLITE_SCHEMA = (
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
SQLITE_MIGRATIONS_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_ms INTEGER NOT NULL)
"""


def _sqlite_script(conn: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def _sqlite_to_2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE environments ADD COLUMN agent_version TEXT NOT NULL DEFAULT ''")
    conn.execute(REVISIONS_DDL)
    conn.execute(
        "INSERT OR IGNORE INTO environment_revisions "
        "SELECT name, generation, document, api_version, spec, updated_ms, agent_version FROM environments"
    )


def _sqlite_to_3(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE nodes ADD COLUMN agent_rolled_back_from TEXT NOT NULL DEFAULT ''")


def _sqlite_to_4(conn: sqlite3.Connection) -> None:
    _sqlite_script(conn, AUDIT_DDL)


def _sqlite_to_5(conn: sqlite3.Connection) -> None:
    columns = {row[1] for row in conn.execute("PRAGMA table_info(nodes)")}
    if "hardware" not in columns:
        conn.execute("ALTER TABLE nodes ADD COLUMN hardware TEXT NOT NULL DEFAULT '{}'")


@dataclass(frozen=True)
class SqliteMigration:
    version: int
    name: str
    apply: Callable[[sqlite3.Connection], None]


SQLITE_MIGRATIONS = (
    SqliteMigration(2, "environments keep their agent version and past documents", _sqlite_to_2),
    SqliteMigration(3, "a node remembers the agent version it rolled back from", _sqlite_to_3),
    SqliteMigration(4, "the audit log", _sqlite_to_4),
    SqliteMigration(5, "a node keeps its hardware verdict", _sqlite_to_5),
)


def _sqlite_version(conn: sqlite3.Connection) -> int | None:
    """meta.schema_version of the file (None: a new file)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
        return None
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return None if row is None else int(row[0])


def _sqlite_applied(conn: sqlite3.Connection, version: int | None) -> tuple[set[int], list[str]]:
    """The versions applied: meta.schema_version says (old controllers read it too); the table
    records when each was applied (filled in for a file from before it)."""
    conn.execute(SQLITE_MIGRATIONS_DDL)
    now = int(time.time() * 1000)
    if version is None:  # a new file: today's schema in one go
        _sqlite_script(conn, SQLITE_SCHEMA)
        applied = set(range(1, SQLITE_VERSION + 1))
        rows = [(v, "the schema (new database)", now) for v in sorted(applied)]
        done = [f"1..{SQLITE_VERSION}: the schema (new database)"]
    else:
        applied = set(range(1, version + 1))
        conn.execute("DELETE FROM schema_migrations WHERE version > ?", (version,))
        rows = [(v, "applied before the migrations table", now) for v in sorted(applied)]
        done = []
    conn.executemany("INSERT OR IGNORE INTO schema_migrations VALUES (?, ?, ?)", rows)
    return applied, done


def migrate_sqlite(conn: sqlite3.Connection) -> list[str]:
    """Bring the file at ``conn`` (autocommit) to SQLITE_VERSION; what was applied, one line each."""
    version = _sqlite_version(conn)
    if version is not None and version > SQLITE_VERSION:
        raise StoreError(
            f"the database schema {version} is newer than this controller ({SQLITE_VERSION}): "
            "run the controller version that wrote it, or restore a backup"
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        applied, done = _sqlite_applied(conn, version)
        for m in SQLITE_MIGRATIONS:
            if m.version not in applied:
                m.apply(conn)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (m.version, m.name, int(time.time() * 1000)),
                )
                done.append(f"{m.version}: {m.name}")
        _sqlite_script(conn, SQLITE_SCHEMA)  # idempotent: whatever an old file lacks
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SQLITE_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return done


# -- PostgreSQL --------------------------------------------------------------------------------

PG_LOCK = 0x7465746865720001  # pg_advisory_xact_lock key of the migrations ("tether" 1)
PG_SCHEMA_1 = """
CREATE SEQUENCE tether_rev;
CREATE TABLE environments (
    name text PRIMARY KEY, document text NOT NULL, api_version text NOT NULL, spec text NOT NULL,
    generation bigint NOT NULL, created_ms bigint NOT NULL, updated_ms bigint NOT NULL,
    agent_version text NOT NULL DEFAULT '', rev bigint NOT NULL DEFAULT nextval('tether_rev'));
CREATE TABLE environment_generations (name text PRIMARY KEY, generation bigint NOT NULL);
CREATE TABLE environment_revisions (
    name text NOT NULL, generation bigint NOT NULL, document text NOT NULL, api_version text NOT NULL,
    spec text NOT NULL, created_ms bigint NOT NULL, agent_version text NOT NULL DEFAULT '',
    PRIMARY KEY (name, generation));
CREATE TABLE tokens (
    id text PRIMARY KEY, secret_hash text NOT NULL, environment text NOT NULL, role text NOT NULL,
    node_name text NOT NULL, expires_ms bigint NOT NULL, max_uses bigint NOT NULL, uses bigint NOT NULL,
    revoked boolean NOT NULL, created_ms bigint NOT NULL, description text NOT NULL,
    rev bigint NOT NULL DEFAULT nextval('tether_rev'));
CREATE TABLE nodes (
    name text PRIMARY KEY, environment text NOT NULL, role text NOT NULL, cert_fingerprint text NOT NULL,
    prev_fingerprint text NOT NULL DEFAULT '', key_hash text NOT NULL, token_id text NOT NULL,
    enrolled_ms bigint NOT NULL, revoked boolean NOT NULL DEFAULT false, facts text NOT NULL DEFAULT '{}',
    health text NOT NULL DEFAULT '{}', last_seen_ms bigint NOT NULL DEFAULT 0,
    agent_version text NOT NULL DEFAULT '', plan_generation bigint NOT NULL DEFAULT 0,
    plan_digest text NOT NULL DEFAULT '', stored_seq bigint NOT NULL DEFAULT 0,
    agent_rolled_back_from text NOT NULL DEFAULT '', hardware text NOT NULL DEFAULT '{}',
    max_seq bigint NOT NULL DEFAULT 0, rev bigint NOT NULL DEFAULT nextval('tether_rev'));
CREATE INDEX nodes_by_env ON nodes (environment);
CREATE TABLE node_steps (
    node text NOT NULL, ordinal integer NOT NULL, name text NOT NULL, digest text NOT NULL,
    state text NOT NULL, component text NOT NULL, continue_on_error boolean NOT NULL,
    exit_code integer NOT NULL DEFAULT 0, attempt integer NOT NULL DEFAULT 0,
    updated_ms bigint NOT NULL DEFAULT 0, message text NOT NULL DEFAULT '',
    observed text NOT NULL DEFAULT '{}', PRIMARY KEY (node, name));
CREATE TABLE events (
    node text NOT NULL, seq bigint NOT NULL, time_ms bigint NOT NULL, kind integer NOT NULL,
    step text NOT NULL, body text NOT NULL, PRIMARY KEY (node, seq));
CREATE TABLE kv (
    key text PRIMARY KEY, value bytea NOT NULL, rev bigint NOT NULL DEFAULT nextval('tether_rev'));
CREATE TABLE audit (
    id bigserial PRIMARY KEY, time_ms bigint NOT NULL, admin text NOT NULL, fingerprint text NOT NULL,
    method text NOT NULL, environment text NOT NULL, node text NOT NULL, generation_before bigint NOT NULL,
    generation_after bigint NOT NULL, outcome text NOT NULL, detail text NOT NULL);
CREATE INDEX audit_by_environment ON audit (environment, id);
CREATE INDEX audit_refusals ON audit (id) WHERE outcome <> 'ok';
"""
PG_MIGRATIONS: tuple[tuple[int, str, str], ...] = ((1, "the schema", PG_SCHEMA_1),)
PG_VERSION = PG_MIGRATIONS[-1][0]


async def migrate_postgres(conn: AsyncConnection[object]) -> list[str]:
    """Apply the missing PostgreSQL migrations in one transaction under an advisory lock (two
    replicas starting at once: the second waits, then finds them applied); what was applied."""
    done: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (PG_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version integer PRIMARY KEY, name text NOT NULL, applied_ms bigint NOT NULL)"
        )
        cur = await conn.execute("SELECT version FROM schema_migrations")
        applied = {int(r[0]) for r in await cur.fetchall()}  # type: ignore[index]
        if applied and max(applied) > PG_VERSION:
            raise StoreError(
                f"the database schema {max(applied)} is newer than this controller ({PG_VERSION}): "
                "run the controller version that wrote it (upgrade this replica)"
            )
        for version, name, ddl in PG_MIGRATIONS:
            if version in applied:
                continue
            for statement in ddl.split(";"):
                if statement.strip():
                    await conn.execute(statement.encode())
            await conn.execute(
                "INSERT INTO schema_migrations VALUES (%s, %s, %s)", (version, name, int(time.time() * 1000))
            )
            done.append(f"{version}: {name}")
    return done


async def apply(location: str | Path) -> list[str]:
    """Migrate the store at ``location`` (a postgresql:// URL, or a SQLite file) by hand; what
    was applied, one line each (empty: it was up to date). StoreError if it cannot be reached."""
    if is_postgres_url(str(location)):
        import psycopg

        from tether.controller.store.pgconn import connect

        pg = await connect(str(location))
        try:
            return await migrate_postgres(pg)
        except psycopg.Error as exc:
            raise StoreError(f"cannot migrate the store's schema: {' '.join(str(exc).split())}") from None
        finally:
            await pg.close()
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return migrate_sqlite(conn)
    finally:
        conn.close()


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))
