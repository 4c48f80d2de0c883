"""Issue 14 on a real systemd node: a single-node kubeadm environment (no spec.cluster) is a cluster of
one. A real controller on the testbed bridge, ``tetherctl bootstrap`` over SSH, the stand-in kubeadm.

Proven here: the node reaches provisioned with kubeadm-init, Calico and holodeck's kubernetes-ready
(untainted, labelled); ``tetherctl cluster health`` reports the cluster Available; ``tetherctl cluster
kubeconfig`` writes the file holodeck's ``kubernetes.kubeConfig`` names (relative to the working
directory, mode 0600, never replaced silently) and that kubeconfig works from outside the node (the
stand-in kubectl, run on the host, verifies the API server against the kubeconfig's CA);
``kubernetes.remoteAccess`` puts the node's names into the API server certificate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_cluster import Lab
from tests.e2e.testbed.testbed import Testbed
from tests.integration.harness import BIN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STANDINS = Path(__file__).parent / "testbed" / "standins"
KUBECONFIG_PATH = "kubeconfigs/single.yaml"


def single_node_environment(bed: Testbed, name: str) -> str:
    desc = bed.describe()
    with urllib.request.urlopen(desc["apt_repo_key_url"], timeout=10) as reply:
        key = reply.read().decode()
    doc = {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": name},
        "spec": {
            "packageRepositories": {"apt": [{"url": desc["apt_repo_url"], "key": key}]},
            "downloadMirror": desc["download_mirror_url"],
            "containerRuntime": {"install": True, "name": "containerd", "package": {"name": "containerd"}},
            "kubernetes": {
                "install": True,
                "installer": "kubeadm",
                "release": {"version": "v" + desc["kubernetes_version"].removeprefix("v")},
                "remoteAccess": True,
                "kubeConfig": KUBECONFIG_PATH,
            },
        },
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def lab(fresh_testbed: Any, tmp_path: Path) -> Iterator[Lab]:
    made = Lab(fresh_testbed(1), tmp_path)
    yield made
    made.close()


def ctl_in(lab: Lab, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """tetherctl run from ``cwd`` (the kubeConfig path is relative to the working directory)."""
    out = subprocess.run(
        [str(BIN / "tetherctl"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TETHER_CONFIG": str(lab.controller.config)},
    )
    lab.outputs.append(out.stdout + out.stderr)
    return out


def host_kubectl(kubeconfig: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The stand-in kubectl, on the host: TLS to the node's API server with the exported kubeconfig."""
    state.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(STANDINS),
        "K8S_STANDIN_TOOL": "kubectl",
        "K8S_STANDIN_LOG_DIR": str(state),
        "K8S_STANDIN_STATE_DIR": str(state),
        "K8S_STANDIN_KUBE_DIR": str(state),
    }
    return subprocess.run(
        [sys.executable, "-m", "k8s_standin", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_a_single_node_exports_a_kubeconfig_and_reports_health(lab: Lab, tmp_path: Path) -> None:
    bed = lab.bed
    ip = bed.node("node1").ip
    lab.apply(single_node_environment(bed, "single"), "single")
    lab.bootstrap("single", {"node1": "control-plane"})
    health = lab.wait_available("single", ["node1"], timeout=360)
    lab.ctl("wait", "--env", "single", "--for", "provisioned", "--timeout", "5m")

    # Health: a cluster of one, initialised by the node, at its own address.
    assert health["init_node"] == "node1" and health["endpoint"] == f"{ip}:6443"
    assert (health["desired_control_planes"], health["desired_workers"]) == (1, 0)
    (node,) = health["nodes"]
    assert node["name"] == "node1" and node["ready"] and node["joined"] and node["internal_ip"] == ip
    conditions = {c["type"]: c for c in health["conditions"]}
    assert conditions["Available"]["status"] and not conditions["Degraded"]["status"]
    table = lab.ctl("cluster", "health", "--env", "single").stdout
    assert "Environment:  single (available)" in table and "node1" in table

    # The plan: the cluster init, Calico and holodeck's single-node readiness step, all done.
    done = {e["step"] for e in lab.events("node1") if e["kind"] == "succeeded"}
    assert {"kubeadm-init", "calico", "kubernetes-ready"} <= done
    k8s = lab.kubectl_nodes("node1")["node1"]
    assert not any(t["key"] == "node-role.kubernetes.io/control-plane" for t in k8s["spec"].get("taints", []))
    assert "node-role.kubernetes.io/worker" in k8s["metadata"]["labels"]

    # remoteAccess: the node's names are in the API server certificate's configuration.
    config = bed.exec("node1", "cat /etc/kubernetes/tether-kubeadm.yaml").stdout
    sans = next(d for d in yaml.safe_load_all(config) if d["kind"] == "ClusterConfiguration")["apiServer"]
    assert ip in sans["certSANs"] and "node1" in sans["certSANs"], sans

    # kubeConfig: written relative to the working directory, 0600, and it works from the host.
    work = tmp_path / "operator"
    work.mkdir()
    out = ctl_in(lab, work, "cluster", "kubeconfig", "--env", "single")
    assert out.returncode == 0, out.stderr
    written = work / KUBECONFIG_PATH
    assert f"written to {KUBECONFIG_PATH}" in out.stderr and "spec.kubernetes.kubeConfig" in out.stderr
    assert out.stdout == ""  # the credential went to the file only
    assert written.stat().st_mode & 0o777 == 0o600
    exported = yaml.safe_load(written.read_text())
    assert exported["clusters"][0]["cluster"]["server"] == f"https://{ip}:6443"
    got = host_kubectl(written, tmp_path / "kubectl", "get", "nodes", "-o", "json")
    assert got.returncode == 0, got.stderr
    (item,) = json.loads(got.stdout)["items"]
    assert item["metadata"]["name"] == "node1"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"]["conditions"])

    # Again: unchanged. Something else there: refused unless --overwrite; --file - prints it.
    again = ctl_in(lab, work, "cluster", "kubeconfig", "--env", "single")
    assert again.returncode == 0 and "unchanged in" in again.stderr
    other = ctl_in(lab, work, "cluster", "kubeconfig", "--env", "single", "--server", "10.9.8.7:6443")
    assert other.returncode != 0 and "--overwrite" in other.stderr
    assert yaml.safe_load(written.read_text()) == exported
    replaced = ctl_in(
        lab, work, "cluster", "kubeconfig", "--env", "single", "--server", "10.9.8.7:6443", "--overwrite"
    )
    assert replaced.returncode == 0 and "replaced in" in replaced.stderr
    assert yaml.safe_load(written.read_text())["clusters"][0]["cluster"]["server"] == "https://10.9.8.7:6443"
    printed = ctl_in(lab, work, "cluster", "kubeconfig", "--env", "single", "--file", "-")
    assert printed.returncode == 0 and yaml.safe_load(printed.stdout) == exported

    # The kubeconfig came from the node's kubeadm-init, never through an event or a log line.
    key = exported["users"][0]["user"]["client-key-data"]
    assert key not in json.dumps(lab.events("node1"))
    assert key not in lab.controller.log_path.read_text()
