"""A schema-1 SQLite database is migrated in place (what every store keeps of an environment's
generations is in tests/store_contract.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tether.controller.main import main
from tether.controller.store import SqliteStore, migrations

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


def test_an_old_file_is_migrated_by_hand_and_says_what_it_applied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tether.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA_1)
    assert main(["migrate", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out[:-1]] == ["applied 2", "applied 3", "applied 4", "applied 5"]
    assert asyncio.run(migrations.apply(path)) == []
    with sqlite3.connect(path) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        columns = {r[1] for r in conn.execute("PRAGMA table_info(nodes)")}
    assert versions == [1, 2, 3, 4, 5] and {"hardware", "agent_rolled_back_from"} <= columns
    assert main(["migrate", "--data-dir", str(tmp_path / "elsewhere")]) == 1
