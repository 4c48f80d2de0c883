"""Measure the shared stream registry (``tether.controller.replicas.streams``) in a reconnect storm.

10,000 streams attach to replica A within about two seconds, on a real PostgreSQL store; replica B
waits until it counts every one as connected. Compared with the obvious alternative, one key per
stream (``stream/<node>``), written at every attach. Both replicas live in this process.

Run: .venv/bin/python scripts/stream_registry_storm.py  (needs the PostgreSQL binaries; it makes
its own scratch cluster and removes it).
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

from tests import pgscratch
from tether.controller.replicas.streams import StreamRegistry
from tether.controller.store import Store, StoreChange, open_store

STREAMS = 10_000
WAVE = 50  # attaches between two turns of the loop (a storm arrives over ~2 s)


class _Live:
    def __call__(self, replica: str) -> bool:
        return True

    def stale_for_ms(self, replica: str) -> int:
        return 0


class _Seen:
    """The nodes B counts as connected; ``all`` is set once every one is."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.all = asyncio.Event()

    def add(self, node: str) -> None:
        self.nodes.add(node)
        if len(self.nodes) >= STREAMS:
            self.all.set()


async def _storm(attach: Callable[[str], Awaitable[None]], seen: _Seen) -> str:
    cpu, t0 = time.process_time(), time.perf_counter()
    for i in range(STREAMS):
        await attach(f"gpu-node-{i:05d}")
        if i % WAVE == WAVE - 1:
            await asyncio.sleep(0.01)
    attached = time.perf_counter() - t0
    await seen.all.wait()
    return (
        f"attached in {attached:.2f} s, all seen by B after {time.perf_counter() - t0:.2f} s, "
        f"CPU {time.process_time() - cpu:.2f} s (both replicas and their stores)"
    )


async def registry(a: Store, b: Store) -> str:
    seen = _Seen()
    ra = StreamRegistry(a, on_change=lambda n: None, supersede=lambda n, ms: None, alive=_Live())  # type: ignore[arg-type]
    rb = StreamRegistry(b, on_change=seen.add, supersede=lambda n, ms: None, alive=_Live())  # type: ignore[arg-type]

    def listen(change: StoreChange) -> None:
        if change.kind == "kv" and change.key.startswith("streams/"):
            rb.changed(change.key)

    b.subscribe(listen)
    await ra.start()
    await rb.start()
    writes = 0
    put = a.kv_put

    async def counted(key: str, value: bytes) -> None:
        nonlocal writes
        writes += 1
        await put(key, value)

    a.kv_put = counted  # type: ignore[method-assign]

    async def attach(node: str) -> None:
        ra.attached(node)

    result = await _storm(attach, seen)
    await ra.stop()
    await rb.stop()
    return f"registry (one entry per replica): {result}, {writes} writes"


async def per_key(a: Store, b: Store) -> str:
    seen = _Seen()
    b.subscribe(lambda c: seen.add(c.key) if c.kind == "kv" else None)
    pending: list[Any] = []

    async def attach(node: str) -> None:
        pending.append(asyncio.ensure_future(a.kv_put(f"stream/{node}", b"replica-a")))
        if len(pending) == WAVE:  # more at once runs the connection pool dry
            await asyncio.gather(*pending)
            pending.clear()

    result = await _storm(attach, seen)
    return f"one key per stream: {result}, {STREAMS} writes"


async def main(url_for: Callable[[], str]) -> None:
    for measure in (registry, per_key):
        url = url_for()
        key = secrets.token_bytes(32)  # the --store-key-file key both replicas share
        a, b = await open_store(url, notify_key=key), await open_store(url, notify_key=key)
        try:
            print(await measure(a, b))
        finally:
            await a.close()
            await b.close()


if __name__ == "__main__":
    cluster = pgscratch.start_cluster()
    try:
        asyncio.run(main(cluster.create_database))
    finally:
        cluster.remove()
