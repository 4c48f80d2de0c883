"""Issue 13: the singleton work on replicas sharing a store. Rollouts are driven by the leader
only (commands taken elsewhere go to it), every replica sees the leader's rollouts, reset deadlines
are the leader's, and a control plane's join slot is taken once however stale a replica's view."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.controller.replica_fakes import Bus, Replica, replica
from tests.unit.controller.test_cluster import Cluster
from tests.unit.controller.test_cp_join_order import ask, initialised
from tests.unit.controller.test_delivery import apply, streaming
from tether.controller.cluster import orchestrator
from tether.controller.cluster.context import JOIN_STEP
from tether.controller.cluster.orchestrator import Orchestrator
from tether.controller.errors import ControllerError
from tether.controller.replicas import rollout_relay
from tether.controller.replicas.rollout_relay import NoLeader, RolloutRelay
from tether.controller.rollout import RolloutStatus
from tether.controller.secretbox import SecretBox
from tether.controller.store import SqliteStore
from tether.nodeagent.secrets import Redactor


async def wait_for(check: Callable[[], Any], timeout: float = 3.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


class Led:
    """Two replicas: ``a`` leads (its driver runs), ``b`` does not; each with its relay."""

    def __init__(self, a: Replica, b: Replica) -> None:
        self.a, self.b = a, b
        self.leading = {"a": True, "b": False}
        for name, r in (("a", a), ("b", b)):
            relay = RolloutRelay(r.store, r.app.rollouts, self._leads(name))
            r.app.rollouts.relay = relay
            r.store.subscribe(r.app.rollouts.on_store_change)
            r.store.subscribe(relay.on_store_change)

    def _leads(self, name: str) -> Callable[[], bool]:
        return lambda: self.leading[name]


@pytest.fixture
async def led(tmp_path: Path) -> AsyncIterator[Led]:
    bus = Bus()
    a = await replica(tmp_path / "t.db", tmp_path, bus)
    b = await replica(tmp_path / "t.db", tmp_path, bus)
    pair = Led(a, b)
    await a.app.rollouts.lead()
    yield pair
    for r in (a, b):
        await r.app.rollouts.stop()
        await r.close()


async def rolled(led: Led) -> int:
    """Node n1 on generation 1, then generation 2 applied (through ``b``): a rollout starts."""
    await apply(led.a, "one")
    await streaming(led.a, "n1")
    generation = await apply(led.b, "two")
    env = led.b.app.store.get_environment("e")
    assert env is not None
    await led.b.app.rollouts.start(env, generation - 1)
    return generation


async def test_a_rollout_started_through_a_replica_that_does_not_lead_is_driven_by_the_leader(
    led: Led,
) -> None:
    generation = await rolled(led)
    assert not led.b.app.rollouts.running and led.a.app.rollouts.running
    a_view, b_view = led.a.app.rollouts.get("e"), led.b.app.rollouts.get("e")
    assert a_view is not None and b_view is not None
    assert a_view.generation == b_view.generation == generation  # one rollout, seen by both
    node = led.b.app.store.get_node("n1")
    assert node is not None
    # What the agent service on ``b`` hands n1 follows the leader's rollout.
    assert led.b.app.rollouts.generation_for(node) == led.a.app.rollouts.generation_for(node)


async def test_pause_through_another_replica_reaches_the_leaders_own_state(led: Led) -> None:
    await rolled(led)
    paused = await led.b.app.rollouts.pause("e", "ops")
    assert paused.status is RolloutStatus.PAUSED
    a_view = led.a.app.rollouts.get("e")
    assert a_view is not None and a_view.status is RolloutStatus.PAUSED  # its next turn keeps it
    await led.a.app.rollouts.tick()
    b_view = led.b.app.rollouts.get("e")
    assert b_view is not None and b_view.status is RolloutStatus.PAUSED
    with pytest.raises(ControllerError, match="cannot become paused"):
        await led.b.app.rollouts.pause("e", "ops")  # the leader's refusal, as the leader words it


async def test_a_command_while_no_replica_leads_is_unavailable(
    led: Led, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rolled(led)
    led.leading["a"] = False
    await led.a.app.rollouts.stop()
    monkeypatch.setattr(rollout_relay, "ANSWER_SECONDS", 0.2)
    with pytest.raises(NoLeader, match="try again"):
        await led.b.app.rollouts.pause("e", "ops")


async def test_a_command_taken_while_the_lead_moves_reaches_the_next_leader(
    led: Led, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rolled(led)
    led.leading["a"] = False
    await led.a.app.rollouts.stop()  # the leader died: nobody hears the first ask
    monkeypatch.setattr(rollout_relay, "ASK_AGAIN_SECONDS", 0.1)
    asked = asyncio.ensure_future(led.b.app.rollouts.pause("e", "ops"))
    await asyncio.sleep(0.3)
    assert not asked.done()
    led.leading["a"] = True  # the next leader (here the same process) takes over
    await led.a.app.rollouts.lead()
    paused = await asyncio.wait_for(asked, 5)
    assert paused.status is RolloutStatus.PAUSED


async def test_the_next_leader_resumes_the_rollout_from_the_store(led: Led) -> None:
    await rolled(led)
    await led.b.app.rollouts.pause("e", "ops")
    led.leading["a"] = False
    await led.a.app.rollouts.stop()  # the lease moved
    led.leading["b"] = True
    await led.b.app.rollouts.lead()
    resumed = await led.a.app.rollouts.resume("e", "ops")  # now through ``a``, to ``b``
    assert resumed.status is RolloutStatus.PROGRESSING
    await wait_for(
        lambda: (r := led.a.app.rollouts.get("e")) is not None and r.status is RolloutStatus.PROGRESSING
    )


# -- reset deadlines --------------------------------------------------------------------------


async def test_reset_deadlines_are_armed_by_the_leader_only(led: Led) -> None:
    await apply(led.a, "one")
    await streaming(led.b, "n1")
    resets_a, resets_b = led.a.agents.resets, led.b.agents.resets
    resets_b.leading = False  # as the server sets it on a replica that does not lead
    node = led.b.app.store.get_node("n1")
    assert node is not None
    assert await resets_b.start(node, "ops")
    assert resets_b._timers == {}  # not this replica's to give up
    await resets_a.rearm()  # the leader's periodic look
    assert list(resets_a._timers) == ["n1"]
    await resets_a.unlead()  # the lead moved away
    assert resets_a._timers == {} and not resets_a.leading


# -- the join slot ------------------------------------------------------------------------------


class LaggingView:
    """The store as another replica sees it a moment late: ``frozen`` keys read as they were."""

    def __init__(self, store: SqliteStore, frozen: dict[str, bytes | None]) -> None:
        self._store = store
        self.frozen = frozen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def kv_get(self, key: str) -> bytes | None:
        return self.frozen[key] if key in self.frozen else self._store.kv_get(key)


async def test_two_replicas_never_let_two_control_planes_join_at_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    await store.put_environment("c1", orchestrator_spec(), "holodeck.nvidia.com/v1alpha1", {})
    one = Cluster(store, tmp_path)
    await initialised(one)
    slot = "cluster/c1/" + orchestrator.CP_JOIN_SLOT
    view = LaggingView(store, {slot: store.kv_get(slot)})  # the other replica has not seen cp-2's take
    other = Orchestrator(view, one.hub, SecretBox.load_or_create(tmp_path / "secrets.key"), Redactor())
    cp2 = await one.node("cp-2", "control-plane")
    cp3 = await one.node("cp-3", "control-plane")
    await ask(one, cp2)
    assert len(one.releases("cp-2")) == 1
    await other.gate_requested(cp3, JOIN_STEP, one.digest("cp-3"))
    assert one.releases("cp-3") == []  # cp-2 is joining: cp-3 waits, on whichever replica it asked
    assert other.join_slot_holder("c1") == ""  # (its view still says free)
    await one.orch.forget_node("c1", "cp-2")  # cp-2 left: the slot is free
    view.frozen.clear()
    await other._release_waiters("c1")
    assert len(one.releases("cp-3")) == 1
    await store.close()


def orchestrator_spec() -> str:
    from tests.unit.controller.test_cluster import SPEC

    return SPEC
