"""The hardware gate: a node whose hardware does not match ``spec.hardware`` is quarantined.

With ``spec.hardware`` a plan starts with the gated ``hardware-check`` step and has
``hardware-verify`` (gated) and, with diagnostics, ``gpu-diagnostics`` before its cluster join
(``tether.controller.render.components.hardware``). This gate keeper answers those gates and
stands in front of the cluster's: the join material is released only to a node that is not
quarantined and whose hardware steps of its current plan are done. A join request that comes too
early (a reconnect sends gate requests before the events that finish those steps) is held and
handed on once they are.

A mismatch, or a failed ``gpu-diagnostics`` step, quarantines the node (``quarantine.Verdicts``).
Each node's decisions run one at a time (a lock per node), and every hand-out checks revocation
right before it is sent. Nothing is held in memory that a restart would lose: agents send their
gate requests again on every stream.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping, Sequence

from tether.controller import wire
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP
from tether.controller.errors import FailedPrecondition
from tether.controller.gates import GateKeeper
from tether.controller.hardware.expect import STAGES, Verdict, check
from tether.controller.hardware.names import (
    DIAGNOSTICS_STEP,
    HARDWARE_STEPS,
    RESULT_ENV,
    SUMMARY_ENV,
    VERIFY_STEP,
)
from tether.controller.hardware.quarantine import Verdicts, diagnostics_failed, facts_line
from tether.controller.hub import Hub
from tether.controller.spec.model import EnvironmentSpec
from tether.controller.store import NodeRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import Event, EventKind, HostFacts, Plan, facts_from_dict, now_ms

log = logs.get_logger("tether.controller.hardware")

JOIN_STEPS = frozenset({INIT_STEP, JOIN_STEP})  # kubeadm-init has no gate today; kept in case
DONE = frozenset({"succeeded", "skipped"})  # skipped: done before with the same digest

SpecOf = Callable[[NodeRecord], EnvironmentSpec | None]


class HardwareGate:
    """The gate keeper agents talk to (``GateKeeper``, with the node's facts): hardware steps are
    answered here; the join goes to ``inner`` once the hardware steps allow it."""

    def __init__(self, store: Store, hub: Hub, inner: GateKeeper, spec_of: SpecOf) -> None:
        self._store = store
        self._hub = hub
        self._inner = inner
        self._spec_of = spec_of
        self._verdicts = Verdicts(store, hub)
        # One decision at a time per node; a lock nobody holds or waits for goes away by itself.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._held: dict[str, tuple[str, str, int]] = {}  # node -> join (step, digest, attempt)

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    # -- GateKeeper -----------------------------------------------------------------------------

    async def gate_requested(
        self, node: NodeRecord, step: str, digest: str, attempt: int = 1, facts: HostFacts | None = None
    ) -> None:
        if step in JOIN_STEPS:
            await self._join(node, step, digest, attempt)
        elif step in HARDWARE_STEPS:
            async with self._lock(node.name):
                await self._answer(node.name, step, digest, facts)
        else:
            await self._inner.gate_requested(node, step, digest, attempt)

    async def secrets_received(
        self,
        node: NodeRecord,
        step: str,
        values: Mapping[str, str],
        command_id: str,
        outputs: Mapping[str, str] | None = None,
    ) -> bool:
        return await self._inner.secrets_received(node, step, values, command_id, outputs)

    # -- the hardware steps -----------------------------------------------------------------------

    async def _answer(self, name: str, step: str, digest: str, facts: HostFacts | None) -> None:
        current = self._live(name)
        if current is None or not any(
            s.name == step and s.digest == digest for s in self._store.node_steps(name)
        ):
            log.warning(
                "hardware gate request for a step this node's plan does not have", node=name, step=step
            )
            return
        if step == DIAGNOSTICS_STEP:
            self._open(name, step, digest, "overridden" if _released(current, step, digest) else "run", "")
            return
        spec = self._spec_of(current)
        hardware = spec.hardware if spec is not None else None
        if hardware is None:  # the spec says nothing (any more): nothing to hold the node for
            self._open(name, step, digest, "ok", "spec.hardware is gone")
            return
        seen = facts if facts is not None else facts_from_dict(current.facts)
        assert spec is not None
        verdict = check(hardware, seen, STAGES[step], driver=spec.driver.install)
        await self._decide(current, step, digest, verdict)

    async def _decide(self, node: NodeRecord, step: str, digest: str, verdict: Verdict) -> None:
        if verdict.ok:
            if node.hardware.get("quarantine"):
                await self._verdicts.lift(
                    node, step, digest, f"hardware now matches spec.hardware ({step}); going on"
                )
            self._open(node.name, step, digest, "ok", facts_line(verdict))
        elif _released(node, step, digest):
            by = node.hardware.get("released", {}).get("by", "?")
            self._verdicts.notice(node.name, step, digest, f"released by {by} despite: {verdict.summary()}")
            self._open(node.name, step, digest, "overridden", verdict.summary())
        else:
            await self._verdicts.quarantine(node, step, digest, verdict)

    # -- the join -------------------------------------------------------------------------------

    async def _join(self, node: NodeRecord, step: str, digest: str, attempt: int) -> None:
        """Hand the join on when the hardware steps allow it; else hold it until they do."""
        if self._may_join(node.name):
            self._held.pop(node.name, None)
            await self._inner.gate_requested(node, step, digest, attempt)
        else:
            self._held[node.name] = (step, digest, attempt)

    async def _join_held(self, name: str) -> None:
        held = self._held.get(name)
        current = self._live(name)
        if held is None or current is None or not self._may_join(name):
            return
        del self._held[name]
        await self._inner.gate_requested(current, *held)

    def _may_join(self, name: str) -> bool:
        """Not quarantined, and the hardware steps before the join (of its current plan) done."""
        current = self._live(name)
        if current is None:
            return False
        if current.hardware.get("quarantine"):
            log.info("a quarantined node's join waits", node=name)
            return False
        pending = [
            s.name
            for s in self._store.node_steps(name)
            if s.name in (VERIFY_STEP, DIAGNOSTICS_STEP) and s.state not in DONE
        ]
        if pending:
            log.info("the join waits for the hardware steps", node=name, steps=pending)
        return not pending

    # -- what the node reports, what the operator does ------------------------------------------

    async def on_plan(self, node: NodeRecord, plan: Plan) -> None:
        """A new plan: a quarantine or release for a step it no longer has (that digest) goes."""
        async with self._lock(node.name):
            current = self._live(node.name)
            if current is not None:
                await self._verdicts.forget_stale(current, {(s.name, s.digest) for s in plan.steps})

    async def on_events(self, node: NodeRecord, events: Sequence[Event]) -> None:
        """Hardware step results: failed diagnostics quarantine; a step done uses up its release,
        lifts a diagnostics quarantine and may let a held join go on."""
        mine = [
            e
            for e in events
            if e.step in HARDWARE_STEPS
            and e.kind in (EventKind.SUCCEEDED, EventKind.SKIPPED, EventKind.FAILED)
        ]
        if not mine:
            return
        async with self._lock(node.name):
            for e in mine:
                current = self._live(node.name)
                if current is None:
                    return
                if e.kind is EventKind.FAILED:
                    if e.step == DIAGNOSTICS_STEP and not e.will_retry:
                        await self._verdicts.quarantine(current, e.step, e.digest, diagnostics_failed(e))
                else:
                    await self._verdicts.done(current, e.step, e.digest)
        await self._join_held(node.name)

    async def release(self, node: NodeRecord, by: str) -> None:
        """Let a quarantined node go on once (FailedPrecondition when it is not quarantined)."""
        async with self._lock(node.name):
            current = await self._quarantined(node.name)
            quarantine = current.hardware.get("quarantine") if current is not None else None
            if current is None or not quarantine:
                raise FailedPrecondition(f"node {node.name!r} is not quarantined")
            step, digest = str(quarantine.get("step", "")), str(quarantine.get("digest", ""))
            rerun = step == DIAGNOSTICS_STEP
            if rerun and not self._hub.connected(node.name):
                raise FailedPrecondition(
                    f"node {node.name!r} is not connected: its failed diagnostics can only be passed "
                    "over while it is"
                )
            problems = await self._verdicts.release(current, by)
            if rerun:  # the failed step runs again; its gate then opens with "overridden"
                self._verdicts.notice(
                    node.name, step, digest, f"released by {by}: gpu-diagnostics runs again, not checked"
                )
                await self._store.reset_steps(node.name, [step])
                command = wire.agent.Command(id=f"rerun-{now_ms()}", rerun=wire.agent.Rerun(steps=[step]))
                if self._live(node.name) is not None:
                    self._hub.send(node.name, wire.agent.ControllerMessage(command=command))
            elif self._hub.connected(node.name):  # it waits at the gate: open it now
                self._verdicts.notice(node.name, step, digest, f"released by {by} despite: {problems}")
                self._open(node.name, step, digest, "overridden", problems)
            # Offline, it asks again when it reconnects, and the gate opens then (``_decide``).

    # -- helpers --------------------------------------------------------------------------------

    async def _quarantined(self, name: str) -> NodeRecord | None:
        """The node's live record; a ``gpu-diagnostics`` failure whose events were stored but never
        judged (the controller stopped in between) is judged now, so it can be released."""
        current = self._live(name)
        if current is None or current.hardware.get("quarantine"):
            return current
        failed = next(
            (s for s in self._store.node_steps(name) if s.name == DIAGNOSTICS_STEP and s.state == "failed"),
            None,
        )
        if failed is not None:
            found = failed.observed.get("diagnostics.result") or failed.message or f"exit {failed.exit_code}"
            event = Event(kind=EventKind.FAILED, step=failed.name, digest=failed.digest, message=found)
            await self._verdicts.quarantine(current, failed.name, failed.digest, diagnostics_failed(event))
            current = self._live(name)
        return current

    def _live(self, name: str) -> NodeRecord | None:
        rec = self._store.get_node(name)
        return rec if rec is not None and not rec.revoked else None

    def _open(self, name: str, step: str, digest: str, result: str, summary: str) -> None:
        if self._live(name) is None:  # checked right before the hand-out: revoked meanwhile
            log.warning("no hardware release for a revoked node", node=name)
            return
        release = wire.agent.Release(step=step, digest=digest, env={RESULT_ENV: result, SUMMARY_ENV: summary})
        if self._hub.send(name, wire.agent.ControllerMessage(release=release)):
            log.info("hardware gate opened", node=name, step=step, result=result)


def _released(node: NodeRecord, step: str, digest: str) -> bool:
    released = node.hardware.get("released") or {}
    return bool(released) and released.get("step") == step and released.get("digest") == digest
