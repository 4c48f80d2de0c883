"""Gates and step secrets: the hooks cluster orchestration plugs into.

An agent that reaches a gated step sends a GateRequest; the gate keeper
answers with a Release (now, or when the gate opens). Secret step outputs
(join material) arrive as StepSecrets. Without cluster orchestration there
are no gates, so requests just wait and secrets are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tether.controller.store.records import NodeRecord
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.gates")


class GateKeeper(Protocol):
    async def gate_requested(self, node: NodeRecord, step: str, digest: str, attempt: int = 1) -> None: ...

    async def secrets_received(
        self,
        node: NodeRecord,
        step: str,
        values: Mapping[str, str],
        command_id: str,
        outputs: Mapping[str, str] | None = None,
    ) -> bool: ...


class NoGates:
    async def gate_requested(self, node: NodeRecord, step: str, digest: str, attempt: int = 1) -> None:
        log.warning(
            "gate requested but no gate keeper knows it; the step keeps waiting", node=node.name, step=step
        )

    async def secrets_received(
        self,
        node: NodeRecord,
        step: str,
        values: Mapping[str, str],
        command_id: str,
        outputs: Mapping[str, str] | None = None,
    ) -> bool:
        log.warning(
            "secret step outputs received but nothing expects them; dropped",
            node=node.name,
            step=step,
            keys=sorted(values),
        )
        return True
