"""The durable record of one environment's rollout (JSON in the store's key/value table)."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, replace

from tether.controller.spec.model import RolloutPolicy


class RolloutStatus(str, enum.Enum):
    PROGRESSING = "progressing"
    PAUSED = "paused"
    HALTED = "halted"  # too many failures, or aborted: nothing more is admitted
    COMPLETE = "complete"


class NodeStage(str, enum.Enum):
    PENDING = "pending"  # still on its old generation
    RUNNING = "running"  # has the new plan, not done yet
    UPDATED = "updated"  # done on the new generation (and stayed healthy long enough)
    FAILED = "failed"


@dataclass(frozen=True)
class NodeProgress:
    stage: NodeStage
    from_generation: int  # the generation it had when the rollout began (what pending means)
    control_plane: bool = False
    since_ms: int = 0  # when it entered this stage
    healthy_since_ms: int = 0  # running: first seen done (0: not yet)
    step: str = ""  # failed: the step
    message: str = ""
    unchanged: bool = False  # its plan did not change: moved at once, not counted as a batch


@dataclass(frozen=True)
class Rollout:
    environment: str
    generation: int
    from_generation: int
    policy: RolloutPolicy
    status: RolloutStatus = RolloutStatus.PROGRESSING
    reason: str = ""
    started_ms: int = 0
    updated_ms: int = 0
    canary_done: bool = False
    agent_version: str = ""
    from_agent_version: str = ""  # what most nodes ran before (an undo of an upgrade goes back to it)
    nodes: dict[str, NodeProgress] = field(default_factory=dict)

    def count(self, stage: NodeStage) -> int:
        return sum(1 for p in self.nodes.values() if p.stage is stage)

    def names(self, stage: NodeStage) -> list[str]:
        return sorted(n for n, p in self.nodes.items() if p.stage is stage)

    @property
    def active(self) -> bool:
        return self.status is not RolloutStatus.COMPLETE

    def generation_for(self, node: str) -> int:
        """The generation ``node`` should run now: its old one while pending, else this one."""
        progress = self.nodes.get(node)
        if progress is None or not self.active or progress.stage is not NodeStage.PENDING:
            return self.generation
        return progress.from_generation

    def with_status(self, status: RolloutStatus, reason: str, now: int) -> Rollout:
        return replace(self, status=status, reason=reason, updated_ms=now)

    def dumps(self) -> bytes:
        doc = asdict(self)
        doc["status"] = self.status.value
        doc["nodes"] = {n: {**asdict(p), "stage": p.stage.value} for n, p in self.nodes.items()}
        return json.dumps(doc, sort_keys=True).encode()

    @staticmethod
    def loads(raw: bytes) -> Rollout:
        doc = json.loads(raw)
        nodes = {
            n: NodeProgress(**{**p, "stage": NodeStage(p["stage"])}) for n, p in doc.pop("nodes").items()
        }
        return Rollout(
            **{
                **doc,
                "policy": RolloutPolicy(**doc["policy"]),
                "status": RolloutStatus(doc["status"]),
                "nodes": nodes,
            }
        )
