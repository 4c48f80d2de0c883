"""The agent's own metrics, as a file for node-exporter's textfile collector (``metrics_textfile``).

A few gauges in the Prometheus text format, written by hand (the agent carries no client
library) on every heartbeat, atomically: a temporary file beside it renamed over it, so the
collector never reads half a file. The collector reads only ``*.prom`` files, so the temporary
one is never picked up. node-exporter's ``node_textfile_mtime_seconds`` tells how fresh it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tether.nodeagent import logs
from tether.nodeagent.journal import Journal, JournalState
from tether.nodeagent.model import Plan

log = logs.get_logger("tether.agent.textfile")
STEP_STATES = ("pending", *(s.value for s in JournalState))


@dataclass(frozen=True)
class AgentFigures:
    version: str
    environment: str = ""
    role: str = ""
    steps: Mapping[str, int] = field(default_factory=dict)  # the plan's steps by journal state
    outbox_pending: int = 0
    connected: bool = False
    last_connected: float = 0.0  # Unix time the stream was last seen up (0: not since the start)
    plan_generation: int = 0


def step_counts(plan: Plan | None, journal: Journal) -> dict[str, int]:
    """The steps of ``plan`` by their journal state (``pending``: no entry yet)."""
    counts = dict.fromkeys(STEP_STATES, 0)
    for step in plan.steps if plan is not None else ():
        entry = journal.get(step.digest)
        counts[entry.state.value if entry is not None else "pending"] += 1
    return counts


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gauge(name: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {_number(value)}" for labels, value in samples]
    return lines


def _number(value: float) -> str:
    """Whole numbers without a fraction; others exactly (``repr`` round-trips a float)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(f: AgentFigures) -> str:
    """The figures in the Prometheus text exposition format."""
    info = f'{{version="{_label(f.version)}",environment="{_label(f.environment)}",role="{_label(f.role)}"}}'
    lines = [
        *_gauge("tether_agent_info", "The agent's version, environment and role (1).", [(info, 1)]),
        *_gauge(
            "tether_agent_steps",
            "Steps of the agent's current plan by state.",
            [(f'{{state="{s}"}}', f.steps.get(s, 0)) for s in STEP_STATES],
        ),
        *_gauge(
            "tether_agent_plan_generation",
            "Generation of the plan the agent runs.",
            [("", f.plan_generation)],
        ),
        *_gauge(
            "tether_agent_outbox_pending_events",
            "Events waiting for the controller's acknowledgement.",
            [("", f.outbox_pending)],
        ),
        *_gauge(
            "tether_agent_connected", "1 while the stream to the controller is up.", [("", int(f.connected))]
        ),
        *_gauge(
            "tether_agent_last_connected_timestamp_seconds",
            "When the stream to the controller was last seen up (Unix time; 0: not since the agent started).",
            [("", f.last_connected)],
        ),
    ]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (mode 0644: node-exporter runs as another user)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    try:
        os.chmod(tmp, 0o644)  # whatever the umask
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


class TextfileWriter:
    """Writes the figures to ``path``; a failure is logged once (until a write works again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._failing = False

    def write(self, figures: AgentFigures) -> bool:
        try:
            write_atomically(self.path, render(figures))
        except OSError as exc:
            if not self._failing:
                log.warning("cannot write the metrics textfile", path=str(self.path), error=str(exc))
            self._failing = True
            return False
        self._failing = False
        return True
