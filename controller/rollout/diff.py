"""What a document would change on a node: its steps added, changed (another digest) or removed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tether.nodeagent.model import Plan

ADDED, CHANGED, REMOVED = "added", "changed", "removed"


@dataclass(frozen=True)
class StepChange:
    name: str
    change: str  # added | changed | removed


def step_changes(current: Iterable[tuple[str, str]], new: Plan) -> list[StepChange]:
    """``current`` is the node's steps as (name, digest), in order; the result follows the new
    plan's order, then the removed steps in their old order."""
    have = dict(current)
    changes = [
        StepChange(s.name, ADDED if s.name not in have else CHANGED)
        for s in new.steps
        if have.get(s.name) != s.digest
    ]
    names = {s.name for s in new.steps}
    changes.extend(StepChange(name, REMOVED) for name in have if name not in names)
    return changes
