"""The controller identity kept in the store, sealed with the key-encryption key.

One kv record, ``identity/root``: the CA key and certificate and the secret box key, as JSON,
sealed (AES-256-GCM, the kv key as associated data) with the key of ``--store-key-file``. The first
replica creates it; replicas that start together on an empty store each make a candidate and
``kv_put_if_absent`` keeps the first, which every one of them then uses: one CA. A key file that
does not open the stored record stops the start with one line naming the file, before anything is
written.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cryptography.exceptions import InvalidTag

from tether.controller.ca import CertificateAuthority
from tether.controller.errors import InvalidArgument, StoreError
from tether.controller.identity.admins import StoreAdmins
from tether.controller.identity.keyfile import KeyFileError, StoreKey, create_key_file, read_key_file
from tether.controller.identity.model import Identity
from tether.controller.secretbox import SecretBox
from tether.controller.store.base import Store
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.identity")

ROOT_KEY = "identity/root"
FORMAT = 1
DAMAGED = "the controller identity in the store is damaged: restore the database from a backup"


class IdentityMissing(StoreError):
    """The store holds no controller identity (the admin CLI creates none)."""


async def load_stored_identity(
    store: Store, key_file: Path, *, create: bool = True, key: StoreKey | None = None
) -> Identity:
    """The identity in ``store``, opened with the key of ``key_file``; created (with the key file,
    when that is missing) on an empty store unless ``create`` is False. ``key``: that key as
    loaded (or created) already, before the store was opened with it; None: read here."""
    blob = store.kv_get(ROOT_KEY)
    if blob is not None:
        kek = SecretBox(key.key if key is not None else await asyncio.to_thread(_existing_key, key_file))
        ca, box = await _open_existing(kek, blob, key_file, key)
    elif not create:
        raise IdentityMissing(
            "the store holds no controller identity: start a controller on it once "
            "(tether-controller serve --store ... --store-key-file ...)"
        )
    else:
        kek, ca, box = await _create(store, key_file, key)
    return Identity(ca, box, StoreAdmins(store, kek), where=f"the store (key file {key_file})")


def _existing_key(key_file: Path) -> bytes:
    if not key_file.exists():
        raise KeyFileError(_missing(key_file))
    return read_key_file(key_file)


def _missing(key_file: Path) -> str:
    return (
        f"the store key file {key_file} does not exist, and the store already holds a "
        "controller identity: copy the key file of the first replica there"
    )


async def _open_existing(
    kek: SecretBox, blob: bytes, key_file: Path, key: StoreKey | None
) -> tuple[CertificateAuthority, SecretBox]:
    """The stored identity; a key file this start created (it was missing) that does not open it
    is removed again, and the start is refused as if it had stayed missing."""
    try:
        return _open_root(kek, blob, key_file)
    except KeyFileError:
        if key is None or not key.created:
            raise
        await asyncio.to_thread(key_file.unlink, missing_ok=True)
        raise KeyFileError(_missing(key_file)) from None


def _key_for_new_identity(key_file: Path) -> tuple[bytes, bool]:
    """The key to seal a new identity with, and whether this call created its file."""
    made = None if key_file.exists() else create_key_file(key_file)
    return (made, True) if made is not None else (read_key_file(key_file), False)


async def _create(
    store: Store, key_file: Path, key: StoreKey | None
) -> tuple[SecretBox, CertificateAuthority, SecretBox]:
    """Make a candidate identity and offer it; the one the store keeps wins (ours or another's)."""
    if key is not None:
        raw, made = key.key, key.created
    else:
        raw, made = await asyncio.to_thread(_key_for_new_identity, key_file)
    kek = SecretBox(raw)
    candidate = _seal_root(kek, CertificateAuthority.create(), SecretBox.new_key())
    kept = await store.kv_put_if_absent(ROOT_KEY, candidate)
    try:
        ca, box = _open_root(kek, kept, key_file)
    except KeyFileError:
        if made:  # another replica won with its own new key: ours is of no use
            await asyncio.to_thread(key_file.unlink, missing_ok=True)
        raise
    if kept == candidate:
        log.info("controller identity created in the store", ca_hash=ca.ca_hash, key_file=str(key_file))
    return kek, ca, box


def _seal_root(kek: SecretBox, ca: CertificateAuthority, box_key: bytes) -> bytes:
    doc = {
        "format": FORMAT,
        "ca_key": ca.private_key_pem().decode(),
        "ca_cert": ca.cert_pem.decode(),
        "box_key": box_key.hex(),
    }
    return kek.seal(json.dumps(doc).encode(), ROOT_KEY)


def _open_root(kek: SecretBox, blob: bytes, key_file: Path) -> tuple[CertificateAuthority, SecretBox]:
    try:
        doc = json.loads(kek.open(blob, ROOT_KEY))
    except InvalidTag:
        raise KeyFileError(
            f"the store key file {key_file} does not decrypt the controller identity in the store: "
            "give this replica a copy of the key file the first replica created"
        ) from None
    except ValueError:
        raise StoreError(DAMAGED) from None
    if not isinstance(doc, dict):
        raise StoreError(DAMAGED)
    if doc.get("format") != FORMAT:
        raise StoreError(
            f"the controller identity in the store has format {doc.get('format')!r}, not {FORMAT}: "
            "run the controller version that wrote it"
        )
    try:
        ca = CertificateAuthority.from_pem(doc["ca_key"].encode(), doc["ca_cert"].encode())
        return ca, SecretBox(bytes.fromhex(doc["box_key"]))
    except (KeyError, TypeError, ValueError, InvalidArgument):
        raise StoreError(DAMAGED) from None
