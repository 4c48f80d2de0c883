"""Writing a secret file on the node without the secret ever being recorded on the way.

Over SSH the secret is the stdin of a command on an encrypted session: nothing else sees it.
SSM keeps every command's text in the account's command history, so there the node first makes
a one-time X25519 key (the private half stays in a 0600 file under /run), the operator side
seals the secret to it (X25519 + HKDF-SHA256 + ChaCha20-Poly1305, bound to the destination path),
and only the sealed box travels in a command. The node opens it, writes the file 0600 and
deletes the key. Someone reading the command history learns nothing useful.
"""

from __future__ import annotations

import base64
import os
import secrets as random_names

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tether.bootstrap import nodescripts
from tether.bootstrap.errors import BootstrapError
from tether.bootstrap.transport import Transport
from tether.nodeagent.secrets import Secret

INFO = b"tether-bootstrap-seal-v1"


def seal(node_public: bytes, plaintext: bytes, path: str) -> str:
    """A base64 box only the holder of the node's private key can open (for ``path``)."""
    eph = X25519PrivateKey.generate()
    eph_public = eph.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
    shared = eph.exchange(X25519PublicKey.from_public_bytes(node_public))
    key = HKDF(hashes.SHA256(), 32, None, INFO + eph_public + node_public).derive(shared)
    nonce = os.urandom(12)
    box = ChaCha20Poly1305(key).encrypt(nonce, plaintext, path.encode())
    return base64.b64encode(eph_public + nonce + box).decode()


async def write_secret(
    transport: Transport, path: str, secret: Secret, *, python: str, lib_dir: str, mode: int = 0o600
) -> None:
    """Write ``secret`` to ``path`` (root-owned, ``mode``) by the safest means the transport has."""
    data = secret.reveal().encode()
    if transport.confidential_input:
        await transport.write_file(path, data, mode=mode)
        return
    key_path = f"/run/tether-seal-{random_names.token_hex(8)}.key"
    out = await transport.check(
        "making a one-time sealing key",
        nodescripts.command(python, nodescripts.SEAL_KEYGEN, lib_dir, key_path),
    )
    try:
        node_public = base64.b64decode(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BootstrapError("the node returned no usable sealing key", target=transport.target) from None
    if len(node_public) != 32:
        raise BootstrapError("the node returned no usable sealing key", target=transport.target)
    box = seal(node_public, data, path)
    await transport.check(
        f"writing {path}",
        nodescripts.command(python, nodescripts.UNSEAL, lib_dir, key_path, path, f"{mode:o}", box),
    )
