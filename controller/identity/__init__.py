"""The controller's identity: its CA, its secret box and its admin registry.

``load_identity(config, store)`` picks the source: files in ``DATA_DIR/pki`` (the default, SQLite),
or the store itself, sealed with the key-encryption key of ``--store-key-file`` (the replicas of a
PostgreSQL store share one identity; a dump of the database shows only ciphertext).
"""

from tether.controller.identity.adminconf import ensure_admin_conf
from tether.controller.identity.admins import Admins, FileAdmins, StoreAdmins
from tether.controller.identity.keyfile import KeyFileError, StoreKey
from tether.controller.identity.model import Identity
from tether.controller.identity.source import file_identity, load_identity, load_store_key
from tether.controller.identity.stored import load_stored_identity

__all__ = [
    "Admins",
    "FileAdmins",
    "Identity",
    "KeyFileError",
    "StoreAdmins",
    "StoreKey",
    "ensure_admin_conf",
    "file_identity",
    "load_identity",
    "load_store_key",
    "load_stored_identity",
]
