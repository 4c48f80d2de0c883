"""tether.nodeagent.textfile: the agent's metrics for node-exporter's textfile collector."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.tools import system_tool
from tether.nodeagent.journal import Journal, JournalState
from tether.nodeagent.model import Plan, Step
from tether.nodeagent.statedb import StateDB
from tether.nodeagent.textfile import (
    STEP_STATES,
    AgentFigures,
    TextfileWriter,
    render,
    step_counts,
    write_atomically,
)


def promtool() -> str:
    return system_tool("promtool", "prometheus")


FIGURES = AgentFigures(
    version='1.2.3"x\\y',
    environment="gpu",
    role="worker",
    steps={"succeeded": 3, "failed": 1, "pending": 2},
    outbox_pending=7,
    connected=True,
    last_connected=1_700_000_000.5,
    plan_generation=4,
)


def values(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_render() -> None:
    got = values(render(FIGURES))
    assert got['tether_agent_info{version="1.2.3\\"x\\\\y",environment="gpu",role="worker"}'] == "1"
    assert got['tether_agent_steps{state="succeeded"}'] == "3"
    assert got['tether_agent_steps{state="failed"}'] == "1"
    assert got['tether_agent_steps{state="running"}'] == "0"  # every state, zeros included
    assert got["tether_agent_outbox_pending_events"] == "7"
    assert got["tether_agent_connected"] == "1"
    assert float(got["tether_agent_last_connected_timestamp_seconds"]) == 1_700_000_000.5
    assert got["tether_agent_plan_generation"] == "4"


def test_render_passes_promtool() -> None:
    out = subprocess.run(
        [promtool(), "check", "metrics"], input=render(FIGURES), capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_step_counts_from_the_journal(tmp_path: Path) -> None:
    db = StateDB(tmp_path / "agent.db")
    try:
        plan = Plan.build([Step(name=f"s{i}", script=f"echo {i}") for i in range(4)], generation=1)
        journal = Journal(db)
        s0, s1, s2, _ = plan.steps
        journal.record(s0.digest, s0.name, JournalState.SUCCEEDED, attempt=1)
        journal.record(s1.digest, s1.name, JournalState.FAILED, attempt=2, exit_code=3)
        journal.record(s2.digest, s2.name, JournalState.RUNNING, attempt=1)
        counts = step_counts(plan, journal)
        assert counts == {"pending": 1, "running": 1, "succeeded": 1, "failed": 1, "rebooting": 0}
        assert set(counts) == set(STEP_STATES)
        assert step_counts(None, journal) == dict.fromkeys(STEP_STATES, 0)
    finally:
        db.close()


def test_written_atomically_and_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "tether-agent.prom"
    old_umask = os.umask(0o077)
    try:
        write_atomically(path, "first\n")
        write_atomically(path, "second\n")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "second\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tether-agent.prom"]  # no temporary file left


def test_a_failing_write_is_reported_not_raised(tmp_path: Path) -> None:
    writer = TextfileWriter(tmp_path / "missing-dir" / "tether-agent.prom")
    assert writer.write(FIGURES) is False
    assert writer.write(FIGURES) is False
    (tmp_path / "missing-dir").mkdir()
    assert writer.write(FIGURES) is True
    assert "tether_agent_connected 1" in writer.path.read_text()
