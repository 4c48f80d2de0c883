"""``spec.hardware``: the hardware gate's steps around a plan.

``hardware-check`` comes first (gated: the controller compares what the node has without a driver
with the spec). Before the cluster join (``kubeadm-init``/``kubeadm-join``), or at the end of a
plan without one, come ``hardware-verify`` (gated: everything, with the driver) and, with
``diagnostics``, ``gpu-diagnostics`` (``dcgmi diag``). The controller's side is
``tether.controller.hardware.gate``. The expectation is in each step's environment, so a changed
``spec.hardware`` checks again.
"""

from __future__ import annotations

from dataclasses import replace

from tether.controller.cluster.context import INIT_STEP, JOIN_STEP
from tether.controller.hardware.names import CHECK_STEP, DIAGNOSTICS_STEP, HARDWARE_GATE, VERIFY_STEP
from tether.controller.render.shell import Trusted
from tether.controller.render.steps import RenderInput, make_step
from tether.controller.spec.model import HardwareSpec
from tether.nodeagent.model import Step

DIAGNOSTIC_LEVELS = {"short": Trusted("1"), "long": Trusted("2")}
DIAGNOSTIC_TIMEOUTS = {"short": 900, "long": 3600}
JOINS = frozenset({INIT_STEP, JOIN_STEP})


def expected(spec: HardwareSpec, *, with_driver: bool) -> dict[str, str]:
    """The expectation as ``key: value`` (the keys the gate's verdicts use)."""
    out: dict[str, str] = {}
    gpus = spec.gpus
    if gpus is not None:
        out["gpus.count"] = str(gpus.count)
        if gpus.product:
            out["gpus.product"] = gpus.product
        if gpus.memory_mib:
            out["gpus.memoryMiB"] = str(gpus.memory_mib)
        if gpus.driver_version and with_driver:
            out["gpus.driverVersion"] = gpus.driver_version
    if spec.cpus_min:
        out["cpus.min"] = str(spec.cpus_min)
    if spec.memory_gib_min:
        out["memoryGiB.min"] = str(spec.memory_gib_min)
    return out


def wrap(inp: RenderInput, steps: list[Step]) -> list[Step]:
    """``steps`` with the hardware steps around them (when the spec has ``hardware``)."""
    spec = inp.spec.hardware
    if spec is None:
        return steps
    at = next((i for i, s in enumerate(steps) if s.name in JOINS), len(steps))
    phase = "kubernetes" if at < len(steps) else "post-install"
    before_join = [_gate_step(inp, spec, VERIFY_STEP, phase)]
    if spec.gpus is not None and spec.gpus.diagnostics:
        before_join.append(_diagnostics(inp, spec.gpus.diagnostics, phase))
    return [_gate_step(inp, spec, CHECK_STEP, "pre-install"), *steps[:at], *before_join, *steps[at:]]


def _gate_step(inp: RenderInput, spec: HardwareSpec, name: str, phase: str) -> Step:
    first = name == CHECK_STEP
    want = expected(spec, with_driver=not first)
    line = ", ".join(f"{k}={v}" for k, v in want.items())
    step = make_step(
        inp,
        name=name,
        component="hardware",
        phase=phase,
        template="hardware_gate.j2",
        timeout=60,
        requested=want,
        env={"TETHER_HARDWARE_EXPECTED": line},
        description=(
            "the controller checks the node's hardware (PCI bus, CPUs, memory) against spec.hardware"
            if first
            else "the controller checks the node's hardware, driver included, before the cluster join"
        ),
    )
    return _gated(step)


def _diagnostics(inp: RenderInput, level: str, phase: str) -> Step:
    step = make_step(
        inp,
        name=DIAGNOSTICS_STEP,
        component="hardware",
        phase=phase,
        template="gpu_diagnostics.j2",
        timeout=DIAGNOSTIC_TIMEOUTS[level],
        requested={"diagnostics": level},
        description=f"NVIDIA DCGM diagnostics (dcgmi diag -r {DIAGNOSTIC_LEVELS[level]}) must pass",
        context={"level": DIAGNOSTIC_LEVELS[level]},
    )
    return _gated(step)


def _gated(step: Step) -> Step:
    return replace(step, gate=HARDWARE_GATE)
