"""What the agent fsyncs, and when: nothing a power cut can take back ever leaves the node.

Step records commit without waiting for the disk (a trivial step would otherwise spend most of
its time in fsync); the session makes them durable before any event is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.nodeagent.test_executor import Harness
from tether.nodeagent.config import AgentConfig
from tether.nodeagent.model import Event, EventKind, Plan, Step
from tether.nodeagent.session import Agent
from tether.nodeagent.statedb import StateDB


def count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_non_durable_commits_wait_for_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = StateDB(tmp_path / "state.db")
    assert not db.dirty
    with db.transaction(durable=False) as c:
        c.execute("INSERT INTO meta VALUES ('a', '1')")
    assert db.dirty
    fsyncs = count_fsyncs(monkeypatch)
    asyncio.run(db.sync())
    assert fsyncs and not db.dirty
    synced = len(fsyncs)
    asyncio.run(db.sync())  # nothing new: no disk wait
    assert len(fsyncs) == synced
    with db.transaction(durable=False) as c:
        c.execute("INSERT INTO meta VALUES ('b', '1')")
    db.set_meta("c", "1")  # a durable commit carries the earlier ones with it
    assert not db.dirty
    db.close()
    reopened = StateDB(tmp_path / "state.db")
    assert [reopened.get_meta(k) for k in "abc"] == ["1", "1", "1"]


def test_a_durable_transaction_cannot_join_a_non_durable_one(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "state.db")
    with pytest.raises(RuntimeError), db.transaction(durable=False), db.transaction(durable=True):
        pass
    with db.transaction(durable=False), db.transaction():  # unspecified: joins
        pass


async def test_steps_do_not_wait_for_the_disk_but_failures_do(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    await h.run(Plan.build([Step(name=f"s{i}", script="true\n") for i in range(3)], generation=1))
    assert h.db.dirty  # three steps ran without one fsync between them
    await h.db.sync()
    await h.run(Plan.build([Step(name="bad", script="exit 3\n")], generation=2), until="failed")
    assert not h.db.dirty  # a failure is on disk before the plan stops


class FakeCall:
    """Records, for each message written, whether the state database still had unsynced commits."""

    def __init__(self, db: StateDB) -> None:
        self.db = db
        self.writes: list[tuple[str, bool]] = []
        self.sent_events = asyncio.Event()

    async def write(self, msg: Any) -> None:
        kind = msg.WhichOneof("kind")
        self.writes.append((kind, self.db.dirty))
        if kind == "events":
            self.sent_events.set()


def test_events_are_on_disk_before_they_are_sent(tmp_path: Path) -> None:
    agent = Agent(AgentConfig(controller="127.0.0.1:1", state_dir=tmp_path / "state"))

    async def scenario() -> FakeCall:
        with agent.db.transaction(durable=False):
            agent.executor.emit(Event(kind=EventKind.INFO, message="hello"))
        assert agent.db.dirty
        call = FakeCall(agent.db)
        writer = asyncio.create_task(agent._writer(call, 0))  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(call.sent_events.wait(), 5)
        finally:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        return call

    call = asyncio.run(scenario())
    assert ("events", False) in call.writes and ("events", True) not in call.writes
    agent.db.close()


def test_a_streaming_agent_does_not_load_the_crypto_library() -> None:
    """cryptography (about 10 MB resident) is for enrolling and renewing only."""
    code = (
        "import sys, tether.nodeagent.main, tether.nodeagent.session, tether.nodeagent.certinfo\n"
        "assert 'cryptography' not in sys.modules, sorted(m for m in sys.modules if 'crypto' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class KindsCall:
    """Records each message written: its kind, and for a batch the kinds of its events."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, list[str]]] = []

    async def write(self, msg: Any) -> None:
        kind = msg.WhichOneof("kind")
        events = [EventKind(e.kind).label for e in msg.events.events] if kind == "events" else []
        self.writes.append((kind, events))


async def written(agent: Agent, count: int) -> list[tuple[str, list[str]]]:
    """The first ``count`` messages the agent's writer sends from stored seq 0."""
    call = KindsCall()
    writer = asyncio.create_task(agent._writer(call, 0))  # type: ignore[arg-type]
    try:
        for _ in range(100):
            if len(call.writes) >= count:
                break
            await asyncio.sleep(0.01)
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    return call.writes


def test_step_secrets_leave_after_the_events_emitted_before_them(tmp_path: Path) -> None:
    """The controller takes a step's material only while it knows the step runs (its STARTED
    event), so the secrets of a step never overtake that step's earlier events."""
    agent = Agent(AgentConfig(controller="127.0.0.1:1", state_dir=tmp_path / "state"))

    async def scenario() -> list[tuple[str, list[str]]]:
        agent.executor.emit(Event(kind=EventKind.STARTED, step="kubeadm-init", attempt=1))
        agent._on_step_secrets("kubeadm-init", {"token": "x"}, {})
        return await written(agent, 2)

    assert asyncio.run(scenario()) == [("events", ["started"]), ("secrets", [])]
    agent.db.close()


def test_a_step_that_ended_before_its_events_left_still_sends_its_secrets_before_its_end(
    tmp_path: Path,
) -> None:
    """The stream was down while the init step ran: STARTED, its output and SUCCEEDED all wait
    in the outbox. The secrets go right after the events before them, not after SUCCEEDED (the
    controller takes a step's material only while the step runs)."""
    agent = Agent(AgentConfig(controller="127.0.0.1:1", state_dir=tmp_path / "state"))

    async def scenario() -> list[tuple[str, list[str]]]:
        agent.executor.emit(Event(kind=EventKind.STARTED, step="kubeadm-init", attempt=1))
        agent.executor.emit(Event(kind=EventKind.OUTPUT, step="kubeadm-init", lines=("ok",)))
        agent._on_step_secrets("kubeadm-init", {"token": "x"}, {})
        agent.executor.emit(Event(kind=EventKind.SUCCEEDED, step="kubeadm-init", attempt=1))
        return await written(agent, 3)

    assert asyncio.run(scenario()) == [
        ("events", ["started", "output"]),
        ("secrets", []),
        ("events", ["succeeded"]),
    ]
    agent.db.close()
