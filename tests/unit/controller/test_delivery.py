"""Cross-replica delivery (``tether.controller.replicas.delivery``) with two in-process replicas
on one store: what one replica does reaches the agent streaming to the other."""

from __future__ import annotations

import asyncio
import base64
import json
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.controller.replica_fakes import Bus, Replica, replica
from tests.unit.controller.test_store import ev, node, token
from tether.controller import wire
from tether.controller.agent_service import plain
from tether.controller.hub import Session
from tether.controller.nodestate import node_state
from tether.controller.replicas import intents
from tether.controller.replicas.delivery import TOPIC, install
from tether.controller.spec import load_document
from tether.controller.store import SqliteStore, StoreChange
from tether.nodeagent.model import EventKind, HostFacts, Plan, Step, now_ms

DOC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata: {name: e}
spec:
  customTemplates:
    - {name: hello, phase: pre-install, inline: "echo %s"}
"""

UBUNTU = HostFacts(os_id="ubuntu", os_version_id="22.04", os_family="debian", arch="amd64")


async def wait_for(check: Callable[[], Any], timeout: float = 2.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    bus = Bus()
    a = await replica(tmp_path / "t.db", tmp_path, bus)
    b = await replica(tmp_path / "t.db", tmp_path, bus)
    yield a, b
    for r in (a, b):
        await r.close()


async def apply(r: Replica, greeting: str) -> int:
    document = DOC % greeting
    loaded = load_document(document)
    record, _ = await r.app.store.put_environment("e", document, loaded.api_version, loaded.normalized)
    r.app.planner.remember(record, loaded)
    return int(record.generation)


async def streaming(r: Replica, name: str = "n1") -> Session:
    """``name`` enrolled, its plan delivered, and its stream open on ``r``."""
    await r.app.store.put_token(token(id=f"tok-{name}"))
    await r.app.store.enroll_node(
        f"tok-{name}", name, lambda t, e: (node(name, token_id=f"tok-{name}"), True)
    )
    await r.app.store.update_node(name, facts=plain(UBUNTU))  # its hello
    session = r.hub.attach(name, "e")
    await r.agents.push_plan(name)
    await r.delivery.streams.flush()
    return session


def sent(session: Session, kind: str) -> list[Any]:
    out = []
    while not session.outbox.empty():
        msg = session.outbox.get_nowait()
        if msg.WhichOneof("kind") == kind:
            out.append(getattr(msg, kind))
    return out


async def test_a_node_streaming_to_one_replica_is_connected_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await apply(a, "one")
    session = await streaming(b)
    await wait_for(lambda: a.hub.connected("n1"))
    assert a.hub.session("n1") is None  # the stream itself is on b
    record = a.app.store.get_node("n1")
    assert node_state(record, a.app.store.node_steps("n1"), a.hub.connected("n1")).value == "provisioning"
    assert a.app.watch is not None and a.app.watch.state("n1") == "provisioning"  # WatchNodes on a
    b.hub.detach(session)
    await b.delivery.streams.flush()
    await wait_for(lambda: not a.hub.connected("n1"))
    assert a.app.watch.state("n1") == "offline"


async def test_a_dead_replicas_streams_count_as_gone_once_it_is_stale(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    await streaming(b)
    await wait_for(lambda: a.hub.connected("n1"))
    await b.register(now_ms() - 60_000)  # b stopped reporting a minute ago
    a.delivery.streams.alive._known.clear()  # (it reads the registry at most once a second)
    assert not a.hub.connected("n1")
    await a.delivery.streams.sweep()
    assert a.app.watch is not None and a.app.watch.state("n1") == "offline"


async def test_a_rerun_through_one_replica_reaches_the_agent_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await apply(a, "one")
    session = await streaming(b)
    await wait_for(lambda: a.hub.connected("n1"))
    sent(session, "plan")
    rerun = wire.agent.Command(id="rerun-1", rerun=wire.agent.Rerun(steps=["hello"]))
    assert a.hub.send("n1", wire.agent.ControllerMessage(command=rerun))
    (command,) = await wait_for(lambda: sent(session, "command"))
    assert command == rerun
    notice = wire.agent.Notice(step="hello", message="released by ci")
    assert a.hub.send("n1", wire.agent.ControllerMessage(notice=notice))
    assert (await wait_for(lambda: sent(session, "notice"))) == [notice]
    assert not a.hub.send("nobody", wire.agent.ControllerMessage(notice=notice))  # no stream anywhere


async def test_an_apply_on_one_replica_hands_the_new_plan_to_an_agent_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await apply(a, "one")
    session = await streaming(b)
    (first,) = sent(session, "plan")
    await wait_for(lambda: a.hub.connected("n1"))
    generation = await apply(a, "two")
    await a.agents.push_plan("n1")  # what a's rollout does for the node
    (plan,) = await wait_for(lambda: sent(session, "plan"), timeout=1.0)
    assert plan.generation == generation and plan.digest != first.digest
    assert any("echo two" in s.script for s in plan.steps)
    assert plan.digest == a.app.store.get_node("n1").plan_digest  # what a chose and stored
    published = " ".join(p for _, p in a.store._bus.published)
    assert "echo two" not in published  # an intent names the plan; b renders it


async def test_another_replicas_document_is_parsed_off_the_loop(
    pair: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    generation = await apply(a, "three")
    record = await wait_for(lambda: b.app.store.get_environment("e"))
    await wait_for(lambda: ("e", generation) in b.app.planner._specs)
    monkeypatch.setattr("tether.controller.planner.load_document", pytest.fail)
    assert b.app.planner.spec(record).spec.name == "e"  # parsed already


async def test_a_revoke_on_one_replica_closes_the_stream_on_the_other(pair: tuple[Replica, Replica]) -> None:
    a, b = pair
    session = await streaming(b)
    await a.app.store.update_node("n1", revoked=True)  # RevokeNode on a
    await wait_for(session.closed.is_set)


async def test_a_node_deleted_through_one_replica_loses_its_stream_on_the_other(
    pair: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tether.controller.replicas.delivery.RESET_CLOSE_GRACE_SECONDS", 0.01)
    a, b = pair
    session = await streaming(b)
    assert b.app.watch is not None and b.app.watch.state("n1")
    await a.app.store.delete_node("n1")  # node delete (or a reset done) on a
    await wait_for(session.closed.is_set)
    assert not b.app.watch.state("n1")  # WatchNodes on b: deleted


async def test_events_stored_by_one_replica_reach_followers_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await streaming(b)
    follower = a.hub.follow(["node:n1"])
    await b.app.store.append_events("n1", [ev(1), ev(2, EventKind.STARTED, "hello")])
    got = [await asyncio.wait_for(follower.get(), 1.0) for _ in range(2)]
    assert [(e.node, e.seq) for e in got] == [("n1", 1), ("n1", 2)]
    env_follower = a.hub.follow(["env:e"])
    await b.app.store.append_events("n1", [ev(3)])
    assert (await asyncio.wait_for(env_follower.get(), 1.0)).seq == 3
    assert (await asyncio.wait_for(follower.get(), 1.0)).seq == 3


async def test_nothing_is_read_for_events_nobody_follows(
    pair: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    await streaming(b)

    async def no_reads(*args: Any) -> Any:
        raise AssertionError("read events nobody follows")

    monkeypatch.setattr(a.store._inner, "list_events", no_reads)
    await b.app.store.append_events("n1", [ev(1)])
    await asyncio.sleep(0.05)
    assert a.delivery.events._seen["n1"] == 1


def test_secrets_and_capabilities_never_travel() -> None:
    release = wire.agent.Release(step="kubeadm-join", digest="d", secret_env={"TOKEN": "s3cret"})
    assert intents.for_message("n1", wire.agent.ControllerMessage(release=release)) is None
    refresh = wire.agent.Command(id="refresh-abcdef", task=wire.agent.RunTask())
    assert intents.for_message("n1", wire.agent.ControllerMessage(command=refresh)) is None
    ack = wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=3))
    assert intents.for_message("n1", ack) is None
    plan = wire.plan_to_pb(Plan.build([Step(name="a", script="echo a" * 1000)], generation=4))
    intent = intents.for_message("n1", wire.agent.ControllerMessage(plan=plan))
    assert intent is not None and intent.fields == {"g": 4, "d": plan.digest}
    opened = wire.agent.Release(step="drain", digest="d", env={"RESULT": "done"})
    intent = intents.for_message("n1", wire.agent.ControllerMessage(release=opened))
    assert intent is not None and intents.message_of(intent).release == opened


async def test_the_holder_hands_on_only_messages_that_may_travel(pair: tuple[Replica, Replica]) -> None:
    """Defence in depth: a message intent that arrives (a correctly signed notice, or a bug) is
    handed to the agent only if ``for_message`` could have sent it: no join material, no
    capability, no answer meant for one stream, nothing that does not parse."""
    _, b = pair
    session = await streaming(b)
    sent(session, "plan")

    def carrying(msg: wire.agent.ControllerMessage) -> dict[str, Any]:
        packed = base64.b64encode(zlib.compress(msg.SerializeToString())).decode()
        return intents.Intent("n1", intents.MESSAGE, {"b": packed}).to_json()

    release = wire.agent.Release(step="kubeadm-join", digest="d", secret_env={"TOKEN": "s3cret"})
    refresh = wire.agent.Command(id="refresh-abcdef", task=wire.agent.RunTask())
    welcome = wire.agent.Welcome(node_name="n1")
    forbidden = [
        wire.agent.ControllerMessage(release=release),
        wire.agent.ControllerMessage(command=refresh),
        wire.agent.ControllerMessage(welcome=welcome),
        wire.agent.ControllerMessage(ack=wire.agent.Ack(seq=99)),
    ]
    notice = wire.agent.Notice(step="hello", message="fine")
    docs = [carrying(m) for m in forbidden] + [{"n": "n1", "k": intents.MESSAGE, "b": "not base64!"}]
    docs.append(carrying(wire.agent.ControllerMessage(notice=notice)))
    b.delivery.on_store_change(StoreChange("message", TOPIC, payload=json.dumps(docs)))
    got = []
    while not session.outbox.empty():
        got.append(session.outbox.get_nowait())
    assert got == [wire.agent.ControllerMessage(notice=notice)]


def test_intents_are_packed_under_the_payload_limit() -> None:
    many = [intents.refresh(f"node-{i:04d}", "env", i % 2 == 0) for i in range(500)]
    payloads = intents.pack(many)
    assert len(payloads) > 1 and all(len(p) <= intents.PAYLOAD_BYTES for p in payloads)
    assert [i for p in payloads for i in intents.unpack(p)] == many
    assert intents.unpack("not json") == [] and json.loads(payloads[0])[0]["n"] == "node-0000"


async def test_one_replica_on_sqlite_has_no_delivery(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    try:
        app: Any = type("A", (), {"store": store})()
        assert install(app, None) is None  # type: ignore[arg-type]
    finally:
        await store.close()


async def test_a_reset_through_one_replica_hands_the_reset_plan_to_the_agent_on_the_other(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    await apply(a, "one")
    session = await streaming(b)
    sent(session, "plan")
    await wait_for(lambda: a.hub.connected("n1"))
    record = a.app.store.get_node("n1")
    assert await a.agents.resets.start(record, "ci")  # ResetNode on a
    await a.agents.push_plan("n1")
    (plan,) = await wait_for(lambda: sent(session, "plan"), timeout=1.0)
    assert plan.deprovision and plan.digest == a.app.store.get_node("n1").plan_digest


async def test_a_plan_that_does_not_render_the_same_on_the_holder_is_replaced_by_its_own(
    pair: tuple[Replica, Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tether.controller.replicas.delivery.PLAN_WAIT_SECONDS", 0.2)
    a, b = pair
    generation = await apply(a, "one")
    session = await streaming(b)
    (own,) = sent(session, "plan")
    await wait_for(lambda: a.hub.connected("n1"))
    odd = Plan.build([Step(name="x", script="true")], generation=generation, environment="e", role="worker")
    await a.app.store.set_node_plan("n1", odd)  # a plan b cannot render (a's rollout, its clock ...)
    assert a.hub.send("n1", a.agents.plan_message(odd))
    (plan,) = await wait_for(lambda: sent(session, "plan"), timeout=1.0)  # after its wait
    assert plan.digest == own.digest  # what b renders, stored and sent; never one b cannot name
    assert b.app.store.get_node("n1").plan_digest == own.digest


async def test_an_agent_that_moved_to_another_replica_loses_its_half_dead_stream_here(
    pair: tuple[Replica, Replica],
) -> None:
    a, b = pair
    old = await streaming(b)
    old.last_seen -= 10  # nothing heard on it for ten seconds: the agent reconnected to a
    new = a.hub.attach("n1", "e")
    await a.delivery.streams.flush()
    await wait_for(old.closed.is_set)
    assert not new.closed.is_set()
    quiet = await streaming(b, "n2")  # an agent that talks on its stream keeps it
    a.hub.attach("n2", "e")
    await a.delivery.streams.flush()
    await asyncio.sleep(0.05)
    assert not quiet.closed.is_set()
