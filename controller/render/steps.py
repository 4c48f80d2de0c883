"""Turning one component template into a ``Step``: header, shared library, body."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.controller.render.context import NodeContext, Target
from tether.controller.render.shell import q
from tether.controller.render.templating import render_template
from tether.controller.spec.model import EnvironmentSpec
from tether.nodeagent.model import Step

HEADER = (
    "#!/usr/bin/env bash\n"
    "# tether step {name}: component {component}, phase {phase}, for {family}/{arch}.\n"
    "# Rendered by the tether controller; the agent runs it as root and streams its output.\n"
)


@dataclass(frozen=True)
class RenderInput:
    """The spec, the node, and what rendering derived from the node."""

    spec: EnvironmentSpec
    node: NodeContext
    target: Target

    @property
    def gpu(self) -> bool:
        return self.node.facts.nvidia_gpu

    @property
    def repositories(self) -> bool:
        """True when the spec's package repositories replace the upstream ones on this node."""
        return bool(self.spec.package_repositories.for_manager(self.target.pm))

    def base_context(self) -> dict[str, Any]:
        return {
            **self.target.context(),
            "mirror": self.spec.download_mirror,
            "upstream": not self.repositories,
        }


def library(inp: RenderInput) -> str:
    """The shared preamble every step starts with (after its header)."""
    return render_template("lib.sh.j2", inp.base_context())


def header(inp: RenderInput, name: str, component: str, phase: str) -> str:
    return HEADER.format(
        name=name, component=component, phase=phase, family=inp.target.family, arch=inp.target.arch
    )


def make_step(
    inp: RenderInput,
    *,
    name: str,
    component: str,
    phase: str,
    template: str,
    timeout: int,
    requested: Mapping[str, str],
    description: str,
    env: Mapping[str, str] | None = None,
    reboot: bool = False,
    continue_on_error: bool = False,
    context: Mapping[str, Any] | None = None,
) -> Step:
    body = render_template(template, {**inp.base_context(), **(context or {})})
    return Step(
        name=name,
        phase=phase,
        component=component,
        script=header(inp, name, component, phase) + library(inp) + "\n" + body,
        timeout_seconds=timeout,
        env=dict(env or {}),
        reboot=reboot,
        continue_on_error=continue_on_error,
        requested=dict(requested),
        description=description,
    )


def unsupported(reason: str) -> Step:
    """The one-step plan for a node tether cannot provision: it fails at once, saying why."""
    return Step(
        name="preflight",
        phase="pre-install",
        component="tether",
        script=f"#!/usr/bin/env bash\nprintf 'ERROR: %s\\n' {q(reason)} >&2\nexit 1\n",
        timeout_seconds=60,
        description="this node cannot be provisioned",
    )
