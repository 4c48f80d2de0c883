"""``tether-controller admin issue|list|revoke --store-key-file F``: the registry kept in a store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tether.controller.adminconf import AdminConfig
from tether.controller.identity import Identity, load_stored_identity
from tether.controller.main import main
from tether.controller.replicas.registry import PREFIX, Replica
from tether.controller.store import SqliteStore
from tether.nodeagent.model import now_ms


def _identity(data_dir: Path, key_file: Path, replica: str = "") -> Identity:
    """What a controller started with --store-key-file leaves in DATA_DIR/tether.db."""

    async def go() -> Identity:
        store = SqliteStore(data_dir / "tether.db")
        try:
            identity = await load_stored_identity(store, key_file)
            if replica:
                now = now_ms()
                await store.kv_put(PREFIX + "r1", Replica("r1", replica, "1", now, now).to_bytes())
            return identity
        finally:
            await store.close()

    return asyncio.run(go())


def _revoked(data_dir: Path, key_file: Path, fingerprint: str) -> bool:
    async def go() -> bool:
        store = SqliteStore(data_dir / "tether.db")
        try:
            return (await load_stored_identity(store, key_file)).admins.is_revoked(fingerprint)
        finally:
            await store.close()

    return asyncio.run(go())


def _admin(data_dir: Path, key_file: Path, *args: str) -> int:
    where = ["--data-dir", str(data_dir), "--store-key-file", str(key_file)]
    return main(["admin", args[0], *where, *args[1:]])


def test_issue_list_revoke_against_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, key = tmp_path / "data", tmp_path / "store.key"
    identity = _identity(data, key)
    out = tmp_path / "bob.conf"
    issue = ["--name", "bob", "--role", "admin", "--out", str(out), "--controller", "lb.example:7443"]
    assert _admin(data, key, "issue", *issue) == 0
    conf = AdminConfig.read(out)
    assert conf.controller == "lb.example:7443" and conf.ca_hash == identity.ca.ca_hash
    assert identity.ca.verify_issued(x509.load_pem_x509_certificate(conf.cert_pem))
    assert not (data / "pki").exists()  # the registry is in the store, not in files
    capsys.readouterr()
    assert _admin(data, key, "list") == 0
    listed = capsys.readouterr().out
    assert "bob" in listed and "admin" in listed
    assert _admin(data, key, "revoke", "--name", "bob") == 0
    assert "revoked" in capsys.readouterr().out
    fingerprint = x509.load_pem_x509_certificate(conf.cert_pem).fingerprint(hashes.SHA256()).hex()
    assert _revoked(data, key, fingerprint)  # as a replica reads it


def test_issue_names_a_live_replica_by_default(tmp_path: Path) -> None:
    data, key = tmp_path / "data", tmp_path / "store.key"
    _identity(data, key, replica="10.1.2.3:7443")
    out = tmp_path / "a.conf"
    assert _admin(data, key, "issue", "--name", "a", "--out", str(out)) == 0
    assert AdminConfig.read(out).controller == "10.1.2.3:7443"


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, key = tmp_path / "data", tmp_path / "store.key"
    assert _admin(data, key, "list") == 1  # no store yet: nothing is created
    assert not data.exists() and not key.exists()
    _identity(data, key)
    other = tmp_path / "other.key"
    _identity(tmp_path / "elsewhere", other)
    capsys.readouterr()
    assert _admin(data, other, "revoke", "--name", "x") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(other) in err and "does not decrypt" in err
    assert main(["admin", "list", "--data-dir", str(data), "--store", str(data / "tether.db")]) == 1
    assert "--store-key-file" in capsys.readouterr().err
    assert _admin(data, key, "issue", "--name", "a", "--out", str(tmp_path / "a.conf")) == 1
    assert "--controller" in capsys.readouterr().err  # no address known
