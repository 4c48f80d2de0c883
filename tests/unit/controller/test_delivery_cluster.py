"""Cluster gates across two replicas: the node at a gate streams to one, the control plane that
answers (kubectl tasks, join material) to the other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.controller.replica_fakes import Bus, Replica, replica
from tests.unit.controller.test_cluster import OUTPUTS
from tests.unit.controller.test_delivery import wait_for
from tests.unit.controller.test_drain_gates import SPEC, plan
from tether.controller.cluster import material as m
from tether.controller.cluster.context import DRAIN_STEP, GATE_DONE, GATE_RESULT, INIT_STEP, JOIN_STEP
from tether.controller.cluster.orchestrator import ELSEWHERE
from tether.controller.hub import Session
from tether.controller.store import NodeRecord
from tether.controller.tokens import TokenRecord
from tether.nodeagent.model import Event, EventKind


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    bus = Bus()
    a = await replica(tmp_path / "t.db", tmp_path, bus)
    b = await replica(tmp_path / "t.db", tmp_path, bus)
    await a.app.store.put_environment("c1", SPEC, "holodeck.nvidia.com/v1alpha1", {})
    yield a, b
    for r in (a, b):
        await r.close()


class Seq:
    n = 0


async def member(r: Replica, name: str, role: str, *, joined: bool) -> tuple[NodeRecord, Session]:
    """``name`` enrolled, with a plan, streaming to ``r``; ``joined``: its init/join step succeeded."""
    store = r.app.store
    await store.put_token(TokenRecord(f"t-{name}", "h", "c1", role, "", 10**15, 1, 0, False, 1))
    rec = NodeRecord(name, "c1", role, "f", "k", f"t-{name}", 1)
    await store.enroll_node(f"t-{name}", name, lambda t, e: (rec, True))
    ctx = await r.app.cluster.context(rec)
    assert ctx is not None
    step = INIT_STEP if ctx.control_plane and r.app.cluster.init_node("c1") == name else JOIN_STEP
    await store.set_node_plan(name, plan(step))
    session = r.hub.attach(name, "c1")
    await r.delivery.streams.flush()
    if joined:
        await event(r, name, EventKind.SUCCEEDED, step, digest(r, name, step))
    return rec, session


def digest(r: Replica, node: str, step: str) -> str:
    return next(s.digest for s in r.app.store.node_steps(node) if s.name == step)


async def event(r: Replica, node: str, kind: EventKind, step: str, digest: str) -> None:
    """What ``r``'s agent service does with an event of ``node`` (streaming to ``r``)."""
    rec = r.app.store.get_node(node)
    assert rec is not None
    Seq.n += 1
    e = Event(kind=kind, step=step, digest=digest, seq=Seq.n, time_ms=Seq.n)
    await r.app.store.append_events(node, [e])
    await r.app.cluster.on_events(rec, [e])


def taken(session: Session, kind: str) -> list[Any]:
    out = []
    while not session.outbox.empty():
        msg = session.outbox.get_nowait()
        if msg.WhichOneof("kind") == kind:
            out.append(getattr(msg, kind))
    return out


def tasks(session: Session, name: str) -> list[Any]:
    return [c for c in taken(session, "command") if c.task.step.name.startswith(name)]


async def test_a_drain_gate_on_one_replica_is_answered_by_a_control_plane_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    _, cp1 = await member(b, "cp-1", "control-plane", joined=True)
    w1, w1_session = await member(a, "w-1", "worker", joined=True)
    await wait_for(lambda: a.hub.connected("cp-1"))
    await a.app.cluster.gate_requested(w1, DRAIN_STEP, digest(a, "w-1", DRAIN_STEP))
    (task,) = await wait_for(lambda: tasks(cp1, "drain-w-1"))  # the kubectl task, on b's stream
    await event(b, "cp-1", EventKind.SUCCEEDED, f"task:{task.task.step.name}", task.task.step.digest)
    (release,) = await wait_for(lambda: taken(w1_session, "release"))  # a's gate opens
    assert release.step == DRAIN_STEP and release.env[GATE_RESULT] == GATE_DONE


async def test_join_material_stored_through_one_replica_releases_a_waiter_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    cp1, cp1_session = await member(b, "cp-1", "control-plane", joined=True)
    w1, w1_session = await member(a, "w-1", "worker", joined=False)
    await wait_for(lambda: a.hub.connected("cp-1"))
    # The cluster exists but no material is stored: a asks cp-1 for some, through b (b's own id).
    await a.app.cluster.gate_requested(w1, JOIN_STEP, digest(a, "w-1", JOIN_STEP))
    assert a.app.cluster._envs["c1"].waiters
    (refresh,) = await wait_for(lambda: tasks(cp1_session, "refresh-join-material"))
    assert refresh.id == b.app.cluster._envs["c1"].refresh_id
    assert a.app.cluster._envs["c1"].refresh_id.startswith(ELSEWHERE)
    assert taken(w1_session, "release") == []
    fresh = {**OUTPUTS, m.TOKEN: "zzzzzz.0123456789zzzzzz"}
    assert await b.app.cluster.secrets_received(cp1, "refresh-join-material", fresh, refresh.id)
    (release,) = await wait_for(lambda: taken(w1_session, "release"))
    assert release.secret_env[m.TOKEN] == "zzzzzz.0123456789zzzzzz"
    published = " ".join(p for _, p in a.store._bus.published)
    assert "zzzzzz" not in published and refresh.id not in published  # no secret, no capability
