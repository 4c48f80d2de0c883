"""HA without an endpoint: the ``apiserver-lb`` step before kubeadm init/join on every node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.tools import system_tool
from tests.unit.render import scenarios
from tests.unit.render.scenarios import facts_for
from tether.controller.cluster.context import (
    INIT_STEP,
    JOIN_STEP,
    LOCAL_LB_BACKENDS,
    LOCAL_LB_ENDPOINT,
    LOCAL_LB_NAME,
    LOCAL_LB_SELF,
    Position,
    cluster_of,
    context_for,
)
from tether.controller.render import NodeContext, render
from tether.controller.render.components.apiserver_lb import STEP
from tether.controller.render.deprovision import cluster_steps
from tether.controller.spec import load_document
from tether.nodeagent import apiserver_lb
from tether.nodeagent.model import Plan

DOC = scenarios.HEAD + (
    "  containerRuntime: {install: true, name: containerd}\n"
    "  kubernetes: {install: true}\n"
    "  cluster:\n"
    "    controlPlane: {count: 3}\n"
    "    workers: {count: 2}\n"
    "    highAvailability: {enabled: true}\n"
)


def plan(position: Position, doc: str = DOC, os_key: str = "ubuntu-22.04") -> Plan:
    spec = load_document(doc).spec
    cluster = cluster_of(spec)
    assert cluster is not None
    role = "worker" if position is Position.WORKER else "control-plane"
    return render(spec, NodeContext(role, facts_for(os_key), context_for(cluster, position)))


@pytest.mark.parametrize("position", list(Position))
def test_every_node_runs_its_load_balancer_right_before_kubeadm(position: Position) -> None:
    names = [s.name for s in plan(position).steps]
    cluster_step = INIT_STEP if position is Position.INIT else JOIN_STEP
    assert names.index(STEP) == names.index(cluster_step) - 1
    lb = next(s for s in plan(position).steps if s.name == STEP)
    assert lb.env["TETHER_APISERVER_LB"] == Path(apiserver_lb.__file__).read_text()  # the proxy, verbatim
    assert LOCAL_LB_BACKENDS in lb.script and f"--hosts-name {LOCAL_LB_NAME}" in lb.script
    # A control plane lists its own API server (kubeadm init reaches itself through the proxy).
    assert ('install_file "$self_file"' in lb.script) is (position is not Position.WORKER)
    assert LOCAL_LB_SELF in lb.script


def test_kubeadm_is_told_the_node_local_endpoint_and_signs_its_name() -> None:
    init = next(s for s in plan(Position.INIT).steps if s.name == INIT_STEP)
    assert init.env["HA_ENDPOINT"] == LOCAL_LB_ENDPOINT == f"{LOCAL_LB_NAME}:7443"
    docs = {d["kind"]: d for d in yaml.safe_load_all(init.env["TETHER_KUBEADM_CONFIG"])}
    assert docs["ClusterConfiguration"]["apiServer"]["certSANs"][0] == LOCAL_LB_NAME


def test_a_cluster_with_an_endpoint_or_without_ha_has_no_load_balancer_step() -> None:
    with_endpoint = DOC.replace("{enabled: true}", "{enabled: true, endpoint: 'lb.example:6443'}")
    without_ha = DOC.replace("    highAvailability: {enabled: true}\n", "")
    for doc in (with_endpoint, without_ha):
        for position in Position:
            assert STEP not in [s.name for s in plan(position, doc).steps]


def test_the_steps_parse_and_pass_shellcheck(tmp_path: Path) -> None:
    paths = []
    for os_key in ("ubuntu-22.04", "rocky-9"):
        for position in Position:
            for step in plan(position, os_key=os_key).steps:
                if step.name in (STEP, INIT_STEP, JOIN_STEP):
                    path = tmp_path / f"{os_key}-{position.value}-{step.name}.sh"
                    path.write_text(step.script)
                    paths.append(str(path))
    reset = tmp_path / "kubeadm-reset.sh"
    reset.write_text(cluster_steps()[1].script)
    paths.append(str(reset))
    for path in paths:
        out = subprocess.run(["bash", "-n", path], capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [system_tool("shellcheck"), "--severity=warning", "--format=gcc", "--shell=bash", *paths],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[:5000]


def test_a_reset_removes_the_load_balancer_after_kubeadm_reset() -> None:
    script = cluster_steps()[1].script
    assert script.index("kubeadm reset -f") < script.index("systemctl disable --now tether-apiserver-lb")
    assert apiserver_lb.HOSTS_MARK in script  # the /etc/hosts line the proxy added goes too
