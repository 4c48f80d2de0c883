"""The agent's durable state: one SQLite file (WAL, fsync on commit) under the state dir.

It holds the journal (what ran, keyed by step digest), the outbox (events not
yet acknowledged) and a few counters. Journal and outbox changes that belong
together commit in one transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS journal (
    digest TEXT PRIMARY KEY, step TEXT NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    exit_code INTEGER NOT NULL, updated_ms INTEGER NOT NULL, boot_id TEXT NOT NULL DEFAULT '',
    plan_digest TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
"""


class StateDB:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self._depth = 0
        self._durable = True  # of the open transaction (meaningful while _depth > 0)
        if readonly:  # for `tether-agent status`: look, never create or change anything
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(SCHEMA)
        # The WAL holds plan scripts, step environments and output: as private as the database.
        for suffix in ("", "-wal", "-shm"):
            p = path.with_name(path.name + suffix)
            if p.exists():
                p.chmod(0o600)
        self._depth = 0

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One durable commit for everything inside (nested uses join the outer one).

        ``durable=False`` commits without waiting for the disk: for changes that may be lost
        with the power but never reordered (the WAL is written in order, so the next durable
        commit makes this one durable too), such as dropping events the controller has
        acknowledged. A nested transaction cannot ask for more durability than the outer one.
        """
        if self._depth:
            if durable and not self._durable:
                raise RuntimeError("a durable transaction cannot nest inside a non-durable one")
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1
            return
        if not durable:
            self.conn.execute("PRAGMA synchronous=NORMAL")  # cannot change inside a transaction
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            self._depth, self._durable = 1, durable
            try:
                yield self.conn
            except BaseException:
                self._depth = 0
                self.conn.execute("ROLLBACK")
                raise
            self._depth = 0
            self.conn.execute("COMMIT")
        finally:
            if not durable:
                self.conn.execute("PRAGMA synchronous=FULL")

    def get_meta(self, key: str, default: str = "") -> str:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(row[0]) if row else default

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))

    def close(self) -> None:
        self.conn.close()
