"""The key-encryption key file (--store-key-file) and what the stored identity does with it."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.controller.identity import KeyFileError, load_stored_identity
from tether.controller.identity.keyfile import create_key_file, read_key_file
from tether.controller.identity.stored import ROOT_KEY
from tether.controller.store import SqliteStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "db" / "tether.db")
    yield s
    await s.close()


def _kv(store: SqliteStore) -> dict[str, bytes]:
    return {k: v for k in store.kv_keys("") if (v := store.kv_get(k)) is not None}


async def test_first_start_creates_the_key_file_0600(store: SqliteStore, tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "store.key"
    identity = await load_stored_identity(store, key_file)
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = read_key_file(key_file)
    assert len(key) == 32 and base64.b64decode(key_file.read_bytes().strip()) == key
    assert store.kv_get(ROOT_KEY) is not None
    again = await load_stored_identity(store, key_file)  # the file is read, not replaced
    assert read_key_file(key_file) == key and again.ca.ca_hash == identity.ca.ca_hash


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
async def test_a_key_file_others_may_read_is_refused(store: SqliteStore, tmp_path: Path, mode: int) -> None:
    key_file = tmp_path / "store.key"
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(mode)
    with pytest.raises(KeyFileError) as err:
        await load_stored_identity(store, key_file)
    message = str(err.value)
    assert str(key_file) in message and f"{mode:o}" in message and "chmod 600" in message
    assert "\n" not in message
    assert _kv(store) == {}  # nothing written


async def test_another_key_is_refused_with_one_line_naming_the_file(
    store: SqliteStore, tmp_path: Path
) -> None:
    await load_stored_identity(store, tmp_path / "first.key")
    before = _kv(store)
    other = tmp_path / "other.key"
    assert create_key_file(other) is not None
    with pytest.raises(KeyFileError) as err:
        await load_stored_identity(store, other)
    message = str(err.value)
    assert str(other) in message and "does not decrypt" in message and "\n" not in message
    assert base64.b64encode(read_key_file(other)).decode() not in message
    assert _kv(store) == before  # nothing written


async def test_a_missing_key_file_is_not_made_up_when_the_store_has_an_identity(
    store: SqliteStore, tmp_path: Path
) -> None:
    await load_stored_identity(store, tmp_path / "first.key")
    missing = tmp_path / "copy" / "store.key"
    with pytest.raises(KeyFileError, match="copy the key file of the first replica"):
        await load_stored_identity(store, missing)
    assert not missing.exists()


async def test_raw_key_accepted_and_garbage_refused(store: SqliteStore, tmp_path: Path) -> None:
    raw = tmp_path / "raw.key"
    raw.write_bytes(os.urandom(32))
    raw.chmod(0o600)
    assert read_key_file(raw) == raw.read_bytes()
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="holds no key"):
        await load_stored_identity(store, bad)
    assert _kv(store) == {}


def test_key_file_created_once_by_concurrent_starters(tmp_path: Path) -> None:
    path = tmp_path / "store.key"
    made: list[bytes | None] = []
    threads = [threading.Thread(target=lambda: made.append(create_key_file(path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [k for k in made if k is not None]
    assert len(winners) == 1 and read_key_file(path) == winners[0]
    assert [p.name for p in tmp_path.iterdir()] == ["store.key"]  # no temporary file left


async def test_loser_of_a_race_with_another_new_key_removes_its_key_file(
    store: SqliteStore, tmp_path: Path
) -> None:
    """Two first replicas, each with a key file of its own: one wins; the other stops, and does not
    leave behind a key file that opens nothing."""
    a, b = tmp_path / "a.key", tmp_path / "b.key"
    results = await asyncio.gather(
        load_stored_identity(store, a), load_stored_identity(store, b), return_exceptions=True
    )
    won = [f for f, r in zip((a, b), results, strict=True) if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, BaseException)]
    assert len(won) == 1 and len(lost) == 1 and isinstance(lost[0], KeyFileError)
    assert [p.name for p in tmp_path.glob("*.key")] == [won[0].name]
