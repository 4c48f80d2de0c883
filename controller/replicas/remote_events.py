"""Events stored by another replica, handed to whoever here waits for them.

The store says a node's events went up to a seq (a ``StoreChange`` of kind "events"). When nobody
here follows that node (``events --follow`` of it or of its environment) and no kubectl task sent
from here waits for its answer, only the seq is noted: nothing is read. Otherwise the events after
the last seq noted are read from the store, page by page (one reader per node at a time), and
published to the hub's followers and to the cluster's drain gates. A follower fills any gap from
the store itself, so a node first seen mid-batch starts at its last ``BACKLOG`` events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from tether.controller.hub import Hub
from tether.controller.store import NodeRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import Event

log = logs.get_logger("tether.controller.replicas")

PAGE = 500
BACKLOG = 64


class TaskWaiter(Protocol):
    """The cluster's part (``Orchestrator``): kubectl tasks sent from here wait for answers."""

    def awaits_events_of(self, node: str) -> bool: ...

    def remote_events(self, node: NodeRecord, events: Sequence[Event]) -> None: ...


class EventRelay:
    def __init__(self, store: Store, hub: Hub, tasks: TaskWaiter | None = None) -> None:
        self._store = store
        self._hub = hub
        self._tasks = tasks
        self._seen: dict[str, int] = {}  # node -> the last seq handed out (or noted)
        self._wanted: dict[str, int] = {}  # node -> the seq a running reader reads up to
        self._readers: set[asyncio.Task[None]] = set()

    def changed(self, node: str, seq: int) -> None:
        """Another replica stored ``node``'s events up to ``seq``."""
        if node in self._wanted:
            self._wanted[node] = max(self._wanted[node], seq)
            return
        if not self._interested(node):
            self._seen[node] = max(self._seen.get(node, 0), seq)
            return
        if self._seen.setdefault(node, max(0, seq - BACKLOG)) >= seq:
            return
        self._wanted[node] = seq
        task = asyncio.get_running_loop().create_task(self._read(node))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    def forget(self, node: str) -> None:
        self._seen.pop(node, None)

    def _interested(self, node: str) -> bool:
        record = self._store.get_node(node)
        environment = record.environment if record is not None else ""
        return self._hub.following(node, environment) or (
            self._tasks is not None and self._tasks.awaits_events_of(node)
        )

    async def _read(self, node: str) -> None:
        try:
            while self._seen.get(node, 0) < self._wanted[node]:
                after = self._seen.get(node, 0)
                page = await self._store.list_events(node, after, PAGE)
                if not page:
                    self._seen[node] = self._wanted[node]
                    break
                self._seen[node] = max(after, page[-1].seq)
                self._hand_out(node, page)
        except Exception:
            log.exception("events stored by another replica could not be read", node=node)
        finally:
            self._wanted.pop(node, None)

    def _hand_out(self, node: str, events: list[Event]) -> None:
        named = [e if e.node else replace(e, node=node) for e in events]
        record = self._store.get_node(node)
        environment = record.environment if record is not None else ""
        self._hub.publish(node, environment, named)
        if record is not None and self._tasks is not None and self._tasks.awaits_events_of(node):
            self._tasks.remote_events(record, named)

    async def stop(self) -> None:
        for task in list(self._readers):
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
