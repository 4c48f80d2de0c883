"""The key-encryption key of ``--store-key-file``: 32 random bytes only its owner may read.

The first replica creates the file (0600, base64 text) when the store holds no identity yet; every
other replica is given a copy. The key never enters the store: the store holds only what it sealed.
A file of the 32 raw bytes is accepted too.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tether.controller.errors import FailedPrecondition

KEY_BYTES = 32


class KeyFileError(FailedPrecondition):
    """The key file is missing, unsafe, malformed or not the one the stored identity was sealed with."""


@dataclass(frozen=True)
class StoreKey:
    """The key of ``--store-key-file``, loaded once before the store opens (it seals the identity
    and signs the notices between replicas); ``created``: this process made the file just now."""

    path: Path
    key: bytes = field(repr=False)
    created: bool = False


def load_or_create_key(path: Path) -> StoreKey:
    """The key in ``path``, or a new one written there when the file is missing (the first replica)."""
    made = None if path.exists() else create_key_file(path)
    return StoreKey(path, made, created=True) if made is not None else StoreKey(path, read_key_file(path))


def read_key_file(path: Path) -> bytes:
    """The key in ``path``; refused when group or others may access it, or when it holds no key."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(f"the store key file {path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read the store key file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"the store key file {path} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        mode = stat.S_IMODE(st.st_mode)
        raise KeyFileError(
            f"the store key file {path} is accessible by group or others (mode {mode:o}): chmod 600 {path}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the store key file {path}: {exc.strerror}") from None
    return _parse(path, data)


def _parse(path: Path, data: bytes) -> bytes:
    if len(data) == KEY_BYTES:
        return data
    try:
        key = base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyFileError(
            f"the store key file {path} holds no key ({KEY_BYTES} random bytes, or their base64)"
        )
    return key


def create_key_file(path: Path) -> bytes | None:
    """Create ``path`` (0600) with a new key; None when it exists already (someone else made it).

    The key is written to a private temporary file first and linked into place, so that nobody
    ever reads a half-written key file.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, base64.b64encode(key) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.link(tmp, path)
    except FileExistsError:
        return None
    finally:
        tmp.unlink(missing_ok=True)
    _sync_dir(path.parent)
    return key


def _sync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
