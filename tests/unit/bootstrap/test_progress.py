"""Rendering: plain lines off a terminal, live redrawn lines on one, and the summary table."""

from __future__ import annotations

import io

from bootstrap.detect import DetectedHost, Python
from bootstrap.events import BootstrapEvent, Outcome, Step
from bootstrap.install import Result
from bootstrap.progress import Progress, summary
from nodeagent.model import EventKind, HostFacts


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


def test_live_mode_keeps_one_redrawn_line_per_machine_and_pins_what_matters() -> None:
    out = io.StringIO()
    p = Progress(out, ["root@a", "root@b"], live=True)
    p(ev("root@a", Step.AGENT, EventKind.STARTED, "installing"))
    p(ev("root@b", Step.DONE, EventKind.FAILED, "refused: no systemd", outcome=Outcome.REFUSED))
    text = out.getvalue()
    assert text.count("\x1b[2F\x1b[J") == 1  # the second draw moves up over the two live lines
    frames = text.split("\x1b[2F\x1b[J")
    last = frames[-1].splitlines()
    assert last[0] == "root@b: done    failed    refused: no systemd"  # pinned above the live block
    assert last[1:] == [
        "root@a: agent   started   installing",
        "root@b: done    failed    refused: no systemd",
    ]


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
