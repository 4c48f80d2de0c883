"""The store contract on SQLite (tests/store_contract.py; the same tests run on PostgreSQL in
tests/integration/test_store_postgres.py), and what only the SQLite store does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.store_contract import *  # noqa: F403 (the contract's tests and fixtures)
from tests.store_contract import enroll, ev, node, token
from tether.controller.store import SqliteStore, Store, migrations

__all__ = ["enroll", "ev", "node", "token"]  # (other tests build records with these)


@pytest.fixture
def store_location(tmp_path: Path) -> Path:
    return tmp_path / "t.db"


async def test_concurrent_writers_are_group_committed(tmp_path: Path) -> None:
    commits: list[int] = []
    store = SqliteStore(tmp_path / "t.db", observe_commit=lambda _s, n: commits.append(n))
    try:
        for i in range(20):
            await enroll(store, f"n{i}")
        commits.clear()
        results = await asyncio.gather(*[store.append_events(f"n{i}", [ev(1), ev(2)]) for i in range(20)])
        assert results == [2] * 20 and sum(commits) == 20 and len(commits) < 20
    finally:
        await store.close()


def test_database_files_are_private(tmp_path: Path) -> None:
    async def go() -> None:
        s = SqliteStore(tmp_path / "t.db")
        await s.close()

    asyncio.run(go())
    assert (tmp_path / "t.db").stat().st_mode & 0o077 == 0


async def test_a_new_file_records_its_migrations_and_the_cli_finds_nothing_to_do(tmp_path: Path) -> None:
    applied = await migrations.apply(tmp_path / "t.db")
    assert applied == [f"1..{migrations.SQLITE_VERSION}: the schema (new database)"]
    assert await migrations.apply(tmp_path / "t.db") == []
    store: Store = SqliteStore(tmp_path / "t.db")
    await store.close()
