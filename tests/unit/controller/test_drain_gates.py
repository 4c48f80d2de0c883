"""The drain and uncordon gates (spec.rollout.drain), answered by the orchestrator's Drainer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tether.controller.cluster.context import (
    DRAIN_GATE,
    DRAIN_STEP,
    GATE_DONE,
    GATE_MESSAGE,
    GATE_RESULT,
    INIT_STEP,
    JOIN_GATE,
    JOIN_STEP,
    UNCORDON_GATE,
    UNCORDON_STEP,
)
from tether.controller.cluster.drain import Drainer
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.hub import Hub, Session
from tether.controller.secretbox import SecretBox
from tether.controller.store import NodeRecord, SqliteStore
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind, Plan, Step
from tether.nodeagent.secrets import Redactor

SPEC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {name: c1}
spec:
  kubernetes: {install: true, installer: kubeadm, release: {version: v1.31.0}}
  cluster:
    controlPlane: {count: 3}
    workers: {count: 2}
  rollout: {drain: true}
"""


def plan(cluster_step: str, runtime: str = "containerd v1") -> Plan:
    gate = JOIN_GATE if cluster_step == JOIN_STEP else ""
    return Plan.build(
        [
            Step(name=DRAIN_STEP, script=f"drain around {runtime}", gate=DRAIN_GATE),
            Step(name="containerd", script=runtime, phase="runtime"),
            Step(name=UNCORDON_STEP, script=f"uncordon after {runtime}", gate=UNCORDON_GATE),
            Step(name=cluster_step, script="kubeadm", gate=gate),
        ]
    )


class Lab:
    def __init__(self, store: SqliteStore, tmp_path: Path) -> None:
        self.store = store
        self.hub = Hub()
        self.orch = Orchestrator(store, self.hub, SecretBox.load_or_create(tmp_path / "k"), Redactor())
        self.sessions: dict[str, Session] = {}
        self.seq = 0

    async def node(self, name: str, role: str, *, joined: bool = False, connect: bool = True) -> NodeRecord:
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
        step = INIT_STEP if ctx.control_plane and self.orch.init_node("c1") == name else JOIN_STEP
        await self.store.set_node_plan(name, plan(step))
        if connect:
            self.sessions[name] = self.hub.attach(name, "c1")
        if joined:
            await self.event(name, EventKind.SUCCEEDED, step, self.digest(name, step))
        return rec

    def digest(self, node: str, step: str) -> str:
        return next(s.digest for s in self.store.node_steps(node) if s.name == step)

    async def event(self, node: str, kind: EventKind, step: str, digest: str, **extra: Any) -> None:
        rec = self.store.get_node(node)
        assert rec is not None
        self.seq += 1
        e = Event(kind=kind, step=step, digest=digest, seq=self.seq, time_ms=self.seq, **extra)
        await self.store.append_events(node, [e])
        await self.orch.on_events(rec, [e])

    def sent(self, node: str) -> list[Any]:
        q = self.sessions[node].outbox
        out = []
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def split(self, node: str) -> tuple[list[Any], list[Any]]:
        """(tasks, releases) sent to ``node`` since the last look (label tasks left out)."""
        msgs = self.sent(node)
        tasks = [
            m.command.task.step
            for m in msgs
            if m.WhichOneof("kind") == "command" and not m.command.task.step.name.startswith("label-")
        ]
        releases = [m.release for m in msgs if m.WhichOneof("kind") == "release"]
        return tasks, releases

    async def gate(self, rec: NodeRecord, step: str) -> None:
        await self.orch.gate_requested(rec, step, self.digest(rec.name, step))


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", SPEC, "holodeck.nvidia.com/v1alpha1", {})
    yield Lab(store, tmp_path)
    await store.close()


async def test_a_node_not_in_the_cluster_yet_passes_both_gates_at_once(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker")
    for step in (DRAIN_STEP, UNCORDON_STEP):
        await lab.gate(w1, step)
        _, releases = lab.split("w-1")
        assert [(r.step, r.digest) for r in releases] == [(step, lab.digest("w-1", step))]
        assert releases[0].env[GATE_RESULT] == GATE_DONE
        assert "has not joined the cluster yet" in releases[0].env[GATE_MESSAGE]
        assert not releases[0].secret_env
    assert lab.split("cp-1")[0] == []  # nothing was asked of the control plane


async def test_a_joined_worker_is_drained_by_a_control_plane_before_its_gate_opens(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker", joined=True)
    lab.sent("cp-1")
    await lab.gate(w1, DRAIN_STEP)
    assert lab.split("w-1") == ([], [])  # not before the control plane answered
    (task,), _ = lab.split("cp-1")
    assert task.name == "drain-w-1" and dict(task.env)["NODE"] == "w-1"
    assert 'kubectl cordon "$NODE"' in task.script
    assert 'kubectl drain "$NODE" --ignore-daemonsets --delete-emptydir-data' in task.script
    # Events of another task, or from another node, answer nothing.
    await lab.event("cp-1", EventKind.SUCCEEDED, "task:drain-w-1", "0" * 64)
    await lab.event("w-1", EventKind.SUCCEEDED, "task:drain-w-1", task.digest)
    assert lab.split("w-1") == ([], [])
    await lab.event("cp-1", EventKind.SUCCEEDED, "task:drain-w-1", task.digest)
    _, (release,) = lab.split("w-1")
    assert release.step == DRAIN_STEP and release.env[GATE_RESULT] == GATE_DONE
    assert "kubectl drain done (on cp-1)" in release.env[GATE_MESSAGE]

    await lab.gate(w1, UNCORDON_STEP)
    (task,), _ = lab.split("cp-1")
    assert task.name == "uncordon-w-1" and 'kubectl uncordon "$NODE"' in task.script
    await lab.event("cp-1", EventKind.SUCCEEDED, "task:uncordon-w-1", task.digest)
    _, (release,) = lab.split("w-1")
    assert release.step == UNCORDON_STEP and release.env[GATE_RESULT] == GATE_DONE


async def test_a_failed_drain_fails_the_gate_with_kubectls_reason(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker", joined=True)
    lab.sent("cp-1")
    await lab.gate(w1, DRAIN_STEP)
    (task,), _ = lab.split("cp-1")
    said = (
        "evicting pod default/web-1",
        "error: cannot evict pod as it would violate the pod's disruption budget",
    )
    await lab.event("cp-1", EventKind.OUTPUT, "task:drain-w-1", task.digest, lines=said)
    await lab.event(
        "cp-1", EventKind.FAILED, "task:drain-w-1", task.digest, exit_code=1, message="exit code 1"
    )
    _, (release,) = lab.split("w-1")
    assert release.env[GATE_RESULT] != GATE_DONE
    message = release.env[GATE_MESSAGE]
    assert message.startswith("kubectl drain of w-1 failed on cp-1: exit code 1")
    assert "disruption budget" in message and "tetherctl events --node cp-1" in message


async def test_control_planes_are_drained_by_another_one_and_a_lone_one_drains_itself(lab: Lab) -> None:
    cp1 = await lab.node("cp-1", "control-plane", joined=True)
    lab.sent("cp-1")
    await lab.gate(cp1, DRAIN_STEP)
    (task,), _ = lab.split("cp-1")
    assert task.name == "drain-cp-1"  # alone: it runs kubectl for itself
    cp2 = await lab.node("cp-2", "control-plane", joined=True)
    lab.sent("cp-1"), lab.sent("cp-2")
    await lab.gate(cp1, DRAIN_STEP)
    assert lab.split("cp-1")[0] == [] and [t.name for t in lab.split("cp-2")[0]] == ["drain-cp-1"]
    await lab.gate(cp2, DRAIN_STEP)
    assert [t.name for t in lab.split("cp-1")[0]] == ["drain-cp-2"]


async def test_with_no_control_plane_connected_the_gate_waits_for_one(lab: Lab) -> None:
    cp1 = await lab.node("cp-1", "control-plane", joined=True, connect=False)
    w1 = await lab.node("w-1", "worker", joined=True)
    await lab.gate(w1, DRAIN_STEP)
    assert lab.split("w-1") == ([], [])
    lab.sessions["cp-1"] = lab.hub.attach("cp-1", "c1")
    await lab.orch.on_connect(cp1)
    assert [t.name for t in lab.split("cp-1")[0]] == ["drain-w-1"]


async def test_a_node_stays_a_member_when_a_later_plan_changes_its_join_step(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker", joined=True)
    lab.sent("cp-1")
    changed = Plan.build([*plan(JOIN_STEP, "containerd v2").steps[:3], Step(name=JOIN_STEP, script="new")])
    await lab.store.set_node_plan("w-1", changed)
    assert next(s.state for s in lab.store.node_steps("w-1") if s.name == JOIN_STEP) == "pending"
    await lab.gate(w1, DRAIN_STEP)
    assert [t.name for t in lab.split("cp-1")[0]] == ["drain-w-1"]
    # A machine enrolled afresh under the name has joined nothing.
    await lab.orch.forget_node("c1", "w-1")
    await lab.gate(w1, DRAIN_STEP)
    assert lab.split("w-1")[1][0].env[GATE_RESULT] == GATE_DONE and lab.split("cp-1")[0] == []


async def test_requests_for_other_digests_and_revoked_nodes_get_nothing(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker")
    await lab.orch.gate_requested(w1, DRAIN_STEP, "f" * 64)
    assert lab.split("w-1") == ([], [])
    await lab.store.update_node("w-1", revoked=True)
    await lab.gate(w1, DRAIN_STEP)
    assert lab.split("w-1") == ([], [])


async def test_the_answer_of_a_drain_task_is_acknowledged_quietly(lab: Lab) -> None:
    cp1 = await lab.node("cp-1", "control-plane", joined=True)
    assert await lab.orch.secrets_received(cp1, "drain-w-1", {}, "drain-0123456789abcdef", {})


async def test_a_task_that_never_answers_fails_the_gate() -> None:
    hub = Hub()
    runner_session, node_session = hub.attach("cp-1", "c1"), hub.attach("w-1", "c1")
    rec = NodeRecord("w-1", "c1", "worker", "f", "k", "t", 1)
    drainer = Drainer(
        hub, live=lambda n: rec, member=lambda n: True, runner=lambda e, n: "cp-1", lost_after_seconds=0.05
    )
    await drainer.gate_requested(rec, DRAIN_STEP, "d" * 64)
    assert runner_session.outbox.get_nowait().command.task.step.name == "drain-w-1"
    assert drainer.pending("w-1") == "drain@cp-1"
    await asyncio.sleep(0.2)
    release = node_session.outbox.get_nowait().release
    assert release.digest == "d" * 64 and release.env[GATE_RESULT] != GATE_DONE
    assert "no answer from cp-1 to kubectl drain within 0.05s" in release.env[GATE_MESSAGE]
    assert drainer.pending("w-1") == ""
