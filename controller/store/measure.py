"""Store throughput on its own (no gRPC, no agents): enrollments/s and persisted output lines/s.

For the bench and docs/store.md: ``await measure(location)`` on an empty store (a SQLite path or
a postgresql:// URL of an empty database) enrolls ``nodes`` nodes on one token the way the
controller does (many in flight), then has every node append output events of
``lines_per_event`` lines, ``concurrency`` appends in flight, for ``seconds``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tether.controller.errors import TokenRejected
from tether.controller.store import open_store
from tether.controller.store.base import Store
from tether.controller.store.records import NodeRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind


@dataclass(frozen=True)
class Throughput:
    backend: str
    enrollments_per_s: float
    lines_per_s: float
    events_per_s: float


Decide = Callable[[TokenRecord | None, NodeRecord | None], tuple[NodeRecord, bool]]


def _decide(name: str) -> Decide:
    def decide(token: TokenRecord | None, existing: NodeRecord | None) -> tuple[NodeRecord, bool]:
        if token is None or token.uses >= token.max_uses:
            raise TokenRejected("used up", "used up")
        record = NodeRecord(name, token.environment, token.role, "fp-" + name, "kh-" + name, token.id, 1)
        return record, existing is None

    return decide


async def measure(
    location: str | Path,
    nodes: int = 2000,
    concurrency: int = 64,
    lines_per_event: int = 100,
    seconds: float = 5.0,
) -> Throughput:
    store = await open_store(location, notify_key=secrets.token_bytes(32))  # it hears no other replica
    try:
        await store.put_token(TokenRecord("bench", "h", "bench", "worker", "", 10**15, nodes, 0, False, 1))
        names = [f"bench-{i:05d}" for i in range(nodes)]
        gate = asyncio.Semaphore(concurrency)

        async def enroll(name: str) -> None:
            async with gate:
                await store.enroll_node("bench", name, _decide(name))

        t0 = time.perf_counter()
        await asyncio.gather(*(enroll(n) for n in names))
        enroll_rate = nodes / (time.perf_counter() - t0)
        lines = tuple(f"output line {i} of a step that prints a fair amount" for i in range(lines_per_event))
        appended = await _append_for(store, names[:concurrency], lines, seconds)
        return Throughput(store.kind, enroll_rate, appended * lines_per_event / seconds, appended / seconds)
    finally:
        await store.close()


async def _append_for(store: Store, names: list[str], lines: tuple[str, ...], seconds: float) -> int:
    """Events stored by ``len(names)`` nodes appending one after another for ``seconds``."""
    deadline = time.perf_counter() + seconds
    counts = [0] * len(names)

    async def node(i: int, name: str) -> None:
        seq = 0
        while time.perf_counter() < deadline:
            seq += 1
            event = Event(kind=EventKind.OUTPUT, seq=seq, step="s", digest="d", time_ms=seq, lines=lines)
            await store.append_events(name, [event])
            counts[i] += 1

    await asyncio.gather(*(node(i, n) for i, n in enumerate(names)))
    return sum(counts)
