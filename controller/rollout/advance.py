"""The rollout's decisions, pure: given what the nodes report now, who moves next and what the
rollout's state becomes. No I/O and no clock (``now_ms`` is an argument), so every rule is a
unit test away.

Rules, in order: a running node is done once its plan is at the new generation, every step is
done (and it runs the rollout's agent version) and it stayed so ``minHealthySeconds``; it failed
once a step failed there. More failures than ``maxFailures`` halt the rollout. Control planes
move first and one at a time, the next only while the cluster reports every control plane
healthy; then the workers, at most ``maxParallel`` at once; ``canary`` nodes first, then a pause.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from tether.controller.rollout.state import NodeProgress, NodeStage, Rollout, RolloutStatus
from tether.controller.spec.parse_rollout import resolve_count

GONE = frozenset({"revoked", "gone"})


@dataclass(frozen=True)
class Observed:
    """What a node of the rollout reports now."""

    generation: int  # the generation of its stored plan
    state: str  # tether.controller.nodestate.NodeState value, or "gone" (deleted)
    failed_step: str = ""
    failed_message: str = ""
    agent_ok: bool = True  # runs the version the rollout asks for (or it asks for none)
    rolled_back: bool = False  # its agent went back from the rollout's version by itself


def advance(
    r: Rollout, observed: Mapping[str, Observed], now_ms: int, *, control_planes_healthy: bool = True
) -> tuple[Rollout, list[str]]:
    """The rollout after looking at ``observed``, and the nodes to move to the new generation now."""
    if not r.active:
        return r, []
    nodes = _observe(r, observed, now_ms)
    out = replace(r, nodes=nodes)
    if out.status in (RolloutStatus.PROGRESSING, RolloutStatus.PAUSED):
        out = _halt_on_failures(out, now_ms)
    admitted: list[str] = []
    if out.status is RolloutStatus.PROGRESSING:
        out = _canary_pause(out, now_ms)
    if out.status is RolloutStatus.PROGRESSING:
        admitted = _admit(out, control_planes_healthy)
        if admitted:
            nodes = dict(out.nodes)
            for name in admitted:
                nodes[name] = replace(nodes[name], stage=NodeStage.RUNNING, since_ms=now_ms)
            out = replace(out, nodes=nodes)
    settled = not out.count(NodeStage.PENDING) and not out.count(NodeStage.RUNNING)
    if out.status is not RolloutStatus.HALTED and settled:
        failed = out.count(NodeStage.FAILED)
        out = out.with_status(RolloutStatus.COMPLETE, f"{failed} node(s) failed" if failed else "", now_ms)
    if out != r:
        out = replace(out, updated_ms=now_ms)
    return out, admitted


def _observe(r: Rollout, observed: Mapping[str, Observed], now_ms: int) -> dict[str, NodeProgress]:
    nodes: dict[str, NodeProgress] = {}
    for name, p in r.nodes.items():
        obs = observed.get(name)
        if obs is None or obs.state in GONE:
            continue  # revoked or deleted: no longer part of it
        nodes[name] = _progress(r, p, obs, now_ms)
    return nodes


def _progress(r: Rollout, p: NodeProgress, obs: Observed, now_ms: int) -> NodeProgress:
    if p.stage in (NodeStage.PENDING, NodeStage.UPDATED) or obs.generation != r.generation:
        return p
    if obs.rolled_back:
        return replace(
            p,
            stage=NodeStage.FAILED,
            since_ms=now_ms,
            step="agent-upgrade",
            message=f"the agent rolled back from {r.agent_version}",
        )
    if obs.state == "failed":
        if p.stage is NodeStage.FAILED:
            return p
        return replace(
            p, stage=NodeStage.FAILED, since_ms=now_ms, step=obs.failed_step, message=obs.failed_message
        )
    if obs.state != "provisioned" or not obs.agent_ok:
        return replace(p, healthy_since_ms=0) if p.stage is NodeStage.RUNNING else p
    # Done there (a failed node that was fixed, by a rerun, counts again from here).
    healthy_since = p.healthy_since_ms if p.stage is NodeStage.RUNNING and p.healthy_since_ms else now_ms
    if now_ms - healthy_since >= r.policy.min_healthy_seconds * 1000:
        return replace(p, stage=NodeStage.UPDATED, since_ms=now_ms, healthy_since_ms=healthy_since, step="")
    return replace(p, stage=NodeStage.RUNNING, healthy_since_ms=healthy_since, step="", message="")


def _halt_on_failures(r: Rollout, now_ms: int) -> Rollout:
    failed = r.names(NodeStage.FAILED)
    allowed = resolve_count(r.policy.max_failures, len(r.nodes), default=0, at_least_one=False)
    if len(failed) <= allowed:
        return r
    which = ", ".join(f"{n} ({r.nodes[n].step or 'failed'})" for n in failed[:5])
    more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    return r.with_status(
        RolloutStatus.HALTED,
        f"{len(failed)} node(s) failed, more than maxFailures allows ({allowed}): {which}{more}",
        now_ms,
    )


def _moved(r: Rollout) -> int:
    """Nodes the rollout moved as part of a batch (not those whose plan did not change)."""
    return sum(1 for p in r.nodes.values() if p.stage is not NodeStage.PENDING and not p.unchanged)


def _canary_pause(r: Rollout, now_ms: int) -> Rollout:
    canary = r.policy.canary
    if not canary or r.canary_done or r.count(NodeStage.RUNNING) or not r.count(NodeStage.PENDING):
        return r
    if _moved(r) < canary:
        return r
    updated = sum(1 for p in r.nodes.values() if p.stage is NodeStage.UPDATED and not p.unchanged)
    paused = r.with_status(
        RolloutStatus.PAUSED,
        f"canary: {updated} node(s) updated; run 'tetherctl rollout resume --env {r.environment}' to go on",
        now_ms,
    )
    return replace(paused, canary_done=True)


def _admit(r: Rollout, control_planes_healthy: bool) -> list[str]:
    total = len(r.nodes)
    slots = resolve_count(r.policy.max_parallel, total, default=total, at_least_one=True)
    slots -= r.count(NodeStage.RUNNING)
    if r.policy.canary and not r.canary_done:
        slots = min(slots, r.policy.canary - _moved(r))
    if slots <= 0:
        return []
    pending = r.names(NodeStage.PENDING)
    planes = [n for n in pending if r.nodes[n].control_plane]
    if planes or any(p.control_plane and p.stage is NodeStage.RUNNING for p in r.nodes.values()):
        # Control planes first, one at a time, each only while all of them are healthy.
        running_plane = any(p.control_plane and p.stage is NodeStage.RUNNING for p in r.nodes.values())
        return planes[:1] if planes and not running_plane and control_planes_healthy else []
    return pending[:slots]
