"""``load_identity``: where the controller's identity comes from, picked by the configuration.

With ``--store-key-file`` the identity lives in the store, sealed with that key (every replica of a
PostgreSQL store shares it); without one, in files under ``DATA_DIR/pki`` as always (SQLite only).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tether.controller.admins import AdminRegistry
from tether.controller.ca import CertificateAuthority
from tether.controller.config import ControllerConfig
from tether.controller.identity.admins import FileAdmins, StoreAdmins
from tether.controller.identity.keyfile import KeyFileError, StoreKey, load_or_create_key
from tether.controller.identity.model import Identity
from tether.controller.identity.stored import ROOT_KEY, load_stored_identity
from tether.controller.secretbox import SecretBox
from tether.controller.store.base import Store
from tether.controller.store.migrations import is_postgres_url


async def load_store_key(config: ControllerConfig) -> StoreKey | None:
    """The key of ``--store-key-file``, read (or created, the file missing: the first replica)
    once, before the store opens: a PostgreSQL store signs its notices with it. None without
    ``--store-key-file``; refused for a PostgreSQL ``--store``."""
    if config.store_key_file is None:
        if config.store and is_postgres_url(config.store):
            raise _key_file_needed("postgresql")
        return None
    return await asyncio.to_thread(load_or_create_key, config.store_key_file)


def _key_file_needed(kind: str) -> KeyFileError:
    return KeyFileError(
        f"a {kind} store needs --store-key-file PATH: the key that seals the controller "
        "identity in it (the first replica creates the file; give the others a copy)"
    )


async def load_identity(config: ControllerConfig, store: Store, key: StoreKey | None = None) -> Identity:
    """The identity a controller serves with; it follows changes other replicas make to its admin
    registry. Refuses a PostgreSQL store without a key file, and a store whose identity is sealed
    when no key file is given (it would otherwise start with a second CA from DATA_DIR/pki).
    ``key``: ``load_store_key``'s (None: the key file is read here)."""
    if config.store_key_file is not None:
        identity = await load_stored_identity(store, config.store_key_file, key=key)
        if isinstance(identity.admins, StoreAdmins):
            identity.admins.watch()
        return identity
    if store.kind != "sqlite":
        raise _key_file_needed(store.kind)
    if store.kv_get(ROOT_KEY) is not None:
        raise KeyFileError(
            "the store holds a controller identity sealed with a key file: start with --store-key-file"
        )
    return file_identity(config.data_dir / "pki")


def file_identity(pki_dir: Path) -> Identity:
    """Today's layout: ``ca.key``/``ca.crt``, ``secrets.key`` and ``admins.json`` in ``pki_dir``."""
    return Identity(
        CertificateAuthority.load_or_create(pki_dir),
        SecretBox.load_or_create(pki_dir / "secrets.key"),
        FileAdmins(AdminRegistry(pki_dir)),
        where=str(pki_dir),
    )
