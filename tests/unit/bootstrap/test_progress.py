"""Rendering: plain lines off a terminal, live redrawn lines on one, and the summary table."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tether.bootstrap.detect import DetectedHost, Python
from tether.bootstrap.events import BootstrapEvent, Outcome, Step
from tether.bootstrap.install import Result
from tether.bootstrap.progress import Progress, summary
from tether.nodeagent.model import EventKind, HostFacts


def ev(
    target: str, step: Step, kind: EventKind, message: str, node: str = "", **kw: object
) -> BootstrapEvent:
    return BootstrapEvent(target, node or target, step, kind, message, 0, **kw)  # type: ignore[arg-type]


def test_plain_mode_prints_one_line_per_event() -> None:
    out = io.StringIO()
    p = Progress(out, ["root@a", "root@b"], live=False)
    p(ev("root@a", Step.CONNECT, EventKind.STARTED, "connecting"))
    p(ev("root@a", Step.DETECT, EventKind.SUCCEEDED, "Debian", node="node-a"))
    assert out.getvalue().splitlines() == [
        "root@a: connect started   connecting",
        "node-a (root@a): detect  succeeded Debian",
    ]
    assert "\x1b[" not in out.getvalue()


def terminal(out: io.StringIO, width: int = 100) -> Console:
    return Console(file=out, force_terminal=True, width=width, color_system="standard", markup=False)


def visible(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: lines, carriage returns, erase-line and cursor-up."""
    rows: list[str] = [""]
    row = 0
    for token in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\n|\r)", text):
        if token == "\n":
            row += 1
            rows += [""] * (row + 1 - len(rows))
        elif token == "\x1b[2K":
            rows[row] = ""
        elif (up := re.fullmatch(r"\x1b\[(\d*)A", token)) is not None:
            row -= int(up.group(1) or 1)
        elif token and not token.startswith("\x1b") and token != "\r":
            rows[row] += token
    return [r.rstrip() for r in rows if r.strip()]


def test_live_mode_keeps_one_redrawn_line_per_machine_and_pins_what_matters() -> None:
    out = io.StringIO()
    p = Progress(out, ["root@a", "root@b"], console=terminal(out), live=True)
    p(ev("root@a", Step.AGENT, EventKind.STARTED, "installing"))
    p(ev("root@b", Step.DONE, EventKind.FAILED, "refused: no systemd", outcome=Outcome.REFUSED))
    p.close()
    text = out.getvalue()
    assert "\x1b[" in text  # redrawn in place and coloured
    assert "\x1b[31m" in text or "\x1b[1;31m" in text  # the failure in red
    pinned = "root@b: done    failed    refused: no systemd"
    assert screen(text) == [
        pinned,  # printed above the live block, stays
        "root@a: agent   started   installing",  # the block: one line per machine, redrawn
        pinned,
    ]


def test_live_lines_are_cut_to_the_terminal_width() -> None:
    out = io.StringIO()
    p = Progress(out, [], console=terminal(out, width=40), live=True)
    p(ev("root@a", Step.AGENT, EventKind.OUTPUT, "x" * 200))
    p.close()
    assert max(len(line) for line in visible(out.getvalue()).splitlines()) <= 40


def test_summary_has_a_row_per_machine() -> None:
    facts = HostFacts(os_pretty="Rocky Linux 9.4", arch="arm64", nvidia_gpu=True, python_version="3.9.18")
    detected = DetectedHost(facts, pythons=(Python("/usr/bin/python3.11", (3, 11, 7), "glibc", (2, 34)),))
    out = io.StringIO()
    summary(
        [
            Result("root@a", "gpu-1", Outcome.INSTALLED, "enrolled", 12.34, detected),
            Result("ssm:i-1", "", Outcome.FAILED, "cannot reach", 0.5),
        ],
        out,
    )
    rows = out.getvalue().splitlines()
    assert rows[0].split() == [
        "NODE",
        "TARGET",
        "OUTCOME",
        "OS",
        "ARCH",
        "PYTHON",
        "GPU",
        "SECONDS",
        "DETAIL",
    ]
    assert rows[1].split()[:3] == ["gpu-1", "root@a", "installed"]
    assert "Rocky Linux 9.4  arm64  3.11    yes  12.3" in rows[1]
    assert rows[2].split()[:3] == ["-", "ssm:i-1", "failed"]
