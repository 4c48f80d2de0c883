"""The store keeps every applied generation of an environment (undo, nodes held back by a
rollout) and an agent version; a schema-1 database is migrated in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tether.controller.store import SqliteStore
from tether.controller.store.sqlite import KEEP_REVISIONS

SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (
    name TEXT PRIMARY KEY, document TEXT NOT NULL, api_version TEXT NOT NULL, spec TEXT NOT NULL,
    generation INTEGER NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
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
    plan_digest TEXT NOT NULL DEFAULT '', stored_seq INTEGER NOT NULL DEFAULT 0);
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
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO environments VALUES ('gpu', 'doc-v3', 'tether.dev/v1alpha1', '{}', 3, 1, 2);
"""


async def test_every_generation_is_kept_and_the_agent_version_makes_one(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    try:
        a, _ = await store.put_environment("gpu", "doc-a", "v", {"x": 1})
        b, _ = await store.put_environment("gpu", "doc-b", "v", {"x": 2})
        same, changed = await store.put_environment("gpu", "doc-b", "v", {"x": 2})
        assert not changed and same.generation == b.generation
        up, changed = await store.put_environment("gpu", "doc-b", "v", {"x": 2}, agent_version="0.2.0")
        assert changed and up.generation == b.generation + 1 and up.agent_version == "0.2.0"
        kept, _ = await store.put_environment("gpu", "doc-c", "v", {"x": 3})
        assert kept.agent_version == "0.2.0"  # None keeps it
        old = store.get_revision("gpu", a.generation)
        assert old is not None and old.document == "doc-a" and old.spec == {"x": 1}
        assert store.get_revision("gpu", 99) is None
        assert await store.delete_environment("gpu")
        assert store.get_revision("gpu", a.generation) is None
    finally:
        await store.close()


async def test_old_revisions_are_pruned_past_the_ones_kept(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    try:
        for i in range(KEEP_REVISIONS + 5):
            await store.put_environment("gpu", f"doc-{i}", "v", {"i": i})
        assert store.get_revision("gpu", 1) is None
        assert store.get_revision("gpu", 6) is not None and store.get_revision("gpu", KEEP_REVISIONS + 5)
    finally:
        await store.close()


async def test_a_schema_1_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_1)
    store = SqliteStore(path)
    try:
        env = store.get_environment("gpu")
        assert env is not None and env.generation == 3 and env.agent_version == ""
        rev = store.get_revision("gpu", 3)
        assert rev is not None and rev.document == "doc-v3"
        nxt, changed = await store.put_environment("gpu", "doc-v4", "v", {})
        assert changed and nxt.generation == 4
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) >= 2
