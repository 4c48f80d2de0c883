"""tetherctl plan --env --cluster-position: the controller previews a cluster position's plan
(cluster steps, drain gates) as a real node there would get it; a position needs a cluster."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.harness import Controller

DOC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {name: preview}
spec:
  containerRuntime: {install: true}
  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}
  cluster:
    controlPlane: {count: 3}
    highAvailability: {enabled: true, endpoint: lb.example}
    workers: {count: 2}
  rollout: {drain: true}
"""


def _names(controller: Controller, *args: str) -> list[tuple[str, str]]:
    plan = json.loads(controller.ctl("plan", "--env", "preview", "-o", "json", *args).stdout)
    return [(s["name"], s.get("gate", "")) for s in plan["steps"]]


def test_plan_previews_each_cluster_position(controller: Controller, tmp_path: Path) -> None:
    (tmp_path / "preview.yaml").write_text(DOC)
    controller.ctl("env", "apply", "-f", str(tmp_path / "preview.yaml"))
    assert _names(controller) == [("preflight", ""), ("containerd", ""), ("kubeadm", "")]
    worker = _names(controller, "--cluster-position", "worker")
    assert worker == [
        ("preflight", ""),
        ("drain", "cluster-drain"),
        ("containerd", ""),
        ("uncordon", "cluster-uncordon"),
        ("kubeadm", ""),
        ("kubeadm-join", "cluster-join"),
    ]
    init = dict(_names(controller, "--cluster-position", "init"))
    assert "kubeadm-init" in init and "kubeadm-join" not in init and "drain" in init
    text = controller.ctl("plan", "--env", "preview", "--cluster-position", "init").stdout
    assert "role control-plane" in text and "lb.example:6443" in text  # the HA endpoint, with its port
    cp = controller.ctl("plan", "--env", "preview", "--cluster-position", "control-plane").stdout
    assert "kubeadm-join" in cp and "<secret, delivered just in time>" in cp


def test_a_position_needs_a_kubeadm_cluster(controller: Controller, tmp_path: Path) -> None:
    # Without spec.cluster, kubeadm makes a single node a cluster of one: its positions preview too.
    (tmp_path / "plain.yaml").write_text(DOC.replace("name: preview", "name: plain").split("  cluster:")[0])
    controller.ctl("env", "apply", "-f", str(tmp_path / "plain.yaml"))
    plan = json.loads(
        controller.ctl("plan", "--env", "plain", "-o", "json", "--cluster-position", "init").stdout
    )
    assert [s["name"] for s in plan["steps"]][-3:] == ["kubeadm-init", "calico", "kubernetes-ready"]
    plan = json.loads(
        controller.ctl("plan", "--env", "plain", "-o", "json", "--cluster-position", "worker").stdout
    )
    assert [s["name"] for s in plan["steps"]][-1] == "kubeadm-join"
    kind = DOC.replace("name: preview", "name: kind").split("  cluster:")[0]
    kind = kind.replace(
        "containerRuntime: {install: true}", "containerRuntime: {install: true, name: docker}"
    )
    (tmp_path / "kind.yaml").write_text(kind.replace("installer: kubeadm", "installer: kind"))
    controller.ctl("env", "apply", "-f", str(tmp_path / "kind.yaml"))
    out = controller.ctl("plan", "--env", "kind", "--cluster-position", "worker", check=False)
    assert out.returncode != 0 and "needs Kubernetes installed by kubeadm" in out.stderr
    out = controller.ctl("plan", "--node", "n1", "--cluster-position", "worker", check=False)
    assert out.returncode != 0 and "previews an environment" in out.stderr
