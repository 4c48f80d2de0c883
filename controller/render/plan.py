"""``render(spec, node) -> Plan``: pure, no I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from controller.spec.model import PHASES, EnvironmentSpec
from nodeagent.model import HostFacts, Plan, Step

CUSTOM_PREAMBLE = "#!/usr/bin/env bash\n# tether custom template {name} (phase {phase})\nset -e\n"


@dataclass(frozen=True)
class NodeContext:
    """Everything about the target node that rendering may depend on (and nothing else)."""

    role: str
    facts: HostFacts


def render(spec: EnvironmentSpec, node: NodeContext) -> Plan:
    steps: list[Step] = []
    for phase in PHASES:
        for t in spec.custom_templates:
            if t.phase != phase:
                continue
            steps.append(
                Step(
                    name=f"custom-{t.name}",
                    phase=phase,
                    component="custom",
                    script=CUSTOM_PREAMBLE.format(name=t.name, phase=phase) + t.inline.rstrip("\n") + "\n",
                    env=dict(t.env),
                    timeout_seconds=t.timeout_seconds,
                    continue_on_error=t.continue_on_error,
                )
            )
    return Plan.build(steps, environment=spec.name, role=node.role)
