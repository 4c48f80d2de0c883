"""Issue 14: control planes join one at a time (stacked etcd members added in parallel is a known
kubeadm failure), workers in parallel; the order holds across a controller restart."""

from __future__ import annotations

import json

import pytest

from tests.unit.controller.test_cluster import CERT_KEY, SPEC, Cluster
from tether.controller.cluster import material as m
from tether.controller.cluster import orchestrator
from tether.controller.cluster.context import INIT_STEP, JOIN_STEP, Position, context_for
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.render import NodeContext, render
from tether.controller.render.targets import facts_for
from tether.controller.spec import load_document
from tether.controller.store import NodeRecord
from tether.nodeagent.model import Event, EventKind, now_ms
from tether.nodeagent.secrets import Redactor


async def initialised(cluster: Cluster) -> NodeRecord:
    cp1 = await cluster.node("cp-1", "control-plane")
    assert await cluster.init(cp1)
    await cluster.succeed("cp-1", INIT_STEP, 1)
    cluster.sent("cp-1")  # the label task
    return cp1


async def ask(cluster: Cluster, node: NodeRecord, attempt: int = 1) -> None:
    await cluster.orch.gate_requested(node, JOIN_STEP, cluster.digest(node.name), attempt)


async def end(cluster: Cluster, node: str, kind: EventKind, seq: int, *, will_retry: bool = False) -> None:
    """The node's kubeadm-join ended (or one attempt did), as its agent reports it."""
    rec = cluster.store.get_node(node)
    assert rec is not None
    event = Event(
        kind=kind,
        step=JOIN_STEP,
        digest=cluster.digest(node),
        seq=seq,
        time_ms=now_ms(),
        will_retry=will_retry,
    )
    await cluster.store.append_events(node, [event])
    await cluster.orch.on_events(rec, [event])


def released(cluster: Cluster, *names: str) -> list[str]:
    return [n for n in names if cluster.releases(n)]


async def test_control_planes_join_one_at_a_time_and_workers_at_once(cluster: Cluster) -> None:
    cp1 = await cluster.node("cp-1", "control-plane")
    cp2 = await cluster.node("cp-2", "control-plane")
    cp3 = await cluster.node("cp-3", "control-plane")
    w1 = await cluster.node("w-1", "worker")
    w2 = await cluster.node("w-2", "worker")
    for node in (cp2, cp3, w1, w2):
        await ask(cluster, node)
    assert await cluster.init(cp1)  # the material arrives: everyone waiting is looked at
    await cluster.succeed("cp-1", INIT_STEP, 1)
    assert released(cluster, "w-1", "w-2") == ["w-1", "w-2"]  # workers in parallel
    first = released(cluster, "cp-2", "cp-3")
    assert first == ["cp-2"]  # one control plane, in the order they asked
    assert cluster.orch.join_slot_holder("c1") == "cp-2"
    # A control plane asking now waits too, even with usable material.
    cp4 = await cluster.node("cp-4", "control-plane")
    await ask(cluster, cp4)
    assert released(cluster, "cp-3", "cp-4") == []
    # cp-2's join succeeded: the next one (and only it) gets the material, with the certificate key.
    await end(cluster, "cp-2", EventKind.SUCCEEDED, 5)
    got = cluster.releases("cp-3")
    assert len(got) == 1 and got[0][m.CERT_KEY] == CERT_KEY
    assert cluster.releases("cp-4") == []
    assert cluster.orch.join_slot_holder("c1") == "cp-3"
    # A failed attempt that will be retried keeps the slot: the retry asks again and gets it back.
    await end(cluster, "cp-3", EventKind.FAILED, 6, will_retry=True)
    assert cluster.releases("cp-4") == [] and cluster.orch.join_slot_holder("c1") == "cp-3"
    await ask(cluster, cp3, attempt=2)  # it needs fresh material: a refresh is asked for
    (task,) = [
        msg.command
        for msg in cluster.sent("cp-1")
        if msg.WhichOneof("kind") == "command" and msg.command.task.step.name == "refresh-join-material"
    ]
    fresh = {m.TOKEN: "zzzzzz.0123456789zzzzzz", m.CA_HASH: "sha256:" + "a" * 64, m.CERT_KEY: "d" * 64}
    await cluster.orch.secrets_received(cp1, "refresh-join-material", fresh, task.id)
    assert cluster.releases("cp-3")[0][m.TOKEN] == "zzzzzz.0123456789zzzzzz"
    assert cluster.releases("cp-4") == []
    # Its last attempt failed: the slot is free, the next control plane joins.
    await end(cluster, "cp-3", EventKind.FAILED, 7)
    assert cluster.releases("cp-4")[0][m.CERT_KEY] == "d" * 64
    assert cluster.orch.join_slot_holder("c1") == "cp-4"


async def test_a_worker_never_waits_for_a_joining_control_plane(cluster: Cluster) -> None:
    await initialised(cluster)
    cp2 = await cluster.node("cp-2", "control-plane")
    await ask(cluster, cp2)
    assert cluster.orch.join_slot_holder("c1") == "cp-2"
    w1 = await cluster.node("w-1", "worker")
    await ask(cluster, w1)
    assert len(cluster.releases("w-1")) == 1


async def test_the_slot_survives_a_controller_restart(cluster: Cluster) -> None:
    await initialised(cluster)
    cp2 = await cluster.node("cp-2", "control-plane")
    cp3 = await cluster.node("cp-3", "control-plane")
    await ask(cluster, cp2)
    assert len(cluster.releases("cp-2")) == 1
    # The controller restarts while cp-2 joins: a new orchestrator over the same store, and every
    # agent asks again on reconnect (cp-3 first).
    cluster.orch = Orchestrator(cluster.store, cluster.hub, cluster.box, Redactor())
    await ask(cluster, cp3)
    assert cluster.releases("cp-3") == []  # never two at once, whatever the order of reconnects
    await ask(cluster, cp2)
    assert len(cluster.releases("cp-2")) == 1  # the holder gets its material again
    await end(cluster, "cp-2", EventKind.SUCCEEDED, 5)
    assert len(cluster.releases("cp-3")) == 1


async def test_a_join_that_ended_while_the_controller_was_away_frees_the_slot(cluster: Cluster) -> None:
    await initialised(cluster)
    cp2 = await cluster.node("cp-2", "control-plane")
    cp3 = await cluster.node("cp-3", "control-plane")
    await ask(cluster, cp2)
    # cp-2's success was stored, but the controller stopped before it looked at the event.
    done = Event(
        kind=EventKind.SUCCEEDED, step=JOIN_STEP, digest=cluster.digest("cp-2"), seq=5, time_ms=now_ms()
    )
    await cluster.store.append_events("cp-2", [done])
    cluster.orch = Orchestrator(cluster.store, cluster.hub, cluster.box, Redactor())
    await ask(cluster, cp3)
    assert len(cluster.releases("cp-3")) == 1
    assert cluster.orch.join_slot_holder("c1") == "cp-3"


async def test_a_revoked_or_reset_holder_frees_the_slot(cluster: Cluster) -> None:
    await initialised(cluster)
    cp2 = await cluster.node("cp-2", "control-plane")
    cp3 = await cluster.node("cp-3", "control-plane")
    cp4 = await cluster.node("cp-4", "control-plane")
    for node in (cp2, cp3, cp4):
        await ask(cluster, node)
    assert released(cluster, "cp-2", "cp-3", "cp-4") == ["cp-2"]
    await cluster.store.update_node("cp-2", revoked=True)
    await cluster.orch.node_revoked(cp2)
    assert released(cluster, "cp-3", "cp-4") == ["cp-3"]
    await cluster.orch.forget_node("c1", "cp-3")  # reset, or enrolled afresh under that name
    assert released(cluster, "cp-4") == ["cp-4"]


async def test_a_holder_that_never_reports_back_frees_the_slot_in_time(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    await initialised(cluster)
    cp2 = await cluster.node("cp-2", "control-plane")
    cp3 = await cluster.node("cp-3", "control-plane")
    await ask(cluster, cp2)
    await ask(cluster, cp3)
    assert cluster.releases("cp-3") == []
    # Its machine died mid-join: after longer than a join may take, the next one goes.
    key = "cluster/c1/" + orchestrator.CP_JOIN_SLOT
    raw = cluster.store.kv_get(key)
    assert raw is not None
    slot = json.loads(raw)
    slot["since_ms"] -= int(orchestrator.CP_JOIN_SLOT_S * 1000) + 1
    await cluster.store.kv_put(key, json.dumps(slot).encode())
    await cluster.orch._release_waiters("c1")  # what the re-check timer does
    assert len(cluster.releases("cp-3")) == 1


async def test_the_slot_outlasts_the_join_steps_own_timeout() -> None:
    spec = load_document(SPEC).spec
    assert spec.cluster is not None
    at = context_for(spec.cluster, Position.CONTROL_PLANE)
    join = render(spec, NodeContext("control-plane", facts_for("ubuntu-22.04"), at)).step(JOIN_STEP)
    assert join is not None
    # Each attempt asks for the gate again, which renews the holder's slot: one attempt must fit.
    assert join.timeout_seconds < orchestrator.CP_JOIN_SLOT_S
