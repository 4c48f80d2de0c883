"""Two (or more) controller replicas in one process, on one SQLite file, with a fake change bus.

``SharedStore`` wraps a ``SqliteStore`` of the shared file (each replica its own connection, so a
read sees what any replica wrote) and tells the other replicas' listeners about every write, as
the PostgreSQL backend does through LISTEN/NOTIFY: after the write, on the event loop, never to
the writer itself. ``publish`` reaches the others' listeners as a "message" change.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.controller.agent_service import AgentService
from tether.controller.app import App
from tether.controller.auth import Authenticator
from tether.controller.ca import CertificateAuthority
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.config import ControllerConfig
from tether.controller.hub import Hub
from tether.controller.nodewatch import NodeWatch
from tether.controller.planner import Planner
from tether.controller.replicas.delivery import Delivery, install
from tether.controller.replicas.registry import PREFIX as REPLICA_PREFIX
from tether.controller.replicas.registry import Replica as Entry
from tether.controller.rollout import RolloutDriver
from tether.controller.secretbox import SecretBox
from tether.controller.store import SqliteStore
from tether.controller.store.records import StoreChange
from tether.nodeagent.model import Event, now_ms
from tether.nodeagent.secrets import Redactor


class Bus:
    def __init__(self) -> None:
        self.stores: list[SharedStore] = []
        self.published: list[tuple[str, str]] = []

    def announce(self, origin: SharedStore, change: StoreChange) -> None:
        loop = asyncio.get_running_loop()
        for store in self.stores:
            if store is not origin:
                for listener in store.listeners:
                    loop.call_soon(listener, change)


_NODE_WRITES = ("update_node", "patch_node_hardware", "set_node_plan", "reset_steps", "accept_acked")


class SharedStore:
    kind = "postgresql"  # several replicas share it

    def __init__(self, inner: SqliteStore, bus: Bus) -> None:
        self._inner = inner
        self._bus = bus
        self.replica_id = uuid.uuid4().hex
        self.listeners: list[Callable[[StoreChange], None]] = []
        bus.stores.append(self)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in _NODE_WRITES:
            return self._announcing(attr, "node")
        if name in ("kv_put", "kv_put_if_absent", "kv_delete"):
            return self._announcing(attr, "kv")
        if name in ("put_token", "revoke_token"):
            return self._announcing(attr, "token")
        return attr

    def _announcing(self, fn: Callable[..., Any], kind: Any) -> Callable[..., Any]:
        async def call(key: Any, *args: Any, **kwargs: Any) -> Any:
            result = await fn(key, *args, **kwargs)
            self._announce(kind, key if isinstance(key, str) else getattr(key, "id", ""))
            return result

        return call

    def _announce(self, kind: Any, key: str, seq: int = 0, payload: str = "") -> None:
        self._bus.announce(self, StoreChange(kind, key, seq, payload))

    def subscribe(self, listener: Callable[[StoreChange], None]) -> None:
        self.listeners.append(listener)

    async def publish(self, topic: str, payload: str) -> None:
        assert len(payload.encode()) <= 4000
        self._bus.published.append((topic, payload))
        self._announce("message", topic, payload=payload)

    async def enroll_node(self, token_id: str, node_name: str, decide: Any) -> Any:
        record = await self._inner.enroll_node(token_id, node_name, decide)
        self._announce("node", node_name)
        return record

    async def append_events(self, node: str, events: Sequence[Event]) -> int:
        stored = await self._inner.append_events(node, events)
        self._announce("node", node)
        self._announce("events", node, self._inner.max_seq(node))
        return stored

    async def delete_node(self, name: str) -> bool:
        gone = await self._inner.delete_node(name)
        self._announce("node_deleted", name)
        return gone

    async def put_environment(self, name: str, *args: Any, **kwargs: Any) -> Any:
        result = await self._inner.put_environment(name, *args, **kwargs)
        self._announce("environment", name)
        return result


@dataclass
class Replica:
    store: SharedStore
    app: App
    agents: AgentService
    delivery: Delivery

    @property
    def hub(self) -> Hub:
        return self.app.hub

    async def register(self, last_seen_ms: int) -> None:
        """This replica's registry entry, as ``replicas.registry`` writes it."""
        entry = Entry(self.store.replica_id, "127.0.0.1:1", "test", 0, last_seen_ms)
        await self.store.kv_put(REPLICA_PREFIX + self.store.replica_id, entry.to_bytes())

    async def close(self) -> None:
        await self.delivery.stop()
        self.store._bus.stores.remove(self.store)
        await self.store._inner.close()


async def replica(db: Path, data_dir: Path, bus: Bus) -> Replica:
    store = SharedStore(SqliteStore(db), bus)
    hub = Hub()
    watch = NodeWatch(store, hub)  # type: ignore[arg-type]
    planner = Planner(watch.store)  # type: ignore[arg-type]
    box = SecretBox.load_or_create(data_dir / "secrets.key")
    cluster = Orchestrator(store, hub, box, Redactor(), specs=planner.spec)  # type: ignore[arg-type]
    ca = CertificateAuthority.load_or_create(data_dir / "pki")
    app = App(
        config=ControllerConfig(data_dir=data_dir),
        ca=ca,
        store=watch.store,  # type: ignore[arg-type]
        auth=Authenticator(ca),
        hub=hub,
        planner=planner,
        advertise="127.0.0.1:1",
        cluster=cluster,
        rollouts=RolloutDriver(store, hub, planner, cluster),  # type: ignore[arg-type]
        watch=watch,
    )
    agents = AgentService(app)
    app.rollouts.deliver = agents.push_plan
    delivery = install(app, agents)
    assert delivery is not None
    made = Replica(store, app, agents, delivery)
    await made.register(now_ms())  # live (before anyone reads its entry)
    await watch.start()
    await delivery.start()
    return made
