"""Downloads an agent bundle over mTLS (``AgentService.FetchAgentBundle``), resuming a partial file.

Every chunk must continue where the file ends and be at most ``AGENT_BUNDLE_CHUNK_BYTES``; the
whole must have the size and SHA-256 the plan named (``AgentTarget``), and be at most
``AGENT_BUNDLE_MAX_BYTES``. A damaged file is removed, so the next try starts from zero.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import grpc

from tether.nodeagent import wire
from tether.nodeagent.channel import secure_channel
from tether.nodeagent.identity import Identity
from tether.nodeagent.limits import AGENT_BUNDLE_CHUNK_BYTES, AGENT_BUNDLE_MAX_BYTES, size_text
from tether.nodeagent.model import AgentTarget
from tether.nodeagent.upgrade import UpgradeError

FETCH_TIMEOUT_SECONDS = 900.0  # one whole download, all chunks


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


async def fetch(controller: str, identity: Identity, target: AgentTarget, dest: Path) -> None:
    """``dest`` holds the whole bundle of ``target``, checked, when this returns."""
    if not 0 < target.size <= AGENT_BUNDLE_MAX_BYTES:
        size, most = size_text(target.size), size_text(AGENT_BUNDLE_MAX_BYTES)
        raise UpgradeError(f"the bundle is {size}; agents take at most {most}", retryable=False)
    offset = await asyncio.to_thread(_resume_at, dest, target)
    if offset < target.size:
        try:
            await _receive(controller, identity, target, dest, offset)
        except grpc.aio.AioRpcError as exc:
            permanent = exc.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
            raise UpgradeError(
                f"download refused: {exc.code().name}: {exc.details()}", retryable=not permanent
            ) from None
    await asyncio.to_thread(_verify, dest, target)


def _resume_at(dest: Path, target: AgentTarget) -> int:
    """Where a partial download of ``target`` ends (0: none, or one longer than the bundle)."""
    offset = dest.stat().st_size if dest.exists() else 0
    if offset > target.size:
        dest.unlink()
        return 0
    return offset


def _verify(dest: Path, target: AgentTarget) -> None:
    got = dest.stat().st_size
    digest = _file_sha256(dest)
    if got != target.size or digest != target.sha256:
        dest.unlink()
        raise UpgradeError(f"the downloaded bundle does not match the plan ({got} bytes, sha256 {digest})")


async def _receive(controller: str, identity: Identity, target: AgentTarget, dest: Path, offset: int) -> None:
    async with secure_channel(controller, identity.ca_pem, identity.key_pem, identity.cert_pem) as channel:
        call = wire.AgentServiceStub(channel).FetchAgentBundle(
            wire.pb.FetchAgentBundleRequest(version=target.version, offset=offset),
            timeout=FETCH_TIMEOUT_SECONDS,
        )
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            async for chunk in call:
                _check(chunk, target, offset)
                os.write(fd, chunk.data)
                offset += len(chunk.data)
            os.fsync(fd)
        finally:
            os.close(fd)


def _check(chunk: wire.pb.BundleChunk, target: AgentTarget, offset: int) -> None:
    if (chunk.sha256 and chunk.sha256 != target.sha256) or (chunk.size and chunk.size != target.size):
        raise UpgradeError("the controller serves another bundle than the plan names")
    if chunk.offset != offset or len(chunk.data) > AGENT_BUNDLE_CHUNK_BYTES:
        raise UpgradeError(f"a chunk at {chunk.offset} ({len(chunk.data)} bytes) does not follow {offset}")
    if offset + len(chunk.data) > target.size:
        raise UpgradeError("the controller sends more than the bundle's size")
