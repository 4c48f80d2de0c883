"""An idle controller on its SQLite file writes nothing: the replica registry's reports and the
leader's work are for replicas sharing a database, not for the one process on a file."""

from __future__ import annotations

import sqlite3
import time

import pytest

from tests.integration.harness import Controller

pytestmark = pytest.mark.integration


def _data_version(conn: sqlite3.Connection) -> int:
    """Changes when another connection commits to the file (SQLite's PRAGMA data_version)."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def test_an_idle_sqlite_controller_commits_nothing(controller: Controller) -> None:
    conn = sqlite3.connect(f"file:{controller.data_dir / 'tether.db'}?mode=ro", uri=True)
    try:
        time.sleep(1.0)  # start-up's own writes are done
        before = _data_version(conn)
        time.sleep(6.0)  # three of the registry's 2 s report intervals
        assert _data_version(conn) == before, "the idle controller committed to its store"
        assert controller.ctl("controller", "list").returncode == 0  # and still lists itself
    finally:
        conn.close()
