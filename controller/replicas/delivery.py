"""Cross-replica delivery: a change made through any replica reaches the agent on any other.

Each replica holds some agents' streams (``Hub``). With several replicas on one store (PostgreSQL),
``Delivery`` is the hub's ``remote``:

- ``streams.StreamRegistry`` says which replica holds each node's stream, so ``hub.connected``
  (node state, ``node list``, WatchNodes) counts a node streaming to a live other replica;
- ``hub.send`` to a node held elsewhere becomes an intent (``intents``), published to the other
  replicas (``Store.publish``, never a secret); the one holding the stream acts on it: sends the
  message, renders and sends the plan, or asks for fresh join material with its own command id;
- changes the others make (``Store.subscribe``) reach this replica's parts: a new environment
  document is parsed off the loop for the planner; a node's change goes to the node watch, and a
  revoked or deleted node's stream here is closed; join material or a freed join slot lets this
  replica's waiters go; stored events reach ``events --follow`` here (``remote_events``).

With the SQLite store there is one replica and no ``Delivery`` (``install`` returns None): the
hub works alone, exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from tether.controller import wire
from tether.controller.app import App
from tether.controller.hub import Session
from tether.controller.limits import RESET_CLOSE_GRACE_SECONDS
from tether.controller.replicas import intents
from tether.controller.replicas.intents import Intent
from tether.controller.replicas.remote_events import EventRelay
from tether.controller.replicas.streams import PREFIX as STREAMS_PREFIX
from tether.controller.replicas.streams import Liveness, StreamRegistry
from tether.controller.spec import load_document
from tether.controller.store import NodeRecord
from tether.controller.store.records import StoreChange
from tether.nodeagent import logs
from tether.nodeagent.model import HostFacts, Plan, facts_from_dict, now_ms

log = logs.get_logger("tether.controller.replicas")

TOPIC = "delivery"
PLAN_WAIT_SECONDS = 3.0  # how long the holder waits for its view to render the plan another chose
PLAN_RETRY_SECONDS = 0.05
SUPERSEDE_MARGIN_MS = 2000  # clock skew allowed between replicas before a quiet stream is closed


class Agents(Protocol):
    """The agent service's part (``AgentService``)."""

    async def render_plan(
        self, node: NodeRecord, facts: HostFacts, generation: int | None = None
    ) -> Plan: ...

    def plan_message(self, plan: Plan) -> wire.agent.ControllerMessage: ...

    async def push_plan(self, name: str, generation: int | None = None) -> None: ...


def install(app: App, agents: Agents, liveness: Liveness | None = None) -> Delivery | None:
    """A ``Delivery`` wired into ``app`` when its store is shared by replicas; None for SQLite."""
    if app.store.kind == "sqlite":
        return None
    delivery = Delivery(app, agents, liveness)
    app.hub.remote = delivery
    app.cluster.refresh_elsewhere = delivery.refresh_elsewhere
    app.store.subscribe(delivery.on_store_change)
    return delivery


class Delivery:
    """``Hub.remote`` for a replica; ``start`` once the controller's parts are up, ``stop`` before
    the store closes."""

    def __init__(self, app: App, agents: Agents, liveness: Liveness | None = None) -> None:
        self.app = app
        self.agents = agents
        self.streams = StreamRegistry(
            app.store,
            on_change=lambda node: app.hub.on_change(node),
            supersede=self._supersede,
            alive=liveness,
        )
        self.events = EventRelay(app.store, app.hub, app.cluster)
        self._outgoing: list[Intent] = []
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._parsing: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._pushing: dict[str, tuple[int, str]] = {}  # node -> the plan being handed to it

    async def start(self) -> None:
        await self.streams.start()
        self._sender = asyncio.create_task(self._send_loop(), name="delivery-sender")

    async def stop(self) -> None:
        await self.streams.stop()
        await self.events.stop()
        for task in [self._sender, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- Hub.remote -----------------------------------------------------------------------------

    def attached(self, session: Session) -> None:
        self.streams.attached(session.node)

    def detached(self, session: Session) -> None:
        self.streams.detached(session.node)

    def connected(self, node: str) -> bool:
        return self.streams.holder(node) is not None

    def send(self, node: str, msg: Any) -> bool:
        """Hand ``msg`` to the replica holding ``node``'s stream; False when none does, or when
        the message may not travel (the holder's own code hands such things out)."""
        if self.streams.holder(node) is None:
            return False
        intent = intents.for_message(node, msg)
        if intent is None:
            log.info("not handed to another replica", node=node, kind=msg.WhichOneof("kind"))
            return False
        self._queue(intent)
        return True

    def refresh_elsewhere(self, environment: str, node: str, cert_key: bool) -> None:
        self._queue(intents.refresh(node, environment, cert_key))

    # -- out --------------------------------------------------------------------------------------

    def _queue(self, intent: Intent) -> None:
        self._outgoing.append(intent)
        self._wake.set()

    async def _send_loop(self) -> None:
        """One publisher: intents leave in the order they were made, packed together."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._outgoing = self._outgoing, []
            for payload in intents.pack(batch):
                try:
                    await self.app.store.publish(TOPIC, payload)
                except Exception as exc:
                    log.warning("intents for other replicas lost", error=str(exc).splitlines()[:1])

    # -- in ---------------------------------------------------------------------------------------

    def on_store_change(self, change: StoreChange) -> None:
        """A change another replica made (called on the loop by the store)."""
        try:
            self._dispatch(change)
        except Exception:
            log.exception("a change of another replica was not handled", kind=change.kind)

    def _dispatch(self, change: StoreChange) -> None:
        kind, key = change.kind, change.key
        if kind == "message" and key == TOPIC:
            for intent in intents.unpack(change.payload):
                self._act(intent)
        elif kind == "node":
            self._node_changed(key)
        elif kind == "node_deleted":
            self._node_deleted(key)
        elif kind == "events":
            self.events.changed(key, change.seq)
        elif kind == "kv" and key.startswith(STREAMS_PREFIX):
            self.streams.changed(key)
        elif kind == "kv" and key.startswith("cluster/"):
            self._spawn(self.app.cluster.remote_kv(key))
        elif kind == "environment":
            self._learn(key)

    def _act(self, intent: Intent) -> None:
        """An intent of another replica's, for a node whose stream may be here."""
        session = self.app.hub.session(intent.node)
        if session is None:
            return
        if intent.kind == intents.MESSAGE:
            msg = intents.message_of(intent)  # only what for_message sends (never a secret or a capability)
            if msg is None:
                log.warning("an intent of another replica that may not travel was dropped", node=intent.node)
                return
            session.send(msg)
        elif intent.kind == intents.PLAN:
            plan = (int(intent.fields["g"]), str(intent.fields["d"]))
            self._pushing[intent.node] = plan
            self._spawn(self._push(intent.node, *plan))
        elif intent.kind == intents.REFRESH:
            env, cert_key = str(intent.fields["e"]), bool(intent.fields["c"])
            self.app.cluster.refresh_here(env, intent.node, cert_key)

    def _node_changed(self, name: str) -> None:
        app = self.app
        if app.watch is not None:
            app.watch.check(name)
        session = app.hub.session(name)
        record = app.store.get_node(name)
        if session is not None and (record is None or record.revoked):
            log.info("node revoked through another replica: its stream here is closed", node=name)
            session.close()

    def _node_deleted(self, name: str) -> None:
        app = self.app
        if app.watch is not None:
            app.watch.forgotten(name)
        self.events.forget(name)
        session = app.hub.session(name)
        if session is not None:  # the ack of its last event may be queued: let it go out first
            asyncio.get_running_loop().call_later(RESET_CLOSE_GRACE_SECONDS, session.close)

    def _supersede(self, node: str, claimed_ms: int) -> None:
        """Another replica attached ``node`` at ``claimed_ms``: this stream, quiet since, is half dead."""
        session = self.app.hub.session(node)
        if session is None:
            return
        quiet_since = now_ms() - int((time.monotonic() - session.last_seen) * 1000)
        if claimed_ms - quiet_since > SUPERSEDE_MARGIN_MS:
            log.info("the agent streams to another replica now: its old stream here is closed", node=node)
            session.close()

    # -- environments and plans -------------------------------------------------------------------

    def _learn(self, name: str) -> None:
        """Another replica stored a generation of ``name``: parse it off the loop for the planner."""
        env = self.app.store.get_environment(name)
        if env is None or (name, env.generation) in self._parsing:
            return
        key = (name, env.generation)
        task = self._spawn(self._parse(name, env.generation))
        self._parsing[key] = task
        task.add_done_callback(lambda _: self._parsing.pop(key, None))  # the planner has it now

    async def _parse(self, name: str, generation: int) -> None:
        env = self.app.store.get_environment(name)
        if env is None or env.generation != generation:
            return
        try:
            loaded = await asyncio.to_thread(load_document, env.document)
        except Exception as exc:  # the planner reports it when a node of that environment asks
            log.warning("stored environment does not load", environment=name, error=str(exc)[:200])
            return
        self.app.planner.remember(env, loaded)

    async def _push(self, name: str, generation: int, digest: str) -> None:
        """Another replica chose plan ``digest`` (of ``generation``) for ``name``, streaming here:
        render it from the store (once this replica's view shows what that one wrote) and send
        it; if it never matches, this replica's own plan for it is stored and sent."""
        deadline = time.monotonic() + PLAN_WAIT_SECONDS
        wanted = (generation, digest)
        plan: Plan | None = None
        while plan is None or (plan.digest != digest and time.monotonic() < deadline):
            if plan is not None:
                await asyncio.sleep(PLAN_RETRY_SECONDS)
            node = self.app.store.get_node(name)
            if node is None or node.revoked or self.app.hub.session(name) is None:
                return
            await self._environment(node.environment, generation)
            plan = await self.agents.render_plan(node, facts_from_dict(node.facts), generation)
            if self._pushing.get(name) != wanted:
                return  # a newer plan is on its way
        del self._pushing[name]
        if plan.digest == digest:
            self.app.hub.send(name, self.agents.plan_message(plan))
            return
        log.warning("the plan another replica chose does not render here; sending this one's", node=name)
        await self.agents.push_plan(name, generation)

    async def _environment(self, name: str, generation: int) -> None:
        """Wait (a little) until the view holds ``generation`` of ``name`` and it is parsed."""
        deadline = time.monotonic() + PLAN_WAIT_SECONDS
        while time.monotonic() < deadline:
            env = self.app.store.get_environment(name)
            if env is None or env.generation >= generation:
                break
            await asyncio.sleep(PLAN_RETRY_SECONDS)
        parsing = self._parsing.get((name, generation))
        if parsing is not None:
            await asyncio.shield(parsing)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
