"""A node's state as operators see it, derived from its steps and its stream."""

from __future__ import annotations

import enum
from collections.abc import Sequence

from tether.controller.store.records import NodeRecord, StepRecord

DONE_STATES = frozenset({"succeeded", "skipped"})


class NodeState(str, enum.Enum):
    PROVISIONING = "provisioning"
    PROVISIONED = "provisioned"
    FAILED = "failed"
    QUARANTINED = "quarantined"  # its hardware does not match spec.hardware: no step runs
    OFFLINE = "offline"
    REVOKED = "revoked"


def failing_step(steps: Sequence[StepRecord]) -> StepRecord | None:
    """The first failed step that fails the node (one with continue-on-error does not)."""
    return next((s for s in steps if s.state == "failed" and not s.continue_on_error), None)


def failure_text(step: StepRecord) -> str:
    """Why ``step`` failed, in a few words: its message, else its exit code."""
    return step.message or f"exit {step.exit_code}"


def node_state(node: NodeRecord, steps: Sequence[StepRecord], connected: bool) -> NodeState:
    if node.revoked:
        return NodeState.REVOKED
    if node.hardware.get("quarantine"):
        return NodeState.QUARANTINED
    if not connected:
        return NodeState.OFFLINE
    if not node.plan_digest:
        return NodeState.PROVISIONING  # no plan delivered yet
    if failing_step(steps) is not None:
        return NodeState.FAILED
    if all(s.state in DONE_STATES or (s.state == "failed" and s.continue_on_error) for s in steps):
        return NodeState.PROVISIONED
    return NodeState.PROVISIONING
