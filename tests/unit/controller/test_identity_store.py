"""The controller identity kept in the store (--store-key-file), on SqliteStore (same kv contract
as PostgreSQL; tests/integration/test_identity_replicas.py runs the replica cases there)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tests.unit.controller.test_ca_auth import Ctx
from tether.controller import admins
from tether.controller.adminconf import AdminConfig
from tether.controller.auth import Authenticator
from tether.controller.config import ControllerConfig
from tether.controller.errors import Unauthenticated
from tether.controller.identity import (
    FileAdmins,
    KeyFileError,
    StoreAdmins,
    ensure_admin_conf,
    load_identity,
    load_store_key,
    load_stored_identity,
)
from tether.controller.identity.admins import PREFIX
from tether.controller.identity.keyfile import read_key_file
from tether.controller.identity.stored import ROOT_KEY, IdentityMissing
from tether.controller.secretbox import SecretBox
from tether.controller.store import SqliteStore
from tether.controller.store.records import StoreChange
from tether.controller.tokens import TokenRecord, generate, hash_secret


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "tether.db")
    yield s
    await s.close()


async def test_round_trip_same_ca_and_box_from_another_store_handle(
    store: SqliteStore, tmp_path: Path
) -> None:
    key_file = tmp_path / "store.key"
    first = await load_stored_identity(store, key_file)
    other = SqliteStore(tmp_path / "tether.db")  # another replica on the same database
    try:
        again = await load_stored_identity(other, key_file)
    finally:
        await other.close()
    assert again.ca.cert_pem == first.ca.cert_pem and again.ca.ca_hash == first.ca.ca_hash
    assert again.box.open(first.box.seal(b"join material", "k"), "k") == b"join material"
    issued = again.ca.sign_node_csr(_csr(), "node-1", days=1)
    assert first.ca.verify_issued(x509.load_pem_x509_certificate(issued.cert_pem))
    assert not list(tmp_path.glob("pki"))  # no identity files


async def test_concurrent_first_starts_end_with_one_ca(store: SqliteStore, tmp_path: Path) -> None:
    key_file = tmp_path / "store.key"
    others = [SqliteStore(tmp_path / "tether.db") for _ in range(3)]
    try:
        found = await asyncio.gather(
            *(load_stored_identity(s, key_file) for s in [store, store, *others, *others])
        )
    finally:
        for s in others:
            await s.close()
    assert len({i.ca.ca_hash for i in found}) == 1
    sealed = found[0].box.seal(b"x", "k")
    assert all(i.box.open(sealed, "k") == b"x" for i in found)
    assert store.kv_keys("identity/") == [ROOT_KEY]


async def test_admin_cli_creates_nothing(store: SqliteStore, tmp_path: Path) -> None:
    with pytest.raises(IdentityMissing, match="start a controller"):
        await load_stored_identity(store, tmp_path / "store.key", create=False)
    assert not (tmp_path / "store.key").exists() and store.kv_keys("") == []


async def test_registry_in_the_store_revocations_reach_another_replica(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "store.key"
    mine = await load_stored_identity(store, key_file)
    other_store = SqliteStore(tmp_path / "tether.db")
    try:
        theirs = await load_stored_identity(other_store, key_file)
        assert isinstance(theirs.admins, StoreAdmins)
        ca = mine.ca
        _, bob = ca.issue_admin("bob", "admin")
        _, eve = ca.issue_admin("eve", "read-only", environments=["lab"])
        await mine.admins.record("bob", "admin", bob)
        await mine.admins.record("eve", "read-only", eve, ["lab"])
        auth = Authenticator(ca, revoked=theirs.admins.is_revoked, scope=theirs.admins.scope_of)
        assert auth.principal(Ctx(bob.cert_pem)).name == "bob"
        assert theirs.admins.scope_of(eve.fingerprint) == frozenset({"lab"})
        revoked = await mine.admins.revoke(name="bob")
        assert [e.fingerprint for e in revoked] == [bob.fingerprint]
        theirs.admins.watch()
        theirs.admins._on_change(StoreChange("kv", PREFIX + bob.fingerprint))  # as PostgreSQL tells it
        with pytest.raises(Unauthenticated, match="revoked"):
            auth.principal(Ctx(bob.cert_pem))
        # without a notice (SQLite, another process): read again within RELOAD_SECONDS
        monkeypatch.setattr(admins, "RELOAD_SECONDS", 0.0)
        await mine.admins.revoke(fingerprint=eve.fingerprint[:12])
        assert theirs.admins.is_revoked(eve.fingerprint)
        assert sorted((e.name, bool(e.revoked_at)) for e in theirs.admins.entries()) == [
            ("bob", True),
            ("eve", True),
        ]
    finally:
        await other_store.close()


async def test_a_record_swapped_or_forged_counts_as_revoked(store: SqliteStore, tmp_path: Path) -> None:
    identity = await load_stored_identity(store, tmp_path / "store.key")
    _, bob = identity.ca.issue_admin("bob", "admin")
    _, eve = identity.ca.issue_admin("eve", "admin")
    await identity.admins.record("bob", "admin", bob)
    await identity.admins.record("eve", "admin", eve)
    bob_blob = store.kv_get(PREFIX + bob.fingerprint)
    assert bob_blob is not None
    await store.kv_put(PREFIX + eve.fingerprint, bob_blob)  # a database writer swaps records
    forged = json.dumps({"fingerprint": "ab" * 32, "name": "mallory", "role": "admin"}).encode()
    await store.kv_put(PREFIX + "ab" * 32, forged)
    fresh = StoreAdmins(store, SecretBox(read_key_file(tmp_path / "store.key")))
    assert fresh.is_revoked(eve.fingerprint) and fresh.is_revoked("ab" * 32)
    assert not fresh.is_revoked(bob.fingerprint)
    assert fresh.scope_of("ab" * 32) is None


async def test_default_sqlite_keeps_todays_files(store: SqliteStore, tmp_path: Path) -> None:
    config = ControllerConfig(data_dir=tmp_path / "data")
    identity = await load_identity(config, store)
    pki = tmp_path / "data" / "pki"
    assert {p.name for p in pki.iterdir()} == {"ca.key", "ca.crt", "secrets.key"}
    assert isinstance(identity.admins, FileAdmins) and store.kv_keys("") == []
    await ensure_admin_conf(identity, tmp_path / "data" / "admin.conf", "127.0.0.1:1")
    assert [e.role for e in admins.AdminRegistry(pki).entries()] == ["admin"]
    again = await load_identity(config, store)
    assert again.ca.ca_hash == identity.ca.ca_hash


async def test_identity_source_refusals(store: SqliteStore, tmp_path: Path) -> None:
    await load_identity(ControllerConfig(tmp_path / "d", store_key_file=tmp_path / "k"), store)
    with pytest.raises(KeyFileError, match="start with --store-key-file"):  # not a second CA from files
        await load_identity(ControllerConfig(tmp_path / "d"), store)
    assert not (tmp_path / "d" / "pki").exists()
    store.kind = "postgresql"
    with pytest.raises(KeyFileError, match="a postgresql store needs --store-key-file"):
        await load_identity(ControllerConfig(tmp_path / "d"), store)


async def test_the_key_is_loaded_before_the_store_opens_and_a_new_one_is_undone_on_a_sealed_store(
    store: SqliteStore, tmp_path: Path
) -> None:
    """A PostgreSQL store signs its notices with the key, so the server loads (or, the first
    replica, creates) it before opening the store; a key file made by a start that then finds an
    identity sealed with another key is removed again, and the start refused as before."""
    first = ControllerConfig(tmp_path / "d1", store_key_file=tmp_path / "k1" / "store.key")
    key = await load_store_key(first)
    assert key is not None and key.created and read_key_file(tmp_path / "k1" / "store.key") == key.key
    identity = await load_identity(first, store, key)
    again = await load_store_key(first)
    assert again is not None and not again.created and again.key == key.key
    assert (await load_identity(first, store, again)).ca.ca_hash == identity.ca.ca_hash
    second = ControllerConfig(tmp_path / "d2", store_key_file=tmp_path / "k2" / "store.key")
    made = await load_store_key(second)
    assert made is not None and made.created
    with pytest.raises(KeyFileError, match="does not exist, and the store already holds"):
        await load_identity(second, store, made)
    assert not (tmp_path / "k2" / "store.key").exists()
    with pytest.raises(KeyFileError, match="a postgresql store needs --store-key-file"):
        await load_store_key(ControllerConfig(tmp_path / "d3", store="postgresql://db/tether"))
    assert await load_store_key(ControllerConfig(tmp_path / "d3")) is None


async def test_admin_conf_of_any_replica_is_recorded_in_the_shared_registry(
    store: SqliteStore, tmp_path: Path
) -> None:
    config = ControllerConfig(tmp_path / "d", store_key_file=tmp_path / "store.key")
    identity = await load_identity(config, store)
    path = tmp_path / "d" / "admin.conf"
    await ensure_admin_conf(identity, path, "10.0.0.1:7443")
    conf = AdminConfig.read(path)
    assert conf.ca_pem == identity.ca.cert_pem and conf.controller == "10.0.0.1:7443"
    fp = x509.load_pem_x509_certificate(conf.cert_pem).fingerprint(hashes.SHA256())
    assert [e.fingerprint for e in identity.admins.entries()] == [fp.hex()]
    await ensure_admin_conf(identity, path, "10.0.0.1:8443")  # only the address changes
    again = AdminConfig.read(path)
    assert again.controller == "10.0.0.1:8443" and again.cert_pem == conf.cert_pem
    assert len(identity.admins.entries()) == 1


def _forms(secret: bytes) -> list[str]:
    """The ways a secret could show in a dump: raw, hex (SQLite's X'..'), base64."""
    return [
        secret.decode("latin-1"),
        secret.hex(),
        secret.hex().upper(),
        base64.b64encode(secret).decode(),
    ]


async def test_dump_of_the_database_holds_no_secret(store: SqliteStore, tmp_path: Path) -> None:
    """Canary: a SQLite dump (iterdump) and the raw files show no CA key, box key, key-encryption
    key, join material or token secret."""
    key_file = tmp_path / "keys" / "store.key"
    identity = await load_stored_identity(store, key_file)
    canary = b"canary-join-material-" + os.urandom(8).hex().encode()
    kv_key = "cluster/lab/material"
    await store.kv_put(kv_key, identity.box.seal(canary, kv_key))  # as the orchestrator does
    token_id, full = generate()
    secret_part = full.reveal().split(".")[1]
    await store.put_token(TokenRecord(token_id, hash_secret(secret_part), "lab", "", "", 0, 1, 0, False, 0))
    _, issued = identity.ca.issue_admin("bob", "admin")
    await identity.admins.record("bob", "admin", issued)
    root = SecretBox(read_key_file(key_file)).open(store.kv_get(ROOT_KEY) or b"", ROOT_KEY)
    doc = json.loads(root)
    box_key = bytes.fromhex(doc["box_key"])
    ca_key_body = "".join(doc["ca_key"].splitlines()[1:-1])
    await store.close()
    with sqlite3.connect(tmp_path / "tether.db") as conn:
        dump = "\n".join(conn.iterdump())
    files = "".join(p.read_bytes().decode("latin-1") for p in tmp_path.glob("tether.db*"))
    assert identity.box.open(identity.box.seal(canary, "x"), "x") == canary  # the canary is real
    for surface in (dump, files):
        assert "PRIVATE KEY" not in surface and ca_key_body[:40] not in surface
        assert canary.decode() not in surface and canary.hex() not in surface.lower()
        assert secret_part not in surface
        for secret in (box_key, read_key_file(key_file)):
            assert not any(form in surface for form in _forms(secret))
    assert "bob" not in dump  # admin records are sealed too
    assert doc["ca_cert"].splitlines()[1] not in dump


def test_reprs_hold_no_key(tmp_path: Path) -> None:
    async def go() -> str:
        s = SqliteStore(tmp_path / "tether.db")
        try:
            identity = await load_stored_identity(s, tmp_path / "store.key")
            return repr(identity) + repr(identity.admins) + repr(identity.box) + repr(identity.ca)
        finally:
            await s.close()

    text = asyncio.run(go())
    key = read_key_file(tmp_path / "store.key")
    assert not any(form in text for form in _forms(key)) and "PRIVATE" not in text
    assert "ca_hash=" in text


def _csr() -> bytes:
    from tether.nodeagent.identity import generate_key, make_csr

    return make_csr(generate_key(), "node-1")
