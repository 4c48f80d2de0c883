"""``tetherctl node describe``: a node's facts, health and steps in at most 120 columns.

Fields are ``Label:`` lines; long values wrap under their value column. The steps are a short
table (name, state, attempt, exit code, when), then one block per step with what the spec
requested, what the step observed and its message, each wrapped.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from tether.controller.cli.output import ago, colour, rfc3339, table, terminal_width, until, when

MAX_WIDTH = 120
LABEL = 14  # "Environment:  " and its kin


def node(n: Any, out: TextIO) -> None:
    width = min(terminal_width(out) or MAX_WIDTH, MAX_WIDTH)
    seen = "" if n.connected else f" (last seen {ago(n.last_seen_ms)})"
    agent = n.agent_version or "-"
    if n.agent_rolled_back_from:
        agent += f" (rolled back from {n.agent_rolled_back_from})"
    f = n.facts
    fields: list[tuple[str, str]] = [
        ("Name", n.name),
        ("Environment", n.environment),
        ("Role", n.role),
        ("State", n.state + seen),
        *_progress(n),
        ("Enrolled", when(n.enrolled_ms)),
        ("Agent", agent),
        ("OS", f"{f.os_pretty or '-'} ({f.arch or '?'}, kernel {f.kernel or '?'})"),
        ("Addresses", ", ".join(f.addresses) or "-"),
    ]
    for i, gpu in enumerate(_gpus(n)):
        fields.append(("GPUs" if i == 0 else "", gpu))
    fields += _health(n)
    fields += _quarantine(n)
    fields += _conditions(n)
    fields.append(("Plan", f"generation {n.plan_generation}, digest {n.plan_digest[:12] or '-'}"))
    for label, value in fields:
        out.write(field(label, value, width))
    out.write("Steps:\n")
    if not n.steps:
        out.write("  (none reported yet)\n")
        return
    rows = [
        (
            s.name,
            colour(s.state),
            s.attempt or "-",
            s.exit_code if s.state in ("failed", "succeeded") else "-",
            when(s.updated_ms),
        )
        for s in n.steps
    ]
    table(rows, ("STEP", "STATE", "ATTEMPT", "EXIT", "UPDATED"), out, indent="  ", max_width=width)
    for s in n.steps:
        out.write(_step_block(s, width))


def field(label: str, value: str, width: int = MAX_WIDTH) -> str:
    """``Label:   value`` wrapped to ``width``, continuation lines under the value."""
    head = f"{label + ':' if label else '':<{LABEL}}"
    return _wrap(value, width, head, " " * LABEL)


def _wrap(text: str, width: int, first: str, rest: str) -> str:
    lines = textwrap.wrap(
        text or "-", width=width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    )
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _gpus(n: Any) -> list[str]:
    gpus = [
        f"{g.index}: {g.name} ({g.memory_total_mib} MiB, driver {g.driver_version})" for g in n.facts.gpus
    ]
    return gpus or ["NVIDIA device present, no driver" if n.facts.nvidia_gpu else "none"]


def _health(n: Any) -> list[tuple[str, str]]:
    if not (n.HasField("health") and n.health.time_ms):
        return []
    h = n.health
    mem = f"{h.memory_available_bytes / 2**30:.1f}/{h.memory_total_bytes / 2**30:.1f} GiB free"
    disk = f"{h.disk_free_bytes / 2**30:.1f}/{h.disk_total_bytes / 2**30:.1f} GiB free"
    health = (
        f"load {h.load1:.2f}, memory {mem}, disk {disk}, up {int(h.uptime_seconds)}s "
        f"(reported {ago(h.time_ms)})"
    )
    rows = [("Health", health)]
    if h.services:
        rows.append(("Services", kv(h.services)))
    return rows


def _progress(n: Any) -> list[tuple[str, str]]:
    """While provisioning: when it should be done, and whether its current step is a straggler."""
    rows: list[tuple[str, str]] = []
    if n.eta_ms:
        rows.append(("ETA", f"{rfc3339(n.eta_ms)} ({until(n.eta_ms)})"))
    if n.straggler:
        running = next((s for s in n.steps if s.state == "running"), None)
        what = (
            f"{running.name} has run {ago(running.updated_ms).removesuffix(' ago')}"
            if running
            else "its step"
        )
        rows.append(("Straggler", f"yes: {what}, far longer than on the other nodes"))
    return rows


def _conditions(n: Any) -> list[tuple[str, str]]:
    """The hardware conditions that hold (GPU drift): type (reason) since when: message."""
    return [
        ("Conditions" if i == 0 else "", f"{c.type} ({c.reason}) since {when(c.since_ms)}: {c.message}")
        for i, c in enumerate(n.conditions)
    ]


def _quarantine(n: Any) -> list[tuple[str, str]]:
    """Why the node is quarantined: the stage, then one line per mismatch (expected, found)."""
    if not n.HasField("quarantine"):
        return []
    q = n.quarantine
    head = f"{q.stage} since {when(q.since_ms)}: `tetherctl node release {n.name}` lets it go on once"
    return [("Quarantined", head), *(("", p) for p in q.problems)]


def kv(m: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(m.items()))


def _step_block(s: Any, width: int) -> str:
    parts: Iterable[tuple[str, str]] = (
        ("requested", kv(s.requested)),
        ("observed", kv(s.observed)),
        ("message", s.message),
    )
    shown = [(k, v) for k, v in parts if v]
    if not shown:
        return ""
    text = f"  {s.name}:\n"
    for key, value in shown:
        text += _wrap(value, width, f"    {key + ':':<11}", " " * 15)
    return text
