"""``spec.rollout.drain`` on kubeadm cluster nodes: the disruptive steps (phases kernel, driver,
runtime, toolkit, and every step that reboots) run between a gated ``drain`` step and a gated
``uncordon`` step.

The controller answers both gates (``tether.controller.cluster.drain``): at once while the node is not in
the cluster yet, else after a control plane ran ``kubectl drain`` / ``uncordon`` for it. Both
scripts name the wrapped steps' digests, so they run again exactly when a wrapped step does.
"""

from __future__ import annotations

import re

from tether.controller.cluster.context import DRAIN_GATE, DRAIN_STEP, UNCORDON_GATE, UNCORDON_STEP
from tether.controller.render.shell import Trusted
from tether.controller.render.steps import RenderInput, header
from tether.controller.render.templating import render_template
from tether.nodeagent.model import Step

DISRUPTIVE_PHASES = frozenset({"kernel", "driver", "runtime", "toolkit"})
_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def disruptive(step: Step) -> bool:
    return step.phase in DISRUPTIVE_PHASES or step.reboot


def wrap(inp: RenderInput, steps: list[Step]) -> list[Step]:
    """``steps`` with the drain and uncordon gates around their disruptive part (when asked for)."""
    if not inp.spec.rollout.drain or inp.node.cluster is None:
        return steps
    marks = [i for i, s in enumerate(steps) if disruptive(s)]
    if not marks:
        return steps
    first, last = marks[0], marks[-1]
    wrapped = [_listed(steps[i]) for i in marks]
    drain = _gate_step(inp, DRAIN_STEP, DRAIN_GATE, "drain", steps[first].phase, wrapped)
    uncordon = _gate_step(inp, UNCORDON_STEP, UNCORDON_GATE, "uncordon", steps[last].phase, wrapped)
    return [*steps[:first], drain, *steps[first : last + 1], uncordon, *steps[last + 1 :]]


def _listed(step: Step) -> tuple[Trusted, Trusted]:
    """(name, digest) as they appear in the gate scripts: checked, since they become script text."""
    digest = step.digest or step.compute_digest()
    if not _NAME.fullmatch(step.name) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"a disruptive step has an unexpected name or digest: {step.name!r}")
    return Trusted(step.name), Trusted(digest)


def _gate_step(
    inp: RenderInput,
    name: str,
    gate: str,
    action: str,
    phase: str,
    wrapped: list[tuple[Trusted, Trusted]],
) -> Step:
    body = render_template("drain.j2", {"action": Trusted(action), "wrapped": wrapped})
    names = ", ".join(n for n, _ in wrapped)
    before = action == "drain"
    return Step(
        name=name,
        phase=phase,
        component="drain",
        script=header(inp, name, "drain", phase) + body,
        timeout_seconds=60,
        # Each attempt asks the controller again, which runs kubectl again.
        retries=1 if before else 2,
        gate=gate,
        requested={"gate": gate, "wraps": names},
        description=(
            f"cordons and drains the node (a control plane runs kubectl drain) before {names}"
            if before
            else f"uncordons the node (a control plane runs kubectl uncordon) after {names}"
        ),
    )
