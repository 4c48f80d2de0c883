"""A node's hardware verdict in its record: quarantined (and why), released (by whom, for which
step), and the lines that go to its event history and the metrics.

``NodeRecord.hardware["quarantine"]``: stage, step, digest, problems, expected, found, since_ms.
``NodeRecord.hardware["released"]``: step, digest, by, time_ms, stage: an operator's override of
that step with that digest, used up once the step is done. ``NodeRecord.hardware["accepted"]``:
keys (``gpus.driverVersion`` ...), by, time_ms: what the last release let through, kept for the
drift watch, replaced by the next release and dropped by the next quarantine. Every write is an
atomic patch of these keys (``Store.patch_node_hardware``): the drift watch keeps ``conditions``
beside them.
The callers (``gate.HardwareGate``) hold the node's lock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from tether.controller import metrics, wire
from tether.controller.hardware.expect import BEFORE_JOIN, BEFORE_STEPS, DIAGNOSTICS, Verdict
from tether.controller.hub import Hub
from tether.controller.store import NodeRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import Event, now_ms

log = logs.get_logger("tether.controller.hardware")

STAGE_WORDS = {
    BEFORE_STEPS: "before any step",
    BEFORE_JOIN: "before the cluster join",
    DIAGNOSTICS: "by GPU diagnostics",
}
MAX_PROBLEM_CHARS = 300  # one problem line, or one found value, of a verdict (the node's words)


class Verdicts:
    def __init__(self, store: Store, hub: Hub) -> None:
        self._store = store
        self._hub = hub

    async def quarantine(self, node: NodeRecord, step: str, digest: str, verdict: Verdict) -> None:
        """Record ``verdict`` as the node's quarantine; a new or changed one is announced once."""
        record = {
            "stage": verdict.stage,
            "step": step,
            "digest": digest,
            "problems": [p[:MAX_PROBLEM_CHARS] for p in verdict.problems],
            "expected": verdict.expected,
            "found": {k: str(v)[:MAX_PROBLEM_CHARS] for k, v in verdict.found.items()},
            "since_ms": now_ms(),
        }
        if _same(node.hardware.get("quarantine") or {}, record):
            return  # the same verdict again (a reconnect resent the request): nothing new to say
        await self._store.patch_node_hardware(
            node.name, {"quarantine": record, "released": None, "accepted": None}
        )
        metrics.quarantined(node.environment, verdict.stage)
        self.notice(
            node.name,
            step,
            digest,
            f"quarantined {STAGE_WORDS[verdict.stage]} ({step}): {verdict.summary()}; "
            f"`tetherctl node release {node.name}` lets it go on once",
        )
        log.warning(
            "node quarantined: its hardware does not match spec.hardware",
            node=node.name,
            stage=verdict.stage,
            problems=list(verdict.problems),
        )

    async def lift(self, node: NodeRecord, step: str, digest: str, why: str) -> None:
        await self._store.patch_node_hardware(node.name, {"quarantine": None})
        self.notice(node.name, step, digest, why)
        log.info("quarantine lifted", node=node.name, step=step, why=why)

    async def release(self, node: NodeRecord, by: str) -> str:
        """Replace the quarantine by a release of its step (``by`` the operator); its problems."""
        quarantine = node.hardware["quarantine"]
        released = {
            "step": quarantine.get("step", ""),
            "digest": quarantine.get("digest", ""),
            "stage": quarantine.get("stage", ""),
            "by": by,
            "time_ms": now_ms(),
        }
        # What the operator accepted stays known after the release is used up: the drift watch
        # does not cordon the node for it (a released driver mismatch is not drift).
        accepted = {
            "keys": sorted({str(p).split(":", 1)[0] for p in quarantine.get("problems", ())}),
            "by": by,
            "time_ms": released["time_ms"],
        }
        changes = {"quarantine": None, "released": released, "accepted": accepted}
        await self._store.patch_node_hardware(node.name, changes)
        metrics.released(node.environment)
        log.warning("quarantined node released by an operator", node=node.name, by=by, step=released["step"])
        return "; ".join(str(p) for p in quarantine.get("problems", ()))

    async def done(self, node: NodeRecord, step: str, digest: str) -> None:
        """A hardware step is done: its release is used up; a diagnostics quarantine goes (a new
        plan ran the diagnostics again and they passed)."""
        changes: dict[str, Any] = {}
        released = node.hardware.get("released") or {}
        if released.get("step") == step and released.get("digest") == digest:
            changes["released"] = None
        quarantine = node.hardware.get("quarantine") or {}
        if quarantine.get("step") == step:
            changes["quarantine"] = None
        if changes:
            await self._store.patch_node_hardware(node.name, changes)

    async def forget_stale(self, node: NodeRecord, steps: Collection[tuple[str, str]]) -> None:
        """Drop a quarantine or release for a step (with that digest) the node's plan no longer has."""
        changes: dict[str, Any] = {}
        for key in ("quarantine", "released"):
            held = node.hardware.get(key) or {}
            if held and (held.get("step"), held.get("digest")) not in steps:
                changes[key] = None
        if changes:
            await self._store.patch_node_hardware(node.name, changes)
            if "quarantine" in changes:
                log.info("quarantine of a step the new plan does not have lifted", node=node.name)

    def notice(self, node: str, step: str, digest: str, message: str) -> None:
        """A line in the node's event history (``Notice``); the caller checked it is not revoked."""
        rec = self._store.get_node(node)
        if rec is None or rec.revoked:
            return
        notice = wire.agent.Notice(step=step, digest=digest, message=message)
        self._hub.send(node, wire.agent.ControllerMessage(notice=notice))


def diagnostics_failed(e: Event) -> Verdict:
    """The verdict of a failed ``gpu-diagnostics`` step: its reason from the step's provenance."""
    found = e.observed.get("diagnostics.result") or e.message or f"exit {e.exit_code}"
    return Verdict(
        DIAGNOSTICS,
        expected={"diagnostics": "dcgmi diag passes"},
        found={"diagnostics": found[:MAX_PROBLEM_CHARS]},
        problems=(f"diagnostics: expected dcgmi diag to pass, found {found}",),
    )


def facts_line(verdict: Verdict) -> str:
    """What the gate saw, for the step's output: ``gpus.count=8, gpus.product=NVIDIA H200``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(verdict.found.items())) or "nothing to check"


def _same(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    keys = ("stage", "step", "digest", "problems", "expected", "found")
    return all(before.get(k) == after.get(k) for k in keys)
