"""Cluster orchestration: the join-material lifecycle and the gate logic."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.controller.cluster import material as m
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP, Position
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.hub import Hub, Session
from tether.controller.secretbox import SecretBox
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step, now_ms
from tether.nodeagent.secrets import Redactor

TOKEN = "abcdef.0123456789abcdef"
CERT_KEY = "c" * 64
HOUR_MS = 3600 * 1000

OUTPUTS = {m.TOKEN: TOKEN, m.CA_HASH: "sha256:" + "a" * 64, m.CERT_KEY: CERT_KEY, m.ENDPOINT: "10.0.0.2:6443"}

SPEC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {name: c1}
spec:
  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}
  cluster:
    controlPlane: {count: 3, dedicated: false, labels: {team: gpu}}
    workers: {count: 2, labels: {pool: a100}}
"""


# -- material lifecycle ------------------------------------------------------------------------


def test_fresh_material_is_usable_by_workers_and_control_planes() -> None:
    mat = m.JoinMaterial.from_outputs(OUTPUTS, now_ms=0)
    assert mat.usable_for(False, now_ms=0) and mat.usable_for(True, now_ms=0)
    assert mat.release_env(False) == (
        {m.TOKEN: TOKEN},
        {m.CA_HASH: OUTPUTS[m.CA_HASH], m.ENDPOINT: "10.0.0.2:6443"},
    )
    assert mat.release_env(True)[0] == {m.TOKEN: TOKEN, m.CERT_KEY: CERT_KEY}


def test_certificate_key_expires_after_two_hours_and_the_token_after_its_ttl() -> None:
    mat = m.JoinMaterial.from_outputs(OUTPUTS, now_ms=0)
    two_hours = 2 * HOUR_MS
    assert not mat.usable_for(True, now_ms=two_hours - 5 * 60_000)  # inside the safety margin
    assert mat.usable_for(False, now_ms=two_hours)
    assert not mat.usable_for(False, now_ms=24 * HOUR_MS - 5 * 60_000)


def test_a_refresh_without_a_certificate_key_keeps_the_old_one_and_its_expiry() -> None:
    first = m.JoinMaterial.from_outputs(OUTPUTS, now_ms=0)
    refreshed = m.JoinMaterial.from_outputs(
        {m.TOKEN: "zzzzzz.0123456789zzzzzz", m.CA_HASH: OUTPUTS[m.CA_HASH]},
        now_ms=30 * HOUR_MS,
        previous=first,
    )
    assert refreshed.token == "zzzzzz.0123456789zzzzzz" and refreshed.cert_key == CERT_KEY
    assert refreshed.cert_key_expires_ms == first.cert_key_expires_ms
    assert refreshed.usable_for(False, now_ms=30 * HOUR_MS) and not refreshed.usable_for(
        True, now_ms=30 * HOUR_MS
    )
    assert refreshed.endpoint == "10.0.0.2:6443"


def test_material_never_shows_its_secrets() -> None:
    mat = m.JoinMaterial.from_outputs(OUTPUTS, now_ms=0)
    for text in (repr(mat), str(mat), f"{mat}"):
        assert TOKEN not in text and CERT_KEY not in text


def test_sealed_blobs_are_bound_to_their_key(tmp_path: Path) -> None:
    box = SecretBox.load_or_create(tmp_path / "secrets.key")
    blob = box.seal(b"payload-canary", "cluster/a/material")
    assert b"payload-canary" not in blob
    assert box.open(blob, "cluster/a/material") == b"payload-canary"
    with pytest.raises(Exception):  # noqa: B017 (cryptography's InvalidTag)
        box.open(blob, "cluster/b/material")
    assert (tmp_path / "secrets.key").stat().st_mode & 0o077 == 0
    assert (
        SecretBox.load_or_create(tmp_path / "secrets.key").open(blob, "cluster/a/material")
        == b"payload-canary"
    )


# -- gate logic --------------------------------------------------------------------------------


class Cluster:
    def __init__(self, store: SqliteStore, tmp_path: Path) -> None:
        self.store = store
        self.hub = Hub()
        self.box = SecretBox.load_or_create(tmp_path / "secrets.key")
        self.redactor = Redactor()
        self.orch = Orchestrator(store, self.hub, self.box, self.redactor)
        self.sessions: dict[str, Session] = {}

    async def node(self, name: str, role: str, *, connect: bool = True) -> NodeRecord:
        await self.store.put_token(TokenRecord(f"t-{name}", "h", "c1", role, "", 10**15, 1, 0, False, 1))
        rec = NodeRecord(
            name=name,
            environment="c1",
            role=role,
            cert_fingerprint="f",
            key_hash="k",
            token_id=f"t-{name}",
            enrolled_ms=1,
        )
        await self.store.enroll_node(f"t-{name}", name, lambda t, e: (rec, True))
        ctx = await self.orch.context(rec)
        assert ctx is not None
        step = INIT_STEP if ctx.position is Position.INIT else JOIN_STEP
        await self.store.set_node_plan(
            name, Plan.build([Step(name=step, script="x", gate="" if step == INIT_STEP else "cluster-join")])
        )
        if connect:
            self.sessions[name] = self.hub.attach(name, "c1")
        return rec

    def digest(self, name: str) -> str:
        return self.store.node_steps(name)[0].digest

    def sent(self, name: str) -> list[Any]:
        q = self.sessions[name].outbox
        out = []
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def releases(self, name: str) -> list[dict[str, str]]:
        return [
            {**msg.release.env, **msg.release.secret_env}
            for msg in self.sent(name)
            if msg.WhichOneof("kind") == "release"
        ]

    async def start(self, name: str, step: str, seq: int = 10_000) -> None:
        """A STARTED event for ``step`` (numbered apart from the tests' own events)."""
        event = Event(kind=EventKind.STARTED, step=step, digest=self.digest(name), seq=seq, time_ms=seq)
        await self.store.append_events(name, [event])

    async def init(self, node: NodeRecord, outputs: dict[str, str] | None = None) -> bool:
        """kubeadm-init runs on ``node`` and sends its material."""
        await self.start(node.name, INIT_STEP)
        return await self.orch.secrets_received(node, INIT_STEP, OUTPUTS if outputs is None else outputs, "")

    async def succeed(self, name: str, step: str, seq: int) -> None:
        rec = self.store.get_node(name)
        assert rec is not None
        event = Event(
            kind=EventKind.SUCCEEDED,
            step=step,
            digest=self.digest(name) if not step.startswith("task:") else "",
            seq=seq,
            time_ms=seq,
        )
        await self.store.append_events(name, [event])
        await self.orch.on_events(rec, [event])


async def test_the_first_control_plane_initialises_once_and_durably(cluster: Cluster, tmp_path: Path) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    cp2 = await cluster.node("cp-2", "control-plane")
    w1 = await cluster.node("w-1", "worker")
    assert (await cluster.orch.context(cp1)).position is Position.INIT  # type: ignore[union-attr]
    assert (await cluster.orch.context(cp2)).position is Position.CONTROL_PLANE  # type: ignore[union-attr]
    assert (await cluster.orch.context(w1)).position is Position.WORKER  # type: ignore[union-attr]
    again = Orchestrator(cluster.store, Hub(), cluster.box, Redactor())
    assert (await again.context(cp2)).position is Position.CONTROL_PLANE  # type: ignore[union-attr]
    assert again.init_node("c1") == "cp-1"


async def test_nodes_wait_at_the_gate_until_init_sends_material(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    cp2 = await cluster.node("cp-2", "control-plane")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    await cluster.orch.gate_requested(cp2, JOIN_STEP, cluster.digest("cp-2"))
    assert cluster.releases("w-1") == [] and cluster.releases("cp-2") == []
    outputs = {
        **OUTPUTS,
        m.KUBECONFIG: base64.b64encode(b"apiVersion: v1\nclusters: [{cluster: {server: x}}]\n").decode(),
    }
    assert await cluster.init(cp1, outputs)
    worker_env = cluster.releases("w-1")
    cp_env = cluster.releases("cp-2")
    assert worker_env == [{m.TOKEN: TOKEN, m.CA_HASH: OUTPUTS[m.CA_HASH], m.ENDPOINT: "10.0.0.2:6443"}]
    assert cp_env[0][m.CERT_KEY] == CERT_KEY
    # Stored sealed: a dump of the store shows neither secret.
    dump = "\n".join(str(v) for v in (cluster.store.kv_get("cluster/c1/material"),))
    assert TOKEN not in dump and CERT_KEY not in dump
    kubeconfig = yaml.safe_load(cluster.orch.kubeconfig("c1", "lb.example:6443"))
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://lb.example:6443"
    # Without --server: the endpoint the join material names, reachable from outside the node.
    kubeconfig = yaml.safe_load(cluster.orch.kubeconfig("c1"))
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://10.0.0.2:6443"
    # The controller masks the material in whatever a step prints from now on (events, logs).
    printed = cluster.redactor.redact(
        f"kubeadm join 10.0.0.2:6443 --token {TOKEN} --certificate-key {CERT_KEY}"
    )
    assert TOKEN not in printed and CERT_KEY not in printed and "10.0.0.2:6443" in printed


async def test_late_joiners_are_released_at_once_while_material_is_fresh(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    w2 = await cluster.node("w-2", "worker")
    await cluster.orch.gate_requested(w2, JOIN_STEP, cluster.digest("w-2"))
    assert len(cluster.releases("w-2")) == 1


async def test_expired_material_is_refreshed_by_the_init_control_plane(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")  # drop the label task
    await cluster.orch.forget_material("c1")  # "days later"
    w9 = await cluster.node("w-9", "worker")
    await cluster.orch.gate_requested(w9, JOIN_STEP, cluster.digest("w-9"))
    assert cluster.releases("w-9") == []
    tasks = [msg.command for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    assert len(tasks) == 1 and tasks[0].task.step.name == "refresh-join-material"
    assert dict(tasks[0].task.step.env)["UPLOAD_CERTS"] == "0"
    fresh = {m.TOKEN: "zzzzzz.0123456789zzzzzz", m.CA_HASH: OUTPUTS[m.CA_HASH]}
    await cluster.orch.secrets_received(cp1, "refresh-join-material", fresh, tasks[0].id)
    assert cluster.releases("w-9") == [
        {m.TOKEN: "zzzzzz.0123456789zzzzzz", m.CA_HASH: OUTPUTS[m.CA_HASH], m.ENDPOINT: "10.0.0.2:6443"}
    ]


async def test_a_control_plane_after_the_two_hour_window_gets_a_new_certificate_key(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    material = m.JoinMaterial.from_outputs(OUTPUTS, now_ms=now_ms() - 3 * HOUR_MS)
    await cluster.init(cp1)
    await cluster.orch._save_material("c1", material)  # certificate key three hours old
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")
    cp3 = await cluster.node("cp-3", "control-plane")
    await cluster.orch.gate_requested(cp3, JOIN_STEP, cluster.digest("cp-3"))
    tasks = [msg.command for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    assert dict(tasks[0].task.step.env)["UPLOAD_CERTS"] == "1"
    await cluster.orch.secrets_received(
        cp1, "refresh-join-material", {**OUTPUTS, m.CERT_KEY: "d" * 64}, tasks[0].id
    )
    assert cluster.releases("cp-3")[0][m.CERT_KEY] == "d" * 64


async def test_a_failed_join_attempt_gets_fresh_material_on_its_retry(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"), attempt=1)
    assert len(cluster.releases("w-1")) == 1
    # The cluster refused the token (e.g. it expired there): the retry must not get the same one.
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"), attempt=2)
    assert cluster.releases("w-1") == []
    assert any(msg.WhichOneof("kind") == "command" for msg in cluster.sent("cp-1"))


async def test_gate_requests_for_other_steps_or_digests_are_ignored(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, "not-the-digest")
    await cluster.orch.gate_requested(w1, "custom-x", cluster.digest("w-1"))
    assert cluster.releases("w-1") == []


async def test_material_from_a_node_that_is_not_the_init_node_is_dropped(cluster: Cluster) -> None:
    await cluster.node("cp-1", "control-plane")
    cp2 = await cluster.node("cp-2", "control-plane")
    await cluster.orch.secrets_received(cp2, INIT_STEP, OUTPUTS, "")
    assert cluster.orch.material("c1") is None


async def test_no_connected_control_plane_means_waiting_until_one_connects(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.hub.detach(cluster.sessions.pop("cp-1"))
    await cluster.orch.forget_material("c1")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    cluster.sessions["cp-1"] = cluster.hub.attach("cp-1", "c1")
    await cluster.orch.on_connect(cp1)
    kinds = [
        msg.command.task.step.name for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"
    ]
    assert "refresh-join-material" in kinds


async def test_joined_nodes_are_labelled_once_by_a_control_plane(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    await cluster.node("w-1", "worker")
    await cluster.succeed("w-1", JOIN_STEP, 1)
    tasks = [msg.command.task.step for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    by_name = {t.name: dict(t.env) for t in tasks}
    assert by_name["label-w-1"] == {"NODE": "w-1", "ROLE": "worker", "LABELS": "pool=a100", "UNTAINT": "0"}
    assert by_name["label-cp-1"]["UNTAINT"] == "1"  # not dedicated: the control plane takes work
    await cluster.succeed("cp-1", "task:label-w-1", 2)
    await cluster.succeed("cp-1", "task:label-cp-1", 3)
    await cluster.orch.on_connect(cp1)
    assert [msg for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"] == []


async def test_label_tasks_are_not_sent_twice_while_one_is_in_flight(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    await cluster.node("w-1", "worker")
    await cluster.succeed("w-1", JOIN_STEP, 1)
    await cluster.orch.on_connect(cp1)
    names = [
        msg.command.task.step.name for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"
    ]
    assert sorted(names) == ["label-cp-1", "label-w-1"]


def test_malformed_material_is_refused_without_showing_it() -> None:
    for key, bad in (
        (m.TOKEN, "not a token"),
        (m.CA_HASH, "md5:x"),
        (m.ENDPOINT, "evil;rm -rf /"),
        (m.CERT_KEY, "z" * 64),
        (m.TOKEN_TTL, "soon"),
    ):
        with pytest.raises(ValueError) as exc:
            m.JoinMaterial.from_outputs({**OUTPUTS, key: bad}, now_ms=0)
        assert key in str(exc.value) and bad not in str(exc.value)


async def test_only_the_node_a_refresh_was_sent_to_may_answer_it(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")
    await cluster.orch.forget_material("c1")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    (task,) = [msg.command for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    assert len(task.id) > 30  # unguessable
    evil = await cluster.node("w-2", "worker")
    planted = {**OUTPUTS, m.ENDPOINT: "6.6.6.6:6443"}
    await cluster.orch.secrets_received(evil, "refresh-join-material", planted, task.id)
    assert cluster.releases("w-1") == []
    await cluster.orch.secrets_received(cp1, "refresh-join-material", OUTPUTS, "refresh-guessed")
    assert cluster.releases("w-1") == []
    await cluster.orch.secrets_received(cp1, "refresh-join-material", OUTPUTS, task.id)
    assert cluster.releases("w-1")[0][m.ENDPOINT] == "10.0.0.2:6443"


async def test_a_failed_refresh_is_tried_again(cluster: Cluster) -> None:
    import asyncio

    from tether.controller.cluster import orchestrator

    orchestrator.REFRESH_BACKOFF_S = 0.01
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")
    await cluster.orch.forget_material("c1")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    first = [msg.command.id for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    await cluster.orch.on_events(
        cp1, [Event(kind=EventKind.FAILED, step="task:refresh-join-material", seq=9)]
    )
    await asyncio.sleep(0.05)
    again = [msg.command.id for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    assert len(first) == 1 and len(again) == 1 and again != first


async def test_material_lost_after_init_is_asked_for_again(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.succeed("cp-1", INIT_STEP, 1)  # init ran, but its material never arrived
    cluster.sent("cp-1")
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"))
    (task,) = [msg.command for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"]
    await cluster.orch.secrets_received(cp1, "refresh-join-material", OUTPUTS, task.id)
    assert len(cluster.releases("w-1")) == 1
    del cp1


async def test_deleting_the_environment_forgets_its_cluster(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.orch.forget_environment("c1")
    assert cluster.orch.material("c1") is None and cluster.orch.init_node("c1") == ""
    assert cluster.store.kv_keys("cluster/c1/") == []


async def test_a_revoked_init_node_that_never_initialised_is_replaced(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.orch.node_revoked(cp1)
    cp2 = await cluster.node("cp-2", "control-plane")
    assert (await cluster.orch.context(cp2)).position is Position.INIT  # type: ignore[union-attr]


async def test_refused_material_is_never_handed_out_again_to_that_node(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    w1 = await cluster.node("w-1", "worker")
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"), attempt=1)
    assert len(cluster.releases("w-1")) == 1
    cluster.hub.detach(cluster.sessions.pop("cp-1"))  # the control plane is away
    await cluster.orch.gate_requested(w1, JOIN_STEP, cluster.digest("w-1"), attempt=2)
    cluster.sessions["cp-1"] = cluster.hub.attach("cp-1", "c1")
    await cluster.orch.on_connect(cp1)
    assert cluster.releases("w-1") == []  # not the same material again: a refresh instead
    kinds = [
        msg.command.task.step.name for msg in cluster.sent("cp-1") if msg.WhichOneof("kind") == "command"
    ]
    assert "refresh-join-material" in kinds


async def test_the_cluster_spec_comes_from_the_planners_parsed_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents are parsed off the event loop (at apply, at start-up) and kept by the planner;
    the orchestrator never parses one itself on the loop when it is given them."""
    from tether.controller import planner as planner_module
    from tether.controller.cluster import orchestrator
    from tether.controller.planner import Planner

    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", SPEC, "holodeck.nvidia.com/v1alpha1", {})
    planner = Planner(store)
    env = store.get_environment("c1")
    assert env is not None
    planner.spec(env)  # what apply and start-up do, in a worker thread

    def no_parse(text: str) -> None:
        raise AssertionError("parsed on the event loop")

    monkeypatch.setattr(orchestrator, "load_document", no_parse)
    monkeypatch.setattr(planner_module, "load_document", no_parse)
    orch = Orchestrator(
        store, Hub(), SecretBox.load_or_create(tmp_path / "k"), Redactor(), specs=planner.spec
    )
    assert orch.cluster_spec("c1") is not None
    await store.close()
