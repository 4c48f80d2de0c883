"""The drain and uncordon gates (``spec.rollout.drain``): a node's disruptive steps run between them.
A reset's plan (``tether.controller.render.deprovision``) uses the drain gate too, and a delete-node gate
after ``kubeadm reset``, answered by another control plane's ``kubectl delete node``.

A node that has not joined its cluster has nothing to drain: both gates open at once. Otherwise a
one-off task goes to a connected, joined control plane (another one than the node when there is
one; a lone control plane drains itself) that runs ``kubectl cordon`` + ``drain`` (or
``uncordon``), and the node's gate opens with the task's result: done, or failed with the reason,
which fails the gated step (so a rollout counts it failed). A task that never answers fails the
gate once its timeout and a grace period have passed.

Pending gates live in memory, like the join waiters: after a controller restart agents ask again.

``cordon`` (``hardware.onDrift: cordon``, a node whose GPUs drifted) is no gate: the same kind of
task runs ``kubectl cordon`` only, and its result goes to ``on_cordoned`` (the node's event).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tether.controller import wire
from tether.controller.cluster.context import DELETE_NODE_STEP, GATE_DONE, GATE_MESSAGE, GATE_RESULT
from tether.controller.cluster.scripts import drain_task
from tether.controller.hub import Hub
from tether.controller.limits import DRAIN_MESSAGE_CHARS, DRAIN_TIMEOUT_SECONDS
from tether.controller.store import NodeRecord
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind

log = logs.get_logger("tether.controller.drain")

ANSWER_GRACE_S = 120.0  # past the task's own timeout, its answer is given up as lost
COMMAND_PREFIX = "drain-"
CORDON = "cordon"  # a task of its own, no gate (GPU drift)
TAIL_LINES = 3  # lines of the task's output quoted in that reason


@dataclass
class _Pending:
    node: str
    environment: str
    action: str  # the gated step: "drain" | "uncordon"
    digest: str  # the gated step's digest
    runner: str = ""  # the control plane the task went to ("" while none could take it)
    task: str = ""  # the task's event step name (task:ACTION-NODE)
    task_digest: str = ""  # unique per task (a nonce in its env): only its events answer it
    tail: list[str] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Drainer:
    """Answers the drain and uncordon gates. ``live`` is the node's record unless it is revoked,
    ``member`` whether a node has joined its cluster, ``runner(env, node)`` the control plane to run
    kubectl for ``node`` (None while none is connected)."""

    def __init__(
        self,
        hub: Hub,
        *,
        live: Callable[[str], NodeRecord | None],
        member: Callable[[str], bool],
        runner: Callable[[str, str], str | None],
        others: Callable[[str, str], bool] = lambda env, node: False,
        timeout_seconds: int = DRAIN_TIMEOUT_SECONDS,
        lost_after_seconds: float = 0.0,
        on_cordoned: Callable[[str, bool, str], None] = lambda node, ok, message: None,
    ) -> None:
        self._hub = hub
        self._live = live
        self._member = member
        self._runner = runner
        self._others = others  # (env, node): the cluster has control planes besides the node
        self._timeout = timeout_seconds
        # A task is given up once its own timeout (kubectl's plus a minute) and a grace period passed.
        self._lost_after = lost_after_seconds or timeout_seconds + 60 + ANSWER_GRACE_S
        self._pending: dict[str, _Pending] = {}  # node -> its open drain or uncordon gate
        self._cordons: dict[str, _Pending] = {}  # node -> its cordon task (GPU drift)
        self._on_cordoned = on_cordoned

    async def gate_requested(self, node: NodeRecord, action: str, digest: str) -> None:
        """``action`` is the gated step (checked by the caller: in the node's plan, this digest)."""
        self.forget(node.name)
        if not self._member(node.name):
            why = f"{node.name} has not joined the cluster yet: nothing to {action}"
            self._release(node.name, action, digest, True, why)
            return
        pending = _Pending(node.name, node.environment, action, digest)
        self._pending[node.name] = pending
        self._dispatch(pending)

    def cordon(self, node: str, environment: str) -> str:
        """Have a control plane run ``kubectl cordon node`` (no gate: the result goes to
        ``on_cordoned``); says where the task went, or that it waits for a control plane."""
        old = self._cordons.pop(node, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        pending = _Pending(node, environment, CORDON, "")
        self._cordons[node] = pending
        self._dispatch(pending)
        if pending.runner:
            return f"kubectl cordon {node} sent to {pending.runner}"
        return f"kubectl cordon {node} waits for a joined control plane to connect to run it"

    def on_connect(self, environment: str) -> None:
        """A control plane connected: gates that found none to run kubectl get one now."""
        for pending in [*self._pending.values(), *self._cordons.values()]:
            if pending.environment == environment and not pending.runner:
                self._dispatch(pending)

    def on_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        """Task events from a control plane: a task's result opens the gate it was sent for."""
        for e in events:
            if not e.step.startswith("task:"):
                continue
            pending = next(
                (
                    p
                    for p in (*self._pending.values(), *self._cordons.values())
                    if p.runner == node.name and p.task == e.step and p.task_digest == e.digest
                ),
                None,
            )
            if pending is None:
                continue
            if e.kind is EventKind.OUTPUT:
                pending.tail = [*pending.tail, *e.lines][-TAIL_LINES:]
            elif e.kind is EventKind.SUCCEEDED:
                self._finish(pending, True, f"{pending.node}: kubectl {pending.action} done (on {node.name})")
            elif e.kind is EventKind.FAILED:
                reason = e.message or f"exit code {e.exit_code}"
                said = " | ".join(line.strip() for line in pending.tail if line.strip())
                self._finish(
                    pending,
                    False,
                    f"kubectl {pending.action} of {pending.node} failed on {node.name}: {reason}"
                    + (f": {said}" if said else "")
                    + f" (tetherctl events --node {node.name})",
                )

    def forget(self, node: str) -> None:
        """Drop the node's open gate (a new request replaces it; a revoked node gets nothing)."""
        pending = self._pending.pop(node, None)
        if pending is not None and pending.timer is not None:
            pending.timer.cancel()

    def waits_on(self, runner: str) -> bool:
        """A task sent to ``runner`` has not answered yet."""
        return any(p.runner == runner for p in (*self._pending.values(), *self._cordons.values()))

    def pending(self, node: str) -> str:
        """The node's open gate ("drain", "uncordon") and where its task went, for logs and tests."""
        p = self._pending.get(node)
        return f"{p.action}@{p.runner}" if p is not None else ""

    # -- internals ----------------------------------------------------------------------------

    def _dispatch(self, pending: _Pending) -> None:
        runner = self._runner(pending.environment, pending.node)
        if pending.action == DELETE_NODE_STEP and runner == pending.node:
            runner = None  # its API server went with kubeadm reset: another control plane deletes it
        if (
            runner is None
            and pending.action == DELETE_NODE_STEP
            and not self._others(pending.environment, pending.node)
        ):
            why = f"{pending.node} was the cluster's last control plane: no node object is left to delete"
            self._finish(pending, True, why)
            return
        if runner is None:
            log.warning(
                "no joined control plane is connected to run kubectl; the gate waits",
                node=pending.node,
                action=pending.action,
            )
            return
        nonce = secrets.token_hex(8)
        task = drain_task(pending.node, action=pending.action, nonce=nonce, timeout_seconds=self._timeout)
        message = wire.agent.ControllerMessage(
            command=wire.agent.Command(
                id=f"{COMMAND_PREFIX}{nonce}", task=wire.agent.RunTask(step=wire.step_to_pb(task))
            )
        )
        if not self._hub.send(runner, message):
            return  # it went away meanwhile: the next control plane to connect takes it
        pending.runner, pending.task, pending.task_digest = runner, f"task:{task.name}", task.digest
        pending.timer = asyncio.get_running_loop().call_later(self._lost_after, self._lost, pending)
        log.info("kubectl task sent", node=pending.node, action=pending.action, runner=runner)

    def _lost(self, pending: _Pending) -> None:
        if self._pending.get(pending.node) is pending or self._cordons.get(pending.node) is pending:
            why = f"no answer from {pending.runner} to kubectl {pending.action} within {self._lost_after:g}s"
            self._finish(pending, False, why)

    def _finish(self, pending: _Pending, ok: bool, message: str) -> None:
        if pending.action == CORDON:
            if self._cordons.get(pending.node) is pending:
                del self._cordons[pending.node]
            if pending.timer is not None:
                pending.timer.cancel()
            log.info("kubectl cordon answered", node=pending.node, ok=ok, reason=message[:200])
            self._on_cordoned(pending.node, ok, message)
            return
        self.forget(pending.node)
        self._release(pending.node, pending.action, pending.digest, ok, message)

    def _release(self, node: str, action: str, digest: str, ok: bool, message: str) -> None:
        if self._live(node) is None:
            log.warning("no release for a revoked node", node=node, action=action)
            return
        env = {GATE_RESULT: GATE_DONE if ok else "failed", GATE_MESSAGE: message[:DRAIN_MESSAGE_CHARS]}
        release = wire.agent.Release(step=action, digest=digest, env=env)
        sent = self._hub.send(node, wire.agent.ControllerMessage(release=release))
        log.info("gate opened", node=node, gate=action, ok=ok, delivered=sent, reason=message[:200])
