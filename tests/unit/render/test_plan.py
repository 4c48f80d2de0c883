"""Plan-level properties: holodeck's order, roles, purity, hashable context, requested values."""

from __future__ import annotations

import builtins
from dataclasses import replace
from typing import Any

import pytest
import yaml

from tests.unit.render import scenarios
from tether.controller.render import NodeContext, render
from tether.controller.render.shell import ShellWord, finalize, q
from tether.controller.render.targets import facts_for
from tether.controller.render.templating import ENV
from tether.controller.spec import load_document

EVERYTHING = scenarios.HEAD + (
    "  kernel: {version: 6.8.0-1015-aws}\n"
    "  nvidiaDriver: {install: true}\n"
    "  containerRuntime: {install: true, name: docker}\n"
    "  nvidiaContainerToolkit: {install: true}\n"
    "  kubernetes: {install: true}\n"
    "  packageRepositories: {apt: [{url: 'http://10.0.0.1/debs', trusted: true}]}\n"
    "  customTemplates:\n"
    "    - {name: post, phase: post-install, inline: 'true'}\n"
    "    - {name: pre, phase: pre-install, inline: 'true'}\n"
    "    - {name: rt, phase: post-runtime, inline: 'true'}\n"
    "    - {name: tk, phase: post-toolkit, inline: 'true'}\n"
    "    - {name: k8s, phase: post-kubernetes, inline: 'true', roles: [control-plane]}\n"
)


def test_holodeck_order() -> None:
    plan = render(load_document(EVERYTHING).spec, NodeContext("control-plane", facts_for("ubuntu-24.04")))
    assert [s.name for s in plan.steps] == [
        "preflight", "package-repositories", "custom-pre", "kernel", "kernel-verify", "nvidia-driver",
        "docker", "cri-dockerd", "custom-rt", "nvidia-container-toolkit", "custom-tk",
        "kubeadm", "kubeadm-init", "calico", "kubernetes-ready", "custom-k8s", "custom-post",
    ]  # fmt: skip


def test_workers_and_roles() -> None:
    plan = render(load_document(EVERYTHING).spec, NodeContext("worker", facts_for("rocky-9", gpu=False)))
    names = [s.name for s in plan.steps]
    assert "kubeadm-init" not in names and "custom-k8s" not in names and "nvidia-driver" not in names
    assert "package-repositories" not in names  # apt repositories only; this is a dnf node


def test_cluster_environments_leave_init_to_orchestration() -> None:
    doc = scenarios.HEAD + "  kubernetes: {install: true}\n  cluster: {controlPlane: {count: 1}}\n"
    plan = render(load_document(doc).spec, NodeContext("control-plane", facts_for("ubuntu-22.04")))
    assert [s.name for s in plan.steps] == ["preflight", "kubeadm"]


def test_render_is_deterministic_and_touches_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_document(EVERYTHING).spec
    node = NodeContext("control-plane", facts_for("ubuntu-22.04"))
    first = render(spec, node)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("render opened a file")

    monkeypatch.setattr(builtins, "open", no_io)
    assert render(spec, node) == first


def test_node_context_is_hashable_and_frozen() -> None:
    node = NodeContext("worker", facts_for("fedora-42"))
    assert hash(node) == hash(NodeContext("worker", facts_for("fedora-42")))
    with pytest.raises(AttributeError):
        node.role = "control-plane"  # type: ignore[misc]


def test_unsupported_nodes_get_one_failing_step() -> None:
    facts = replace(facts_for("ubuntu-22.04"), os_family="unknown", os_pretty="Plan 9")
    plan = render(load_document(EVERYTHING).spec, NodeContext("worker", facts))
    assert [s.name for s in plan.steps] == ["preflight"]
    assert "unsupported OS Plan 9" in plan.steps[0].script and "exit 1" in plan.steps[0].script


def test_microk8s_on_amazon_fails_in_preflight() -> None:
    plan = scenarios.plan_for("microk8s", "amazon-linux-2023")
    assert "die 'microk8s needs snapd" in plan.steps[0].script


def test_every_component_step_says_what_it_was_asked_for() -> None:
    for name, os_key in scenarios.cases():
        for step in scenarios.plan_for(name, os_key).steps:
            assert step.component and step.requested and step.description, (name, step.name)


def test_templates_cannot_emit_unquoted_values() -> None:
    with pytest.raises(TypeError, match="unquoted value"):
        ENV.from_string("echo {{ value }}").render(value="$(id)")
    assert ENV.from_string("echo {{ value | q }}").render(value="$(id)") == "echo '$(id)'"
    assert finalize(q("a b")) == ShellWord("'a b'")


def test_ha_init_advertises_its_own_address_and_signs_the_load_balancer_name() -> None:
    from tether.controller.cluster.context import INIT_STEP, ClusterContext, Position
    from tether.controller.render.components.cluster import ADVERTISE, ENDPOINT

    doc = scenarios.HEAD + (
        "  kubernetes: {install: true}\n"
        "  cluster:\n"
        "    controlPlane: {count: 3}\n"
        "    highAvailability: {enabled: true, endpoint: 'lb.example:6443'}\n"
    )
    ctx = ClusterContext(Position.INIT, upload_certs=True, ha_endpoint="lb.example:6443")
    plan = render(load_document(doc).spec, NodeContext("control-plane", facts_for("ubuntu-22.04"), ctx))
    init = next(s for s in plan.steps if s.name == INIT_STEP)
    docs = {d["kind"]: d for d in yaml.safe_load_all(init.env["TETHER_KUBEADM_CONFIG"])}
    assert docs["InitConfiguration"]["localAPIEndpoint"] == {"advertiseAddress": ADVERTISE}
    cluster = docs["ClusterConfiguration"]
    assert cluster["controlPlaneEndpoint"] == ENDPOINT
    assert cluster["apiServer"]["certSANs"] == ["lb.example", ADVERTISE]
    assert init.env["HA_ENDPOINT"] == "lb.example:6443"
