"""The agent's durable state: one SQLite file (WAL) under the state dir.

It holds the journal (what ran, keyed by step digest), the outbox (events not
yet acknowledged) and a few counters. Journal and outbox changes that belong
together commit in one transaction.

Every commit survives the agent's own crash (``kill -9``): the WAL is written before
COMMIT returns. Surviving the power is separate: a durable commit waits for the disk
(fsync); a non-durable one leaves that to the next durable commit or to ``sync()``, which
the session calls before any event leaves the node, so nothing the controller has seen
can be taken back by a power cut (a sequence number is never reused for another event).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tether.nodeagent.errors import StateError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS journal (
    digest TEXT PRIMARY KEY, step TEXT NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL,
    exit_code INTEGER NOT NULL, updated_ms INTEGER NOT NULL, boot_id TEXT NOT NULL DEFAULT '',
    plan_digest TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, body TEXT NOT NULL);
"""


DB_NAME = "state.db"  # in the state directory

# SQLite's result codes for a file that is not (or no longer) a sound database.
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def is_corrupt(exc: BaseException) -> bool:
    """Whether ``exc`` says the database file is damaged (not merely busy, full or unreadable)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code in _CORRUPT_CODES or "malformed" in str(exc) or "not a database" in str(exc)


def corrupt_message(path: Path, detail: str) -> str:
    """The one line an operator gets for a damaged state database: which file, what to do."""
    return (
        f"state database {path} is corrupt ({detail}): move it aside to start over; "
        "the node must then be revoked and enrolled again"
    )


def state_error(path: Path, exc: sqlite3.Error) -> StateError:
    """``exc``, met on the database at ``path``, as one line naming the file."""
    detail = " ".join(str(exc).split())
    if is_corrupt(exc):
        return StateError(corrupt_message(path, detail))
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return StateError(f"no space left on device: {path.parent}")
    return StateError(f"cannot use state database {path}: {detail}")


class StateDB:
    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self._depth = 0
        self._durable = True  # of the open transaction (meaningful while _depth > 0)
        self._commits = 0  # commits made by this process
        self._synced = 0  # commits known to be on disk
        try:
            self._open(readonly)
        except sqlite3.Error as exc:
            if getattr(self, "conn", None) is not None:
                self.conn.close()
            raise state_error(path, exc) from exc

    def _open(self, readonly: bool) -> None:
        path = self.path
        if readonly:  # for `tether-agent status`: look, never create or change anything
            self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            self._check()
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self._check()
        self.conn.executescript(SCHEMA)
        # The WAL holds plan scripts, step environments and output: as private as the database.
        for suffix in ("", "-wal", "-shm"):
            p = path.with_name(path.name + suffix)
            if p.exists():
                p.chmod(0o600)

    def _check(self) -> None:
        """Read every page once (``quick_check``): damage shows now, as one line, not mid-plan."""
        problems = [str(r[0]) for r in self.conn.execute("PRAGMA quick_check(1)").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError(f"malformed: {problems[0] if problems else 'no answer'}")

    @property
    def dirty(self) -> bool:
        """Whether some commit may still be lost with the power."""
        return self._synced < self._commits

    async def sync(self) -> None:
        """Make every commit so far durable, without blocking the event loop."""
        target = self._commits
        if self._synced >= target:
            return
        await asyncio.to_thread(self._fsync_wal)
        self._synced = max(self._synced, target)

    def _fsync_wal(self) -> None:
        # Commits live in the WAL until a checkpoint, which syncs what it moves into the main
        # file itself; fsync flushes the WAL whichever descriptor wrote it.
        try:
            fd = os.open(self.path.with_name(self.path.name + "-wal"), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def transaction(self, *, durable: bool | None = None) -> Iterator[sqlite3.Connection]:
        """One commit for everything inside; nested uses join the outer one.

        Durable unless ``durable=False``, which commits without waiting for the disk: for
        changes that may be lost with the power but never reordered (the WAL is written in
        order, so the next durable commit or ``sync()`` makes this one durable too). A nested
        transaction that passes ``durable=True`` cannot join a non-durable one.
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
        durable = durable is not False
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
            self._commits += 1
            if durable:
                self._synced = self._commits
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
