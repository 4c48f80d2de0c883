"""HA without an endpoint: the list of API servers behind every node's own load balancer (a pure
function of the cluster's state) and how the controller keeps every node's copy current."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.controller.cluster import apiserver_lb
from tether.controller.cluster import material as m
from tether.controller.cluster.apiserver_lb import BACKENDS_FILE, TASK, api_address, backends, backends_task
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP, LOCAL_LB_ENDPOINT, Position
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.hub import Hub, Session
from tether.controller.secretbox import SecretBox
from tether.controller.spec import load_document
from tether.controller.spec.parse_cluster import LOCAL_LB_NOTE
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step
from tether.nodeagent.secrets import Redactor

HEAD = "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: ha}\nspec:\n"
HA_LOCAL = HEAD + (
    "  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}\n"
    "  cluster:\n"
    "    controlPlane: {count: 3}\n"
    "    workers: {count: 1}\n"
    "    highAvailability: {enabled: true, loadBalancerType: nlb}\n"
)
HA_ENDPOINT = HA_LOCAL.replace("loadBalancerType: nlb", "endpoint: 'lb.example:6443'")
IPS = {"cp-1": "10.0.0.11", "cp-2": "10.0.0.12", "cp-3": "10.0.0.13", "w-1": "10.0.0.21"}


def rec(name: str, role: str, *, revoked: bool = False, ip: str | None = None) -> NodeRecord:
    address = IPS.get(name, "") if ip is None else ip
    return NodeRecord(
        name=name,
        environment="ha",
        role=role,
        cert_fingerprint="f",
        key_hash="k",
        token_id=f"t-{name}",
        enrolled_ms=1,
        revoked=revoked,
        facts={"addresses": [address] if address else []},
    )


# -- parsing -------------------------------------------------------------------------------------


def test_ha_without_an_endpoint_is_accepted_with_notes() -> None:
    loaded = load_document(HA_LOCAL)
    ha = loaded.spec.cluster.high_availability  # type: ignore[union-attr]
    assert ha.enabled and ha.endpoint == ""
    assert f"spec.cluster.highAvailability.endpoint: {LOCAL_LB_NOTE}" in loaded.notes
    assert any(n.startswith("spec.cluster.highAvailability.loadBalancerType: ignored") for n in loaded.notes)
    assert LOCAL_LB_ENDPOINT in LOCAL_LB_NOTE and ":7443" in LOCAL_LB_NOTE  # the same as the nodes'


def test_spec_load_balancer_is_accepted_with_a_note() -> None:
    loaded = load_document(
        HA_LOCAL + "  loadBalancer: {enabled: true, type: nlb, healthCheckPath: /healthz}\n"
    )
    assert any(n.startswith("spec.loadBalancer") for n in loaded.notes), loaded.notes


def test_the_context_names_the_node_local_endpoint_only_without_an_endpoint() -> None:
    from tether.controller.cluster.context import cluster_of, context_for

    local = context_for(cluster_of(load_document(HA_LOCAL).spec), Position.WORKER)  # type: ignore[arg-type]
    assert local.local_lb and local.ha_endpoint == LOCAL_LB_ENDPOINT == "apiserver.tether.internal:7443"
    given = context_for(cluster_of(load_document(HA_ENDPOINT).spec), Position.WORKER)  # type: ignore[arg-type]
    assert not given.local_lb and given.ha_endpoint == "lb.example:6443"


# -- the list: a pure function ---------------------------------------------------------------------


def test_the_init_node_is_listed_from_the_moment_it_is_chosen_then_every_joined_control_plane() -> None:
    nodes = [rec("cp-2", "control-plane"), rec("cp-1", "control-plane"), rec("w-1", "worker")]
    assert backends(nodes, init_node="", member=lambda n: False) == ()
    assert backends(nodes, init_node="cp-2", member=lambda n: False) == ("10.0.0.12:6443",)
    assert backends(nodes, init_node="cp-2", member=lambda n: True) == ("10.0.0.12:6443", "10.0.0.11:6443")


def test_workers_revoked_nodes_and_nodes_without_an_address_are_never_listed() -> None:
    nodes = [
        rec("cp-1", "control-plane"),
        rec("cp-2", "control-plane", revoked=True),
        rec("cp-3", "control-plane", ip=""),
        rec("cp-4", "control-plane", ip="not-an-ip"),
        rec("cp-5", "control-plane", ip="fd00::5"),
        rec("w-1", "worker"),
    ]
    assert backends(nodes, init_node="cp-2", member=lambda n: True) == ("10.0.0.11:6443", "[fd00::5]:6443")
    assert api_address(rec("x", "worker", ip="10.1.2.3")) == "10.1.2.3:6443"


def test_the_task_writes_the_file_atomically_and_carries_the_list_as_environment() -> None:
    step = backends_task(["10.0.0.11:6443", "10.0.0.12:6443"])
    assert step.name == TASK and step.env == {"BACKENDS": "10.0.0.11:6443 10.0.0.12:6443"}
    assert BACKENDS_FILE in step.script and 'mv -f "$tmp" "$file"' in step.script
    assert "10.0.0.11" not in step.script  # inputs travel as environment, never as script text


def test_the_task_script_passes_shellcheck(tmp_path: Path) -> None:
    from tests.tools import system_tool

    script = tmp_path / "task.sh"
    script.write_text(backends_task(["10.0.0.11:6443"]).script)
    import subprocess

    out = subprocess.run(
        [system_tool("shellcheck"), "--severity=style", "--shell=bash", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout


def test_the_task_writes_what_the_load_balancer_reads(tmp_path: Path) -> None:
    """Run the task's script for real (its file path moved under tmp_path)."""
    import subprocess

    from tether.nodeagent import apiserver_lb as proxy

    target = tmp_path / "etc" / "apiserver-backends"
    step = backends_task(["10.0.0.11:6443", "10.0.0.12:6443"])
    script = step.script.replace(BACKENDS_FILE, str(target))
    subprocess.run(["bash", "-c", script], env={**step.env, "PATH": "/usr/bin:/bin"}, check=True)
    assert proxy.parse_backends(target.read_text()) == ["10.0.0.11:6443", "10.0.0.12:6443"]
    assert not list(target.parent.glob("*.??????"))  # no temporary file left behind


# -- the controller keeps every node's copy current ----------------------------------------------


class Cluster:
    def __init__(self, store: SqliteStore, tmp_path: Path) -> None:
        self.store = store
        self.hub = Hub()
        self.orch = Orchestrator(store, self.hub, SecretBox.load_or_create(tmp_path / "k"), Redactor())
        self.sessions: dict[str, Session] = {}

    async def node(self, name: str, role: str, *, connect: bool = True) -> NodeRecord:
        await self.store.put_token(TokenRecord(f"t-{name}", "h", "ha", role, "", 10**15, 1, 0, False, 1))
        node = rec(name, role)
        await self.store.enroll_node(f"t-{name}", name, lambda t, e: (node, True))
        ctx = await self.orch.context(node)
        assert ctx is not None
        step = INIT_STEP if ctx.position is Position.INIT else JOIN_STEP
        await self.store.set_node_plan(
            name, Plan.build([Step(name=step, script="x", gate="" if step == INIT_STEP else "cluster-join")])
        )
        if connect:
            await self.connect(name)
        return node

    async def connect(self, name: str) -> None:
        self.sessions[name] = self.hub.attach(name, "ha")
        node = self.store.get_node(name)
        assert node is not None
        await self.orch.on_connect(node)

    def lists(self, name: str) -> list[str]:
        """The backend lists sent to ``name`` since the last call (other messages dropped)."""
        q = self.sessions[name].outbox
        out = []
        while not q.empty():
            msg: Any = q.get_nowait()
            if msg.WhichOneof("kind") == "command" and msg.command.task.step.name == TASK:
                assert msg.command.id.startswith(apiserver_lb.COMMAND_PREFIX)
                out.append(dict(msg.command.task.step.env)["BACKENDS"])
        return out

    async def event(self, name: str, step: str, kind: EventKind, seq: int) -> None:
        node = self.store.get_node(name)
        assert node is not None
        digest = self.store.node_steps(name)[0].digest if not step.startswith("task:") else ""
        e = Event(kind=kind, step=step, digest=digest, seq=seq, time_ms=seq)
        await self.store.append_events(name, [e])
        await self.orch.on_events(node, [e])


async def _cluster(tmp_path: Path, doc: str) -> tuple[SqliteStore, Cluster]:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("ha", doc, "holodeck.nvidia.com/v1alpha1", {})
    return store, Cluster(store, tmp_path)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    store, made = await _cluster(tmp_path, HA_LOCAL)
    yield made
    await store.close()


async def test_every_node_gets_the_list_as_control_planes_join_and_leave(cluster: Cluster) -> None:
    w1 = await cluster.node("w-1", "worker")  # before any control plane: nothing to send yet
    assert cluster.lists("w-1") == []
    await cluster.node("cp-1", "control-plane")  # chosen to initialise: on everybody's list
    assert cluster.lists("w-1") == ["10.0.0.11:6443"]
    assert cluster.lists("cp-1") == ["10.0.0.11:6443"]
    await cluster.node("cp-2", "control-plane")
    await cluster.node("cp-3", "control-plane")
    assert cluster.lists("cp-2") == cluster.lists("cp-3") == ["10.0.0.11:6443"]
    assert cluster.lists("w-1") == []  # unchanged
    await cluster.event("cp-1", INIT_STEP, EventKind.SUCCEEDED, 1)
    assert cluster.lists("w-1") == []  # the init node was on it already
    await cluster.event("cp-2", JOIN_STEP, EventKind.SUCCEEDED, 1)
    both = "10.0.0.11:6443 10.0.0.12:6443"
    assert {n: cluster.lists(n) for n in ("cp-1", "cp-2", "cp-3", "w-1")} == {
        "cp-1": [both],
        "cp-2": [both],
        "cp-3": [both],
        "w-1": [both],
    }
    await cluster.event("w-1", JOIN_STEP, EventKind.SUCCEEDED, 2)  # a worker changes nothing
    assert cluster.lists("cp-1") == []
    await cluster.event("cp-3", JOIN_STEP, EventKind.SUCCEEDED, 1)
    three = both + " 10.0.0.13:6443"
    assert all(cluster.lists(n) == [three] for n in ("cp-1", "cp-2", "cp-3", "w-1"))
    # cp-2 is reset (or deleted): the controller forgets it, and it is on nobody's list any more.
    await cluster.orch.forget_node("ha", "cp-2")  # as tether.controller.resets forgets a node:
    await cluster.store.delete_node("cp-2")  # then its record goes
    assert cluster.lists("w-1") == ["10.0.0.11:6443 10.0.0.13:6443"]
    assert cluster.lists("cp-2") == []
    # A revoked control plane is dropped too.
    await cluster.store.update_node("cp-3", revoked=True)
    cp3 = cluster.store.get_node("cp-3")
    assert cp3 is not None
    await cluster.orch.node_revoked(cp3)
    assert cluster.lists("w-1") == ["10.0.0.11:6443"]
    assert w1.name == "w-1"


async def test_a_node_that_reconnects_gets_the_list_again(cluster: Cluster) -> None:
    await cluster.node("cp-1", "control-plane")
    await cluster.node("w-1", "worker")
    assert cluster.lists("w-1") == cluster.lists("cp-1") == ["10.0.0.11:6443"]
    cluster.hub.detach(cluster.sessions.pop("w-1"))
    await cluster.connect("w-1")
    assert cluster.lists("w-1") == ["10.0.0.11:6443"]  # the earlier task may never have run
    assert cluster.lists("cp-1") == []


async def test_a_node_that_missed_a_change_while_away_gets_it_when_it_connects(cluster: Cluster) -> None:
    await cluster.node("cp-1", "control-plane")
    await cluster.node("cp-2", "control-plane")
    await cluster.node("w-1", "worker", connect=False)
    await cluster.event("cp-2", JOIN_STEP, EventKind.SUCCEEDED, 1)
    await cluster.connect("w-1")
    assert cluster.lists("w-1") == ["10.0.0.11:6443 10.0.0.12:6443"]


async def test_a_failed_task_is_sent_again(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apiserver_lb, "RETRY_S", 0.01)
    await cluster.node("cp-1", "control-plane")
    await cluster.node("w-1", "worker")
    assert cluster.lists("w-1") == ["10.0.0.11:6443"]
    await cluster.event("w-1", f"task:{TASK}", EventKind.FAILED, 5)
    import asyncio

    await asyncio.sleep(0.1)
    assert cluster.lists("w-1") == ["10.0.0.11:6443"]


async def test_the_tasks_empty_answer_is_acknowledged_quietly(cluster: Cluster) -> None:
    w1 = await cluster.node("w-1", "worker")
    assert await cluster.orch.secrets_received(w1, TASK, {}, f"{apiserver_lb.COMMAND_PREFIX}abc")


async def test_the_exported_kubeconfig_names_a_control_plane_not_the_node_local_name(
    cluster: Cluster,
) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.node("cp-2", "control-plane")
    await cluster.event("cp-2", JOIN_STEP, EventKind.SUCCEEDED, 1)
    kubeconfig = base64.b64encode(b"apiVersion: v1\nclusters: [{cluster: {server: x}}]\n").decode()
    outputs = {
        m.TOKEN: "abcdef.0123456789abcdef",
        m.CA_HASH: "sha256:" + "a" * 64,
        m.CERT_KEY: "c" * 64,
        m.ENDPOINT: LOCAL_LB_ENDPOINT,
        m.KUBECONFIG: kubeconfig,
    }
    await cluster.store.append_events(
        "cp-1",
        [
            Event(
                kind=EventKind.STARTED,
                step=INIT_STEP,
                digest=cluster.store.node_steps("cp-1")[0].digest,
                seq=10_000,
                time_ms=10_000,
            )
        ],
    )
    assert await cluster.orch.secrets_received(cp1, INIT_STEP, outputs, "")
    doc = yaml.safe_load(cluster.orch.kubeconfig("ha"))
    assert doc["clusters"][0]["cluster"]["server"] == "https://10.0.0.11:6443"
    cluster.hub.detach(cluster.sessions.pop("cp-1"))  # cp-1 is gone: one that is connected
    doc = yaml.safe_load(cluster.orch.kubeconfig("ha"))
    assert doc["clusters"][0]["cluster"]["server"] == "https://10.0.0.12:6443"
    assert cluster.orch.health("ha").endpoint == LOCAL_LB_ENDPOINT


async def test_clusters_with_an_endpoint_get_no_list(tmp_path: Path) -> None:
    store, other = await _cluster(tmp_path, HA_ENDPOINT)
    try:
        await other.node("cp-1", "control-plane")
        await other.node("w-1", "worker")
        await other.event("cp-1", INIT_STEP, EventKind.SUCCEEDED, 1)
        assert other.lists("w-1") == [] and other.lists("cp-1") == []
    finally:
        await store.close()
