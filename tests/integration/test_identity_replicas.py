"""Two controller replicas on one PostgreSQL database share one identity (--store-key-file):
one CA when both start at once on an empty database, an admin.conf of either works against both,
a revocation made by ``tether-controller admin revoke --store`` is refused by both within a second,
another key file stops a start with one line, and a dump of the database holds no secret."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from tests.integration.conftest import apply_env, ca_hash, token
from tests.integration.harness import BIN, Controller
from tests.pgscratch import ScratchCluster
from tether.controller import admins
from tether.controller.adminconf import AdminConfig
from tether.controller.config import ControllerConfig
from tether.controller.identity import load_identity, load_store_key, load_stored_identity
from tether.controller.identity.keyfile import create_key_file, load_or_create_key, read_key_file
from tether.controller.identity.stored import ROOT_KEY
from tether.controller.secretbox import SecretBox
from tether.controller.store import open_store


@pytest.fixture
def replicas(tmp_path: Path, pg_database: str) -> Iterator[tuple[Controller, Controller]]:
    key = tmp_path / "keys" / "store.key"
    made = [
        Controller(tmp_path / name, extra_args=("--store", pg_database, "--store-key-file", str(key)))
        for name in ("r1", "r2")
    ]
    for c in made:
        c.data_dir.parent.mkdir(parents=True)
    starts = [threading.Thread(target=c.start) for c in made]  # at once, on an empty database
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    try:
        assert all(c.address for c in made), "a replica did not start"
        yield made[0], made[1]
    finally:
        for c in made:
            c.kill()


def _as(conf_of: Controller, against: Controller, tmp_path: Path) -> Path:
    """``conf_of``'s admin.conf, pointed at ``against``."""
    path = tmp_path / f"{conf_of.data_dir.parent.name}-at-{against.data_dir.parent.name}.conf"
    replace(AdminConfig.read(conf_of.config), controller=against.address).write(path)
    return path


def _ctl(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(conf)}
    return subprocess.run(
        [str(BIN / "tetherctl"), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def _tc(*args: str) -> subprocess.CompletedProcess[str]:
    """``tether-controller ARGS``."""
    return subprocess.run(
        [str(BIN / "tether-controller"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def _fingerprint(conf: Path) -> str:
    cert = x509.load_pem_x509_certificate(AdminConfig.read(conf).cert_pem)
    return cert.fingerprint(hashes.SHA256()).hex()


def test_one_ca_and_admin_confs_work_against_every_replica(
    replicas: tuple[Controller, Controller], tmp_path: Path
) -> None:
    r1, r2 = replicas
    assert ca_hash(r1) == ca_hash(r2)
    assert not (r1.data_dir / "pki").exists() and not (r2.data_dir / "pki").exists()
    for conf_of, against in ((r1, r2), (r2, r1), (r1, r1)):
        out = _ctl(_as(conf_of, against, tmp_path), "env", "list")
        assert out.returncode == 0, out.stderr


def test_a_revocation_by_the_cli_is_refused_by_every_replica_within_a_second(
    replicas: tuple[Controller, Controller], tmp_path: Path, pg_database: str
) -> None:
    r1, r2 = replicas
    key = tmp_path / "keys" / "store.key"
    confs = [_as(r1, r, tmp_path) for r in (r1, r2)]
    assert all(_ctl(c, "env", "list").returncode == 0 for c in confs)  # cached as good on both
    store = ("--store", pg_database, "--store-key-file", str(key))
    revoke = _tc("admin", "revoke", *store, "--fingerprint", _fingerprint(r1.config))
    assert revoke.returncode == 0, revoke.stderr
    # Both replicas read their registry less than a second ago: the very next call on each is
    # refused because the store told them (LISTEN/NOTIFY), not because a second went by.
    for conf in confs:
        out = _ctl(conf, "env", "list")
        assert out.returncode != 0 and "revoked" in out.stderr, out.stderr
    assert _ctl(_as(r2, r1, tmp_path), "env", "list").returncode == 0  # r2's own certificate still works
    listed = _tc("admin", "list", *store).stdout
    assert len([line for line in listed.splitlines()[1:] if line.strip()]) == 2  # one per replica


def test_an_admin_whose_record_is_deleted_in_the_database_is_refused(
    replicas: tuple[Controller, Controller], tmp_path: Path, pg_database: str
) -> None:
    """A database writer cannot undo a revocation by deleting the admin's record: the CA was made
    in the store with the registry, so a certificate without a record is refused (as soon as a
    replica reads the database again: here, once its listening connection is cut)."""
    import psycopg

    r1, r2 = replicas
    confs = [_as(r1, r, tmp_path) for r in (r1, r2)]
    assert all(_ctl(c, "env", "list").returncode == 0 for c in confs)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        gone = conn.execute("DELETE FROM kv WHERE key = %s", ("identity/admins/" + _fingerprint(r1.config),))
        assert gone.rowcount == 1
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN tether'")
    for conf in confs:
        deadline = time.monotonic() + 3
        while (out := _ctl(conf, "env", "list")).returncode == 0:
            assert time.monotonic() < deadline, "still accepted"
            time.sleep(0.1)
        assert "not in the controller's admin registry" in out.stderr, out.stderr
    assert _ctl(_as(r2, r1, tmp_path), "env", "list").returncode == 0  # r2's own certificate still works


def test_another_key_file_stops_the_start_with_one_line(
    replicas: tuple[Controller, Controller], tmp_path: Path, pg_database: str
) -> None:
    other = tmp_path / "other.key"
    assert create_key_file(other) is not None
    before = _kv_dump(pg_database)
    serve = ("serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "r3"))
    out = _tc(*serve, "--store", pg_database, "--store-key-file", str(other))
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.startswith("tether-controller:")]
    assert len(lines) == 1 and str(other) in lines[0] and "does not decrypt" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert _kv_dump(pg_database) == before  # nothing written
    assert not (tmp_path / "r3").exists()


def _kv_dump(url: str) -> dict[str, bytes]:
    import psycopg

    with psycopg.connect(url) as conn:
        return {k: bytes(v) for k, v in conn.execute("SELECT key, value FROM kv WHERE key LIKE 'identity/%'")}


def test_pg_dump_holds_no_secret(
    replicas: tuple[Controller, Controller], tmp_path: Path, pg_database: str, pg_cluster: ScratchCluster
) -> None:
    r1, _ = replicas
    key_file = tmp_path / "keys" / "store.key"
    apply_env(r1, tmp_path, "canary", "    - name: noop\n      inline: 'true'\n")
    join_token = token(r1, "canary")
    secret_part = join_token.split(".")[1]
    canary = b"canary-join-material-" + os.urandom(8).hex().encode()
    box_key, ca_key = asyncio.run(_plant(pg_database, key_file, canary))
    dump = subprocess.run(
        [str(pg_cluster.bin / "pg_dump"), "--dbname", pg_database, "--no-owner"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "identity/root" in dump and "cluster/canary/material" in dump  # the dump has the rows
    assert "PRIVATE KEY" not in dump and ca_key[:40] not in dump
    assert secret_part not in dump and join_token not in dump
    assert canary.decode() not in dump and canary.hex() not in dump
    for secret in (box_key, read_key_file(key_file)):
        assert secret.hex() not in dump and base64.b64encode(secret).decode() not in dump


async def _plant(url: str, key_file: Path, canary: bytes) -> tuple[bytes, str]:
    """Seal a canary as join material (as the orchestrator does); the box key and the CA key body."""
    store = await open_store(url, notify_key=read_key_file(key_file))
    try:
        identity = await load_stored_identity(store, key_file, create=False)
        kv_key = "cluster/canary/material"
        await store.kv_put(kv_key, identity.box.seal(canary, kv_key))
        doc = json.loads(SecretBox(read_key_file(key_file)).open(store.kv_get(ROOT_KEY) or b"", ROOT_KEY))
        return bytes.fromhex(doc["box_key"]), "".join(doc["ca_key"].splitlines()[1:-1])
    finally:
        await store.close()


async def test_concurrent_first_starts_on_postgresql_end_with_one_ca(
    pg_database: str, tmp_path: Path
) -> None:
    path = tmp_path / "store.key"  # each start loads (the first one: creates) it before its store opens
    keys = await asyncio.gather(*(asyncio.to_thread(load_or_create_key, path) for _ in range(4)))
    stores = [await open_store(pg_database, notify_key=k.key) for k in keys]
    try:
        loads = (load_stored_identity(s, path, key=k) for s, k in zip(stores, keys, strict=True))
        found = await asyncio.gather(*loads)
        assert len({i.ca.ca_hash for i in found}) == 1
        sealed = found[0].box.seal(b"x", "k")
        assert all(i.box.open(sealed, "k") == b"x" for i in found)
    finally:
        for s in stores:
            await s.close()


async def test_a_revocation_notice_reaches_another_replica_without_polling(
    pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admins, "RELOAD_SECONDS", 3600.0)  # only the store's notice can tell it
    key_file = tmp_path / "store.key"
    config = ControllerConfig(tmp_path / "d", store=pg_database, store_key_file=key_file)
    key = await load_store_key(config)
    assert key is not None
    first = await open_store(pg_database, notify_key=key.key)
    second = await open_store(pg_database, notify_key=key.key)
    try:
        watching = await load_identity(config, first, key)
        writer = await load_identity(config, second, key)
        _, bob = writer.ca.issue_admin("bob", "admin")
        await writer.admins.record("bob", "admin", bob)
        await _until(lambda: watching.admins.scope_of(bob.fingerprint) is not None)
        assert not watching.admins.is_revoked(bob.fingerprint)
        await writer.admins.revoke(name="bob")
        await _until(lambda: watching.admins.is_revoked(bob.fingerprint))
    finally:
        await first.close()
        await second.close()


async def _until(check: Callable[[], bool], within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not seen within a second"
        await asyncio.sleep(0.02)
