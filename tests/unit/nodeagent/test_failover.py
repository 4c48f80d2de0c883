"""Issue 13: an agent given several replicas moves to the next on failure, with the same backoff;
a final refusal stops it as with one; the Welcome's replica list is remembered in the state dir."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tether.nodeagent import enroll, session
from tether.nodeagent.config import AgentConfig, load
from tether.nodeagent.errors import ControllerUnavailable, IdentityError, NodeRevoked
from tether.nodeagent.identity import IdentityStore
from tether.nodeagent.secrets import Secret
from tether.nodeagent.session import Agent

HASH = "sha256:" + "a" * 64
REPLICAS = ("a:1", "b:2", "c:3")
TOKEN = Secret("abcdef.0123456789abcdefghijklmnopqrstuv")


def refused(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="no")


def agent_for(tmp_path: Path, **fields: object) -> Agent:
    return Agent(AgentConfig(controllers=REPLICAS, state_dir=tmp_path / "state", **fields))  # type: ignore[arg-type]


def stop_after(monkeypatch: pytest.MonkeyPatch, attempts: int) -> list[float]:
    """Backoff at its ceiling; the sleeps, until ``attempts`` of them (then the loop is cancelled)."""
    monkeypatch.setattr(session.random, "uniform", lambda lo, hi: hi)
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == attempts:
            raise asyncio.CancelledError

    monkeypatch.setattr(session.asyncio, "sleep", sleep)
    return slept


def dialing(agent: Agent, error: Callable[[], BaseException]) -> list[str]:
    dialed: list[str] = []

    async def stream_once() -> None:
        dialed.append(agent.controllers.current)
        raise error()

    agent._stream_once = stream_once  # type: ignore[method-assign]
    return dialed


@pytest.mark.parametrize(
    "error",
    [
        lambda: refused(grpc.StatusCode.UNAVAILABLE),
        lambda: ControllerUnavailable("connection refused"),
        lambda: session.StreamClosed("the controller did not welcome this node"),
        lambda: OSError("network unreachable"),
    ],
)
def test_each_failure_moves_to_the_next_replica_after_the_same_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Callable[[], BaseException]
) -> None:
    agent = agent_for(tmp_path)
    slept = stop_after(monkeypatch, 7)
    dialed = dialing(agent, error)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(agent._connect_forever())
    agent.db.close()
    assert dialed == ["a:1", "b:2", "c:3", "a:1", "b:2", "c:3", "a:1"]
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]  # one backoff, never reset by a new address


def test_a_revoked_node_stops_at_the_first_replica_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_for(tmp_path)
    slept = stop_after(monkeypatch, 10)
    dialed = dialing(agent, lambda: refused(grpc.StatusCode.PERMISSION_DENIED))
    with pytest.raises(NodeRevoked):
        asyncio.run(agent._connect_forever())
    agent.db.close()
    assert dialed == ["a:1"] and slept == []


def test_enrollment_tries_the_next_replica_when_one_is_unreachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_for(tmp_path, token=TOKEN, ca_hash=HASH)
    slept = stop_after(monkeypatch, 4)
    tried: list[str] = []

    def fetch_ca(address: str, pin: str) -> bytes:
        tried.append(address)
        raise ControllerUnavailable(f"cannot reach controller at {address}")

    monkeypatch.setattr(enroll, "fetch_controller_ca", fetch_ca)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(agent._ensure_enrolled())
    agent.db.close()
    assert tried == ["a:1", "b:2", "c:3", "a:1"]
    assert slept == [0.5, 1.0, 2.0, 4.0]


def test_a_replica_with_another_ca_stops_enrollment_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = agent_for(tmp_path, token=TOKEN, ca_hash=HASH)
    stop_after(monkeypatch, 4)

    def fetch_ca(address: str, pin: str) -> bytes:
        raise IdentityError(f"controller at {address} does not present the pinned CA")

    monkeypatch.setattr(enroll, "fetch_controller_ca", fetch_ca)
    with pytest.raises(IdentityError, match="a:1"):
        asyncio.run(agent._ensure_enrolled())
    agent.db.close()


def remembered_after_welcome(agent: Agent, listed: list[str]) -> tuple[str, ...]:
    asyncio.run(agent._remember_controllers(listed))
    return agent.identities.controllers()


def test_the_welcome_list_replaces_the_remembered_one_and_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    IdentityStore(state).load_or_create_key()
    IdentityStore(state).save("n1", "e", "worker", b"cert", b"ca", controllers=("a:1", "b:2"))
    agent = Agent(load(None, {"state_dir": state}, {}))
    assert agent.controllers.addresses == ("a:1", "b:2")
    assert remembered_after_welcome(agent, ["b:2", "d:4", "bogus", "d:4"]) == ("b:2", "d:4")
    assert agent.controllers.addresses == ("b:2", "d:4")  # remembered, not configured: not kept
    meta = json.loads((state / "node.json").read_text())
    assert meta["controllers"] == ["b:2", "d:4"] and meta["node_name"] == "n1"
    assert (state / "node.json").stat().st_mode & 0o077 == 0
    assert not list(state.glob(".node.json*"))  # written aside and renamed: no leftover
    agent.db.close()
    assert session.state_summary(state)["controllers"] == ["b:2", "d:4"]  # tether-agent status
    restarted = Agent(load(None, {"state_dir": state}, {}))
    assert restarted.controllers.addresses == ("b:2", "d:4")
    restarted.db.close()


def test_an_empty_welcome_list_keeps_the_addresses_and_puts_the_answering_one_first(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    IdentityStore(state).load_or_create_key()
    IdentityStore(state).save("n1", "e", "worker", b"cert", b"ca", controllers=("a:1",))
    agent = Agent(AgentConfig(controllers=("z:9", "a:1"), state_dir=state))
    agent.controllers.advance()
    agent.controllers.advance()
    assert agent.controllers.current == "z:9"
    assert remembered_after_welcome(agent, []) == ("z:9", "a:1")
    assert agent.controllers.addresses == ("z:9", "a:1")
    # A list from the controller: the operator's addresses stay in the rotation, after it.
    assert remembered_after_welcome(agent, ["b:2"]) == ("b:2",)
    assert agent.controllers.addresses == ("b:2", "z:9", "a:1")
    agent.db.close()
