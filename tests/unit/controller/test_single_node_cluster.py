"""Issue 14: a single-node kubeadm environment (no spec.cluster) is a cluster of one: its control
plane initialises it, the controller keeps its kubeconfig, and cluster health reports it.
``kubernetes.remoteAccess`` with ``K8sEndpointHost`` names that host in the exported kubeconfig."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.unit.controller.test_cluster import OUTPUTS, Cluster
from tether.controller.cluster import material as m
from tether.controller.cluster.context import INIT_STEP, Position
from tether.controller.errors import FailedPrecondition, NotFound
from tether.controller.store import SqliteStore
from tether.nodeagent.model import ClusterNode, ClusterView, Health, now_ms

HEAD = "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: c1}\nspec:\n"
SINGLE = HEAD + "  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}\n"
ADMIN = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {"name": "c1", "cluster": {"server": "https://10.0.0.2:6443", "certificate-authority-data": "Q0E="}}
    ],
    "users": [{"name": "admin", "user": {"client-certificate-data": "Q0U=", "client-key-data": "S0U="}}],
    "contexts": [{"name": "admin@c1", "context": {"cluster": "c1", "user": "admin"}}],
    "current-context": "admin@c1",
}
WITH_KUBECONFIG = {**OUTPUTS, m.KUBECONFIG: base64.b64encode(yaml.safe_dump(ADMIN).encode()).decode()}
del WITH_KUBECONFIG[m.CERT_KEY]  # one control plane: kubeadm init uploads no certificates


async def make(tmp_path: Path, document: str) -> Cluster:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", document, "holodeck.nvidia.com/v1alpha1", {})
    return Cluster(store, tmp_path)


@pytest.fixture
async def single(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = await make(tmp_path, SINGLE)
    yield cluster
    await cluster.store.close()


def server(text: str) -> str:
    return str(yaml.safe_load(text)["clusters"][0]["cluster"]["server"])


async def test_the_single_node_initialises_a_cluster_of_one_and_hands_over_its_kubeconfig(
    single: Cluster,
) -> None:
    cp1 = await single.node("cp-1", "control-plane")
    context = await single.orch.context(cp1)
    assert context is not None and context.position is Position.INIT
    assert not context.upload_certs and not context.ha_endpoint and not context.dedicated_control_plane
    with pytest.raises(NotFound, match="kubeadm init has not finished"):
        single.orch.kubeconfig("c1")
    assert await single.init(cp1, WITH_KUBECONFIG)
    await single.succeed("cp-1", INIT_STEP, 1)
    exported = yaml.safe_load(single.orch.kubeconfig("c1"))
    assert exported["clusters"][0]["cluster"]["server"] == "https://10.0.0.2:6443"
    assert exported["users"] == ADMIN["users"]
    # The controller labels the node and leaves it untainted (holodeck's single node takes work).
    tasks = [msg.command.task.step for msg in single.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    label = {t.name: dict(t.env) for t in tasks}["label-cp-1"]
    assert label["UNTAINT"] == "1" and label["ROLE"] == "control-plane"


async def test_cluster_health_reports_the_single_node(single: Cluster) -> None:
    cp1 = await single.node("cp-1", "control-plane")
    report = single.orch.health("c1")
    assert (report.desired_control_planes, report.desired_workers) == (1, 0)
    assert not report.available
    assert await single.init(cp1, WITH_KUBECONFIG)
    await single.succeed("cp-1", INIT_STEP, 1)
    view = ClusterView(
        api_server="running",
        nodes=(ClusterNode(name="cp-1", ready=True, version="v1.31.0", internal_ip="10.0.0.2"),),
        time_ms=now_ms(),
    )
    single.sessions["cp-1"].health = Health(
        services={"kubelet": "active", "containerd": "active"}, cluster=view
    )
    report = single.orch.health("c1")
    assert report.available and report.api_server == "running"
    assert report.init_node == "cp-1" and report.endpoint == "10.0.0.2:6443"
    (node,) = report.nodes
    assert node.name == "cp-1" and node.ready and node.joined and node.kubelet == "active"
    available = next(c for c in report.conditions if c.type == "Available")
    assert available.status and "1/1 control planes and 0/0 workers Ready" in available.message


@pytest.mark.parametrize(
    ("kubernetes", "want"),
    [
        ("remoteAccess: true, K8sEndpointHost: api.example.com", "https://api.example.com:6443"),
        ("remoteAccess: true", "https://10.0.0.2:6443"),  # no host named: the cluster endpoint
        ("K8sEndpointHost: api.example.com", "https://10.0.0.2:6443"),  # holodeck: only with remoteAccess
    ],
)
async def test_remote_access_names_the_endpoint_host_in_the_kubeconfig(
    tmp_path: Path, kubernetes: str, want: str
) -> None:
    doc = HEAD + f"  kubernetes: {{install: true, installer: kubeadm, {kubernetes}}}\n"
    cluster = await make(tmp_path, doc)
    try:
        cp1 = await cluster.node("cp-1", "control-plane")
        assert await cluster.init(cp1, WITH_KUBECONFIG)
        assert server(cluster.orch.kubeconfig("c1")) == want
        assert server(cluster.orch.kubeconfig("c1", "10.9.8.7")) == "https://10.9.8.7:6443"  # --server wins
    finally:
        await cluster.store.close()


async def test_other_installers_have_no_kubeadm_cluster(tmp_path: Path) -> None:
    doc = (
        HEAD
        + "  kubernetes: {install: true, installer: kind}\n"
        + "  containerRuntime: {install: true, name: docker}\n"
    )
    store = SqliteStore(tmp_path / "t.db")
    try:
        await store.put_environment("c1", doc, "holodeck.nvidia.com/v1alpha1", {})
        cluster = Cluster(store, tmp_path)
        assert cluster.orch.cluster_spec("c1") is None
        with pytest.raises(FailedPrecondition, match="not installed by kubeadm"):
            cluster.orch.health("c1")
    finally:
        await store.close()
