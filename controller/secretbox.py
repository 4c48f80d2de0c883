"""Secrets at rest: AES-256-GCM with a key that never leaves the controller's data dir.

Join material and kubeconfigs are stored sealed; a database dump shows only
ciphertext. The key file (``pki/secrets.key``, 0600) is created on first use; with
``--store-key-file`` the key lives in the store instead, sealed by the key-encryption key
(``tether.controller.identity``), which is itself a ``SecretBox``.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tether.nodeagent.identity import read_private, write_private

NONCE = 12


class SecretBox:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the secret box key must be 32 bytes")
        self._aead = AESGCM(key)

    def __repr__(self) -> str:
        return "SecretBox(***)"

    @staticmethod
    def new_key() -> bytes:
        return AESGCM.generate_key(bit_length=256)

    @classmethod
    def load_or_create(cls, path: Path) -> SecretBox:
        if path.exists():
            return cls(read_private(path))
        key = cls.new_key()
        write_private(path, key)
        return cls(key)

    def seal(self, plaintext: bytes, context: str) -> bytes:
        """Encrypt; ``context`` (e.g. the kv key) is bound in, so blobs cannot be swapped."""
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, plaintext, context.encode())

    def open(self, blob: bytes, context: str) -> bytes:
        return self._aead.decrypt(blob[:NONCE], blob[NONCE:], context.encode())
