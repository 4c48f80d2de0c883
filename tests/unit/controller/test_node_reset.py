"""Letting a node go: the store forgets it, the reset plan, and the gates a reset passes."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.controller.test_drain_gates import SPEC, Lab
from tests.unit.controller.test_store import enroll, ev, node, token
from tether.controller.cluster.context import (
    DELETE_NODE_GATE,
    DELETE_NODE_STEP,
    DRAIN_GATE,
    DRAIN_STEP,
    GATE_DONE,
    GATE_MESSAGE,
    GATE_RESULT,
)
from tether.controller.render.deprovision import KUBEADM_RESET_STEP, render_deprovision
from tether.controller.store import SqliteStore
from tether.nodeagent import wire
from tether.nodeagent.executor import plan_from_json, plan_to_json
from tether.nodeagent.model import EventKind, Plan, Step


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db")
    yield s
    await s.close()


async def test_a_node_enrolled_again_after_delete_starts_a_fresh_history(store: SqliteStore) -> None:
    await enroll(store, "n1")
    await store.append_events("n1", [ev(1), ev(2), ev(3)])
    await store.delete_node("n1")
    await store.put_token(token(id="tok-again"))
    await store.enroll_node("tok-again", "n1", lambda t, e: (node("n1", token_id="tok-again"), True))
    assert store.get_node("n1") is not None and await store.list_events("n1") == []
    assert await store.append_events("n1", [ev(1)]) == 1


def test_a_plain_node_is_reset_by_the_agent_alone() -> None:
    plan = render_deprovision(environment="e", role="worker", generation=4, kubeadm_cluster=False)
    assert plan.deprovision and plan.steps == () and plan.generation == 4
    assert plan.digest != Plan.build([], generation=4).digest  # not the same as an empty plan


def test_a_kubeadm_node_drains_resets_and_is_deleted_by_another_control_plane() -> None:
    plan = render_deprovision(environment="c", role="worker", generation=2, kubeadm_cluster=True)
    assert plan.deprovision
    assert [(s.name, s.gate) for s in plan.steps] == [
        (DRAIN_STEP, DRAIN_GATE),
        (KUBEADM_RESET_STEP, ""),
        (DELETE_NODE_STEP, DELETE_NODE_GATE),
    ]
    reset = plan.steps[1].script
    assert "kubeadm reset -f" in reset and "rm -rf /etc/cni/net.d" in reset
    for step in plan.steps:
        assert step.digest and step.phase == "reset"
        subprocess.run(["bash", "-n"], input=step.script, text=True, check=True)
    again = render_deprovision(environment="c", role="worker", generation=2, kubeadm_cluster=True)
    assert again.digest == plan.digest  # pure: the same plan every time


def test_the_reset_flag_survives_the_wire_and_the_journal() -> None:
    plan = render_deprovision(environment="c", role="worker", generation=2, kubeadm_cluster=True)
    assert wire.plan_from_pb(wire.plan_to_pb(plan)) == plan
    assert plan_from_json(plan_to_json(plan)) == plan
    ordinary = Plan.build([Step(name="a", script="true")])
    assert not wire.plan_from_pb(wire.plan_to_pb(ordinary)).deprovision


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", SPEC, "holodeck.nvidia.com/v1alpha1", {})
    yield Lab(store, tmp_path)
    await store.close()


def reset_plan(role: str) -> Plan:
    return render_deprovision(environment="c1", role=role, generation=1, kubeadm_cluster=True)


async def test_a_reset_worker_is_drained_then_deleted_by_a_control_plane(lab: Lab) -> None:
    await lab.node("cp-1", "control-plane", joined=True)
    w1 = await lab.node("w-1", "worker", joined=True)
    await lab.store.set_node_plan("w-1", reset_plan("worker"))  # what a reset hands the node
    lab.sent("cp-1")
    await lab.gate(w1, DRAIN_STEP)
    (task,), _ = lab.split("cp-1")
    assert task.name == "drain-w-1"  # still a member: its join step is gone, its mark is not
    await lab.event("cp-1", EventKind.SUCCEEDED, "task:drain-w-1", task.digest)
    assert lab.split("w-1")[1][0].env[GATE_RESULT] == GATE_DONE

    await lab.gate(w1, DELETE_NODE_STEP)
    assert lab.split("w-1") == ([], [])
    (task,), _ = lab.split("cp-1")
    assert task.name == "delete-node-w-1" and 'kubectl delete node "$NODE"' in task.script
    assert dict(task.env)["NODE"] == "w-1"
    await lab.event("cp-1", EventKind.SUCCEEDED, "task:delete-node-w-1", task.digest)
    _, (release,) = lab.split("w-1")
    assert release.step == DELETE_NODE_STEP and release.env[GATE_RESULT] == GATE_DONE
    assert "kubectl delete-node done (on cp-1)" in release.env[GATE_MESSAGE]


async def test_the_last_control_plane_has_no_node_object_left_to_delete(lab: Lab) -> None:
    cp1 = await lab.node("cp-1", "control-plane", joined=True)
    await lab.store.set_node_plan("cp-1", reset_plan("control-plane"))
    lab.sent("cp-1")
    await lab.gate(cp1, DELETE_NODE_STEP)
    tasks, (release,) = lab.split("cp-1")
    assert tasks == []  # its own API server went with kubeadm reset: it is not asked
    assert release.env[GATE_RESULT] == GATE_DONE and "last control plane" in release.env[GATE_MESSAGE]


async def test_a_control_plane_waits_for_another_one_to_delete_it(lab: Lab) -> None:
    cp1 = await lab.node("cp-1", "control-plane", joined=True)
    cp2 = await lab.node("cp-2", "control-plane", joined=True, connect=False)
    await lab.store.set_node_plan("cp-1", reset_plan("control-plane"))
    lab.sent("cp-1")
    await lab.gate(cp1, DELETE_NODE_STEP)
    assert lab.split("cp-1") == ([], [])  # cp-2 exists but is offline: the gate waits for it
    lab.sessions["cp-2"] = lab.hub.attach("cp-2", "c1")
    await lab.orch.on_connect(cp2)
    assert [t.name for t in lab.split("cp-2")[0]] == ["delete-node-cp-1"]
