"""When the agent upgrades itself: the decisions, and only between steps (real executor, real bash)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from tests.unit.nodeagent.test_executor import Harness
from tether.nodeagent import upgrade
from tether.nodeagent.model import AgentTarget, Event, Plan, Step
from tether.nodeagent.upgrade import Install, RolledBack, Startup, UpgradeError
from tether.nodeagent.upgrader import ProbationExpired, Upgrader

V2 = AgentTarget("9.9.9", "ab" * 32, 1000)


def make(install: Install | None, events: list[str], fetch_error: Exception | None = None) -> Upgrader:
    async def fetch(target: AgentTarget, dest: Path) -> None:
        if fetch_error is not None:
            raise fetch_error

    def emit(event: Event) -> None:
        events.append(event.message)

    return Upgrader(install, emit=emit, fetch=fetch, restart=lambda version: None, version="1.0")


def test_no_target_or_the_running_version_is_no_upgrade() -> None:
    u = make(Install(Path("/nonexistent"), "x"), [])
    assert not u.wanted(None)
    assert not u.wanted(AgentTarget("1.0", "cd" * 32, 10))
    assert u.wanted(V2)


def test_a_source_checkout_refuses_once_with_an_event() -> None:
    events: list[str] = []
    u = make(None, events)
    assert not u.wanted(V2) and not u.wanted(V2)
    assert len(events) == 1 and "cannot restart itself" in events[0] and "9.9.9" in events[0]


def test_a_bundle_it_rolled_back_from_is_not_tried_again(tmp_path: Path) -> None:
    events: list[str] = []
    u = make(Install(tmp_path, "x"), events)
    u.startup = Startup(rolled_back=RolledBack(V2.version, V2.sha256, "did not start"))
    assert u.rolled_back_from == V2.version
    assert not u.wanted(V2) and not u.wanted(V2)
    assert len(events) == 1 and "rolled back" in events[0]
    assert u.wanted(AgentTarget(V2.version, "ef" * 32, 10))  # a rebuilt bundle of that version is tried


async def test_a_failed_download_is_retried_later_and_a_bad_bundle_never(tmp_path: Path) -> None:
    events: list[str] = []
    woken: list[float] = []
    u = make(Install(tmp_path, "x"), events, fetch_error=UpgradeError("connection reset"))
    u.wake = lambda: woken.append(time.monotonic())
    assert await u.apply(V2) is False
    assert not u.wanted(V2)  # not before its retry time
    assert "trying again in 10s" in events[-1]
    u._failures[(V2.version, V2.sha256)] = (1, time.monotonic() - 1)
    assert u.wanted(V2)

    bad = make(Install(tmp_path, "x"), events, fetch_error=UpgradeError("built for s390x", retryable=False))
    assert await bad.apply(V2) is False
    assert not bad.wanted(V2) and "refused: built for s390x" in events[-1]


def test_a_new_version_on_probation_holds_until_healthy(tmp_path: Path) -> None:
    agents = tmp_path / "agent"
    agents.mkdir()
    (agents / "new").mkdir()
    (agents / "old").mkdir()
    (agents / "current").symlink_to("new")
    pending = upgrade.Pending("old", "1.0", "new", "2.0", "ab" * 32, int(time.time()) + 300)
    upgrade._write(agents / upgrade.PENDING, pending.__dict__)
    events: list[str] = []
    u = make(Install(agents, "new"), events)
    assert u.on_probation and u.upgraded_from == "1.0" and not u.committed.is_set()
    u.announce()
    assert "unless it reaches the controller" in events[-1]
    u.healthy()
    assert u.committed.is_set() and not (agents / upgrade.PENDING).exists() and not (agents / "old").exists()


async def test_probation_past_its_deadline_makes_the_agent_exit(tmp_path: Path) -> None:
    agents = tmp_path / "agent"
    agents.mkdir()
    (agents / "current").symlink_to("new")
    pending = upgrade.Pending("old", "1.0", "new", "2.0", "ab" * 32, int(time.time()) - 5)
    upgrade._write(agents / upgrade.PENDING, pending.__dict__)
    u = make(Install(agents, "new"), [])
    with pytest.raises(ProbationExpired, match=r"exiting so that the launcher goes back to 1\.0"):
        await asyncio.wait_for(u.guard_probation(), 5)


# -- the executor: between steps only ---------------------------------------------------------


class FakeUpgrade:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.applied_after: list[list[tuple[str, str]]] = []

    def wanted(self, target: AgentTarget | None) -> bool:
        return target is not None and not self.applied_after

    async def apply(self, target: AgentTarget) -> bool:
        self.applied_after.append(self.h.events())
        return True


def long_step(tmp: Path, name: str, seconds: float) -> Step:
    return Step(name=name, script=f"sleep {seconds}\necho done >> {tmp}/{name}.count\n")


async def test_a_plan_arriving_while_a_step_runs_upgrades_only_after_that_step(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    fake = FakeUpgrade(h)
    h.executor.upgrade = fake
    first = Plan.build([long_step(tmp_path, "driver", 1.0), long_step(tmp_path, "after", 0)], generation=1)
    h.executor.set_plan(first)
    task = asyncio.create_task(h.executor.run_forever())
    try:
        for _ in range(200):
            if ("driver", "started") in h.events():
                break
            await asyncio.sleep(0.02)
        second = Plan.build(list(first.steps), generation=2, agent=V2)
        h.executor.set_plan(second)  # the driver step is running now
        for _ in range(300):
            if fake.applied_after:
                break
            await asyncio.sleep(0.02)
        assert fake.applied_after, "the upgrade never began"
        seen = fake.applied_after[0]
        assert ("driver", "succeeded") in seen  # the running step finished first
        assert ("after", "started") not in seen
        await asyncio.sleep(0.5)
        assert ("after", "started") not in h.events()  # restarting: no step starts any more
        assert h.executor.state == "upgrading"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_upgrade_that_cannot_happen_lets_the_steps_go_on(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    events: list[str] = []
    h.executor.upgrade = make(None, events)
    await h.run(Plan.build([long_step(tmp_path, "a", 0)], generation=1, agent=V2))
    assert ("a", "succeeded") in h.events()
    assert len(events) == 1 and "refused" in events[0]
