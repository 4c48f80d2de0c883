"""Secrets over a transport that records its commands (SSM): sealed to a key only the node holds."""

from __future__ import annotations

import base64
import contextlib
import io
import os
import shlex
import sys
import sysconfig
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tether.bootstrap.sealing import INFO, seal, write_secret
from tether.bootstrap.transport import CommandResult, Transport
from tether.nodeagent.secrets import Secret

SECRET = "abc123.canarysecretcanarysecret0000"


def _open(key: X25519PrivateKey, box: str, path: str) -> bytes:
    blob = base64.b64decode(box)
    eph, nonce, sealed = blob[:32], blob[32:44], blob[44:]
    mine = key.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    shared = key.exchange(X25519PublicKey.from_public_bytes(eph))
    aead = ChaCha20Poly1305(HKDF(hashes.SHA256(), 32, None, INFO + eph + mine).derive(shared))
    return aead.decrypt(nonce, sealed, path.encode())


def test_a_sealed_box_opens_only_with_the_node_key_and_for_its_path() -> None:
    node = X25519PrivateKey.generate()
    public = node.public_key().public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
    box = seal(public, SECRET.encode(), "/etc/tether/join-token")
    assert SECRET not in box
    assert box != seal(public, SECRET.encode(), "/etc/tether/join-token")  # fresh randomness each time
    assert _open(node, box, "/etc/tether/join-token") == SECRET.encode()
    with pytest.raises(InvalidTag):
        _open(node, box, "/etc/tether/other")
    with pytest.raises(InvalidTag):
        _open(X25519PrivateKey.generate(), box, "/etc/tether/join-token")


class RecordingNode(Transport):
    """Runs the node-side Python programs in this process, with /run moved under a temp dir."""

    kind = "ssm"
    confidential_input = False

    def __init__(self, root: Path) -> None:
        super().__init__("ssm:i-test")
        self.root = root
        self.commands: list[str] = []

    def _path(self, arg: str) -> str:
        return str(self.root) + arg if arg.startswith("/run/") else arg

    async def run(self, command: str, *, stdin: bytes | None = None, timeout: float = 300) -> CommandResult:
        self.commands.append(command)
        argv = shlex.split(command)
        assert argv[1:3] == ["-I", "-c"], command
        program, args = argv[3], [self._path(a) for a in argv[4:]]
        out = io.StringIO()
        saved = sys.argv
        sys.argv = ["-c", *args]
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(program, "<node>", "exec"), {"__name__": "__main__"})
        finally:
            sys.argv = saved
        return CommandResult(0, out.getvalue(), "")

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        raise AssertionError("a recording transport must never get a secret as file content")

    async def close(self) -> None:
        return None


async def test_write_secret_over_a_recording_transport_never_sends_the_secret(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    node = RecordingNode(tmp_path)
    lib = sysconfig.get_paths()["purelib"]  # where this interpreter's cryptography lives
    written = tmp_path / "etc/tether/join-token"
    await write_secret(node, str(written), Secret(SECRET), python=sys.executable, lib_dir=lib)
    assert written.read_text() == SECRET
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    assert list((tmp_path / "run").iterdir()) == []  # the one-time private key is gone
    assert len(node.commands) == 2
    for command in node.commands:
        assert SECRET not in command
        assert SECRET.split(".")[1] not in command
    assert os.stat(tmp_path / "etc/tether").st_mode & 0o077 == 0
