"""Issue 10 item 9 (agent side): a refused stream backs off (never a tight loop) and honours the hint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from tether.nodeagent import session
from tether.nodeagent.config import AgentConfig
from tether.nodeagent.session import RETRY_HINT_MAX_SECONDS, Agent


def refused(code: grpc.StatusCode, *metadata: tuple[str, str]) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata), details="no")


def sleeps_between_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: grpc.aio.AioRpcError, attempts: int = 6
) -> list[float]:
    agent = Agent(AgentConfig(controller="127.0.0.1:1", state_dir=tmp_path / "state"))
    monkeypatch.setattr(session.random, "uniform", lambda lo, hi: hi)  # the backoff's ceiling
    opened: list[int] = []
    slept: list[float] = []

    async def stream_once() -> None:
        opened.append(1)
        raise error

    async def sleep(delay: float) -> None:
        slept.append(delay)
        if len(slept) == attempts:
            raise asyncio.CancelledError

    monkeypatch.setattr(agent, "_stream_once", stream_once)
    monkeypatch.setattr(session.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(agent._connect_forever())
    agent.db.close()
    assert len(opened) == len(slept)  # every attempt is followed by a wait
    return slept


def test_resource_exhausted_backs_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept = sleeps_between_attempts(tmp_path, monkeypatch, refused(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_the_controllers_retry_hint_is_a_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hinted = refused(grpc.StatusCode.RESOURCE_EXHAUSTED, ("retry-after-seconds", "7"))
    assert sleeps_between_attempts(tmp_path, monkeypatch, hinted) == [7, 7, 7, 7, 8.0, 16.0]


def test_a_hint_is_capped_and_garbage_or_other_codes_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = refused(grpc.StatusCode.RESOURCE_EXHAUSTED, ("retry-after-seconds", "1e9"))
    assert session.retry_hint(huge) == RETRY_HINT_MAX_SECONDS
    assert session.retry_hint(refused(grpc.StatusCode.RESOURCE_EXHAUSTED, ("retry-after-seconds", "x"))) == 0
    assert session.retry_hint(refused(grpc.StatusCode.UNAVAILABLE, ("retry-after-seconds", "7"))) == 0
