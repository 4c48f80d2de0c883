"""Letting nodes go: ``tetherctl node delete`` (forget a node) and ``node reset`` (deprovision it).

A reset is durable: ``reset/NODE`` in the store holds its deadline. While it is there the node's
plan is the reset plan (``tether.controller.render.deprovision``), delivered like any plan (at once when
the node is connected, else when it connects). The agent runs it, reports the reset done (step
``tether.nodeagent.deprovision.RESET_DONE_STEP``) and removes itself; the controller then forgets the
node: its record, steps, events and cluster bookkeeping. A reset not reported by its deadline is
given up: the node is revoked and forgotten, with a warning saying so. An environment deleted
with ``--reset`` goes once its last node has.

Timers live in memory; after a controller restart they are armed again on first use. With
controller replicas only the leader arms them (``lead``/``rearm``; ``tether.controller.replicas``):
a reset started through another replica is armed at the leader's next ``rearm``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Sequence
from typing import Any

from tether.controller.app import App
from tether.controller.limits import RESET_CLOSE_GRACE_SECONDS, RESET_TIMEOUT_SECONDS
from tether.controller.render.deprovision import render_deprovision
from tether.controller.replicas import dnsnames
from tether.controller.store.records import NodeRecord
from tether.nodeagent import logs
from tether.nodeagent.deprovision import RESET_DONE_STEP
from tether.nodeagent.model import Event, Plan, Role, now_ms

log = logs.get_logger("tether.controller.resets")

_RESET = "reset/"
_ENV_DELETE = "env-delete/"


class Resets:
    """Node deletes and resets; ``timeout_s`` bounds how long a reset may take."""

    def __init__(self, app: App, timeout_s: float = RESET_TIMEOUT_SECONDS) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._armed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._expiring: set[asyncio.Task[None]] = set()  # overdue resets being given up (leader only)
        # Whether this process gives up overdue resets: the one replica, or the leader of several
        # (the server sets it False until this replica leads).
        self.leading = True

    # -- queries --------------------------------------------------------------------------------

    def resetting(self, name: str) -> bool:
        self._arm()
        return self.app.store.kv_get(_RESET + name) is not None

    def plan_for(self, node: NodeRecord) -> Plan | None:
        """The node's reset plan while it is being reset, else None (its ordinary plan)."""
        if not self.resetting(node.name):
            return None
        return render_deprovision(
            environment=node.environment,
            role=node.role,
            generation=node.plan_generation,
            kubeadm_cluster=self.app.cluster.cluster_spec(node.environment) is not None,
        )

    # -- operations -----------------------------------------------------------------------------

    async def start(self, node: NodeRecord, who: str) -> bool:
        """Mark ``node`` for a reset; False when it already was (its deadline is kept)."""
        if self.resetting(node.name):
            return False
        deadline = now_ms() + int(self.timeout_s * 1000)
        await self.app.store.kv_put(_RESET + node.name, json.dumps({"deadline_ms": deadline}).encode())
        self._schedule(node.name, deadline)
        log.info("node reset started", node=node.name, environment=node.environment, by=who)
        return True

    async def revoke(self, node: NodeRecord) -> None:
        """Revoke ``node`` and cut its stream (``node revoke``, ``node delete --force``)."""
        app = self.app
        await app.store.update_node(node.name, revoked=True)
        await app.cluster.node_revoked(node)
        session = app.hub.session(node.name)
        if session is not None:
            session.close()

    async def forget(self, node: NodeRecord, *, left_cluster: bool = False) -> None:
        """Remove every trace of ``node``: record, steps, events, cluster marks, a pending reset.
        ``left_cluster``: it ran kubeadm reset, so a cluster without control planes is gone too."""
        app = self.app
        await app.cluster.forget_node(node.environment, node.name)
        await app.store.delete_node(node.name)
        app.progress.forget(node.name)
        await app.store.kv_delete(_RESET + node.name)
        timer = self._timers.pop(node.name, None)
        if timer is not None:
            timer.cancel()
        session = app.hub.session(node.name)
        if session is not None:  # the ack of its last event is queued: let it go out first
            asyncio.get_running_loop().call_later(RESET_CLOSE_GRACE_SECONDS, session.close)
        remaining = app.store.list_nodes(node.environment)
        if left_cluster and not any(n.role == Role.CONTROL_PLANE.value for n in remaining):
            await app.cluster.forget_environment(node.environment)  # its last control plane left
        if not remaining and app.store.kv_get(_ENV_DELETE + node.environment) is not None:
            await self.delete_environment(node.environment)

    async def delete_environment(self, name: str) -> None:
        """Delete ``name`` with its cluster state, rollout, tokens and the records of its nodes."""
        app = self.app
        await app.store.kv_delete(_ENV_DELETE + name)
        for node in app.store.list_nodes(name):
            await self.forget(node)
        await app.store.delete_environment(name)
        await dnsnames.release(app.store, name)
        await app.cluster.forget_environment(name)
        await app.rollouts.forget(name)
        for t in app.store.list_tokens(name):
            await app.store.revoke_token(t.id)
        log.info("environment deleted", environment=name)

    async def delete_environment_after_resets(self, name: str) -> None:
        """``env delete --reset``: the environment goes once its last node has been reset."""
        await self.app.store.kv_put(_ENV_DELETE + name, b"1")
        if not self.app.store.list_nodes(name):
            await self.delete_environment(name)

    # -- what agents report -----------------------------------------------------------------------

    async def on_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        """The agent's report that its reset steps all ran: forget the node.

        The report is acknowledged before this runs, and the agent goes once it has the ack: its
        stream's handler (this caller) is then cancelled. The forgetting is a task of its own, so
        it is never cut half way (a node record gone but not the environment it took along)."""
        if not any(e.step == RESET_DONE_STEP for e in events) or not self.resetting(node.name):
            return
        log.info("node reset done; the node is forgotten", node=node.name, environment=node.environment)
        await asyncio.shield(self._spawn(self.forget(node, left_cluster=True)))

    # -- deadlines ----------------------------------------------------------------------------------

    def _arm(self) -> None:
        """Once per process: timers for the resets a previous run of the controller started."""
        if self._armed or not self.leading:
            return
        self._armed = True
        self._arm_new()

    def _arm_new(self) -> None:
        for key in self.app.store.kv_keys(_RESET):
            if key.removeprefix(_RESET) in self._timers:
                continue
            raw = self.app.store.kv_get(key)
            deadline = int(json.loads(raw).get("deadline_ms", 0)) if raw else 0
            self._schedule(key.removeprefix(_RESET), deadline)

    async def rearm(self) -> None:
        """This replica leads: timers for every reset in the store it has none for yet (started
        before it led, or through another replica)."""
        self.leading = self._armed = True
        self._arm_new()

    async def unlead(self) -> None:
        """Another replica leads now: its timers give up overdue resets, not this one's."""
        self.leading = self._armed = False
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._expiring):  # giving up mid-way: the new leader gives up instead
            task.cancel()

    def _schedule(self, name: str, deadline_ms: int) -> None:
        if not self.leading:
            return
        old = self._timers.pop(name, None)
        if old is not None:
            old.cancel()
        delay = max(0.0, (deadline_ms - now_ms()) / 1000)
        self._timers[name] = asyncio.get_running_loop().call_later(delay, self._expire_soon, name)

    def _expire_soon(self, name: str) -> None:
        task = self._spawn(self._expire(name))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task of its own, kept until it ends (a cancelled caller does not stop it)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _expire(self, name: str) -> None:
        try:
            await self._give_up(name)
        finally:  # kept until now: a rearm meanwhile must not arm it again
            self._timers.pop(name, None)

    async def _give_up(self, name: str) -> None:
        node = self.app.store.get_node(name)
        if node is None or not self.resetting(name):
            await self.app.store.kv_delete(_RESET + name)
            return
        log.warning(
            "node reset not reported done in time; the node is revoked and forgotten "
            "(its machine may still hold the agent, its config and state: remove them there)",
            node=name,
            environment=node.environment,
            timeout_seconds=self.timeout_s,
        )
        await self.revoke(node)
        await self.forget(node)


__all__ = ["Resets"]
