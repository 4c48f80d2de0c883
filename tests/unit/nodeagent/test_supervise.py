"""Issue 10 item 6: a long-lived agent task that fails stops the agent with one line."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from tether.nodeagent.config import AgentConfig
from tether.nodeagent.errors import IdentityError, TaskFailed
from tether.nodeagent.executor import Executor
from tether.nodeagent.identity import Identity
from tether.nodeagent.session import Agent
from tether.nodeagent.supervise import failure_line, local_fault, no_space


async def forever(*_: object) -> None:
    await asyncio.Event().wait()


def make_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Agent:
    agent = Agent(AgentConfig(controller="127.0.0.1:1", state_dir=tmp_path / "state"))

    async def enrolled() -> Identity:
        return Identity("n1", "env", "worker", b"", b"", b"")

    monkeypatch.setattr(agent, "_ensure_enrolled", enrolled)
    monkeypatch.setattr(agent, "_connect_forever", forever)  # no controller here
    return agent


def run_agent(agent: Agent) -> BaseException:
    async def scenario() -> BaseException:
        with pytest.raises(TaskFailed) as caught:
            await asyncio.wait_for(agent.run(), 30)
        return caught.value

    return asyncio.run(scenario())


def raising(exc: BaseException) -> Callable[..., Coroutine[Any, Any, None]]:
    async def run_forever(self: Executor) -> None:
        await asyncio.sleep(0.05)
        raise exc

    return run_forever


def test_a_full_disk_in_the_executor_stops_the_agent_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Executor, "run_forever", raising(OSError(errno.ENOSPC, "No space left on device")))
    agent = make_agent(tmp_path, monkeypatch)
    failure = run_agent(agent)
    assert str(failure) == f"no space left on device: {tmp_path / 'state'}"
    assert agent.state.value == "draining"


def test_any_other_failure_names_the_task_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Executor, "run_forever", raising(RuntimeError("disk\nlabel gone")))
    failure = run_agent(make_agent(tmp_path, monkeypatch))
    assert str(failure) == "executor task failed: RuntimeError: disk label gone"


def test_a_failed_background_task_stops_the_agent_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Executor, "run_forever", forever)
    agent = make_agent(tmp_path, monkeypatch)

    async def broken_reboot() -> None:
        raise RuntimeError("reboot helper crashed")

    async def scenario() -> BaseException:
        run = asyncio.create_task(agent.run())
        await asyncio.sleep(0.1)
        agent._spawn(broken_reboot(), "reboot")
        with pytest.raises(TaskFailed) as caught:
            await asyncio.wait_for(run, 30)
        return caught.value

    assert str(asyncio.run(scenario())) == "reboot task failed: RuntimeError: reboot helper crashed"


def test_the_failure_is_reported_to_the_controller_when_the_disk_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Executor, "run_forever", raising(ValueError("boom")))
    agent = make_agent(tmp_path, monkeypatch)
    run_agent(agent)
    from tether.nodeagent.outbox import Outbox
    from tether.nodeagent.statedb import StateDB

    db = StateDB(tmp_path / "state" / "state.db")
    messages = [e.message for e in Outbox(db).pending()]
    assert messages == ["agent stopping: executor task failed: ValueError: boom"]
    db.close()


def test_an_agent_error_of_a_task_is_raised_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Executor, "run_forever", forever)
    agent = make_agent(tmp_path, monkeypatch)

    async def refused() -> None:
        raise IdentityError("the controller CA does not match the pin")

    monkeypatch.setattr(agent, "_connect_forever", refused)

    async def scenario() -> None:
        with pytest.raises(IdentityError, match="does not match the pin"):
            await asyncio.wait_for(agent.run(), 30)

    asyncio.run(scenario())


def test_disk_and_database_faults_are_local_and_a_full_sqlite_says_no_space(tmp_path: Path) -> None:
    full = sqlite3.OperationalError("database or disk is full")
    assert no_space(full) and local_fault(full)
    wrapped = RuntimeError("writer")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert (
        no_space(wrapped)
        and failure_line("writer", wrapped, tmp_path) == f"no space left on device: {tmp_path}"
    )
    assert local_fault(OSError(errno.EIO, "I/O error")) and not no_space(OSError(errno.EIO, "I/O error"))
    assert not local_fault(OSError(errno.ECONNREFUSED, "refused")) and not local_fault(ValueError("x"))
