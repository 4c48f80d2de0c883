"""spec.hardware's steps: hardware-check first, hardware-verify and gpu-diagnostics before the join."""

from __future__ import annotations

from tether.controller.cluster.context import Position, cluster_of, context_for
from tether.controller.render import NodeContext, render
from tether.controller.spec import load_document
from tether.nodeagent.model import HostFacts

UBUNTU = HostFacts(os_id="ubuntu", os_version_id="22.04", os_family="debian", arch="amd64")
CLUSTER = """\
apiVersion: tether.dev/v1alpha1
kind: Environment
metadata: {name: gpus}
spec:
  containerRuntime: {install: true, name: containerd}
  kubernetes: {install: true, installer: kubeadm, version: v1.31.1}
  cluster: {controlPlane: {count: 1}, workers: {count: 1}}
"""
HARDWARE = "  hardware:\n    gpus: {count: 8, product: H200, driverVersion: '570.'%s}\n"


def names(doc: str, position: Position | None = Position.WORKER) -> list[str]:
    spec = load_document(doc).spec
    cluster = context_for(cluster_of(spec), position) if position is not None else None
    plan = render(spec, NodeContext(role="worker", facts=UBUNTU, cluster=cluster))
    return [s.name for s in plan.steps]


def test_no_hardware_no_hardware_steps() -> None:
    assert not {"hardware-check", "hardware-verify", "gpu-diagnostics"} & set(names(CLUSTER))


def test_check_first_verify_and_diagnostics_right_before_the_join() -> None:
    got = names(CLUSTER + HARDWARE % ", diagnostics: short")
    assert got[0] == "hardware-check"
    join = got.index("kubeadm-join")
    assert got[join - 2 : join] == ["hardware-verify", "gpu-diagnostics"]


def test_the_init_node_verifies_before_kubeadm_init() -> None:
    got = names(CLUSTER + HARDWARE % "", Position.INIT)
    assert got.index("hardware-verify") == got.index("kubeadm-init") - 1


def test_without_a_cluster_the_verify_step_comes_last() -> None:
    doc = "apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata: {name: g}\nspec:\n" + HARDWARE % ""
    got = names(doc, None)
    assert got[0] == "hardware-check" and got[-1] == "hardware-verify"


def test_hardware_steps_are_gated_and_a_changed_expectation_changes_their_digest() -> None:
    def steps(doc: str) -> dict[str, tuple[str, str]]:
        spec = load_document(doc).spec
        cluster = context_for(cluster_of(spec), Position.WORKER)
        plan = render(spec, NodeContext(role="worker", facts=UBUNTU, cluster=cluster))
        return {s.name: (s.gate, s.digest) for s in plan.steps}

    a = steps(CLUSTER + HARDWARE % ", diagnostics: short")
    b = steps(CLUSTER + (HARDWARE % ", diagnostics: short").replace("count: 8", "count: 4"))
    for name in ("hardware-check", "hardware-verify", "gpu-diagnostics"):
        assert a[name][0] == "hardware"
    assert a["hardware-check"][1] != b["hardware-check"][1]
    assert a["hardware-verify"][1] != b["hardware-verify"][1]
    assert a["gpu-diagnostics"][1] == b["gpu-diagnostics"][1]  # it does not depend on the count
    assert a["containerd"][1] == b["containerd"][1]


def test_diagnostics_level_and_missing_dcgm_is_a_failure() -> None:
    spec = load_document(CLUSTER + HARDWARE % ", diagnostics: long").spec
    cluster = context_for(cluster_of(spec), Position.WORKER)
    plan = render(spec, NodeContext(role="worker", facts=UBUNTU, cluster=cluster))
    diag = next(s for s in plan.steps if s.name == "gpu-diagnostics")
    assert "level=2" in diag.script
    assert "dcgmi is not installed" in diag.script and "exit 0" in diag.script  # only when overridden
