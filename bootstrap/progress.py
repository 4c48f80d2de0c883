"""Showing a run to an operator: a live line per machine on a terminal, plain lines otherwise,
then one summary row per machine.

On a terminal the block of live lines (one per machine: its current step and last message) is
redrawn in place; what must stay visible (what detection found, failures, the outcome) is printed
above it as permanent lines. Elsewhere (CI, pipes, files) every event is one plain line.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

from bootstrap.events import BootstrapEvent, Step
from bootstrap.install import Result
from nodeagent.model import EventKind

_UP_AND_CLEAR = "\x1b[{n}F\x1b[J"


def _is_permanent(event: BootstrapEvent) -> bool:
    return (
        event.detected is not None
        or event.kind in (EventKind.FAILED,)
        or event.step is Step.DONE
        or (event.step is Step.CONNECT and "host key" in event.message)
    )


class Progress:
    """An ``EventSink`` that renders to ``out``."""

    def __init__(self, out: TextIO, targets: Sequence[str], *, live: bool | None = None) -> None:
        self.out = out
        self.live = out.isatty() if live is None else live
        self._order: list[str] = []
        self._lines: dict[str, str] = {}
        self._drawn = 0
        self.expect(targets)

    def expect(self, targets: Sequence[str]) -> None:
        """Show these machines as waiting until their first event."""
        for target in targets:
            if target not in self._lines:
                self._order.append(target)
                self._lines[target] = f"{target}: waiting"

    def __call__(self, event: BootstrapEvent) -> None:
        label = event.node if event.node == event.target else f"{event.node} ({event.target})"
        text = f"{event.step.value:<7} {event.kind.label:<9} {event.message}"
        if not self.live:
            self.out.write(f"{label}: {text}\n")
            self.out.flush()
            return
        if event.target not in self._lines:
            self._order.append(event.target)
        self._lines[event.target] = f"{label}: {text}"
        self._redraw(f"{label}: {text}" if _is_permanent(event) else None)

    def _redraw(self, permanent: str | None) -> None:
        columns = shutil.get_terminal_size((120, 20)).columns
        parts = []
        if self._drawn:
            parts.append(_UP_AND_CLEAR.format(n=self._drawn))
        if permanent is not None:
            parts.append(permanent + "\n")
        for target in self._order:
            parts.append(self._lines[target][: max(20, columns - 1)] + "\n")
        self._drawn = len(self._order)
        self.out.write("".join(parts))
        self.out.flush()

    def close(self) -> None:
        self._drawn = 0  # leave the last state on screen


def summary(results: Sequence[Result], out: TextIO = sys.stdout) -> None:
    """One row per machine: node, target, outcome, what it is, how long it took, and why."""
    rows = [("NODE", "TARGET", "OUTCOME", "OS", "ARCH", "PYTHON", "GPU", "SECONDS", "DETAIL")]
    for r in results:
        facts = r.detected.facts if r.detected else None
        python = r.detected.python if r.detected else None
        rows.append(
            (
                r.node or "-",
                r.target,
                r.outcome.value,
                (facts.os_pretty or facts.os_id or "?") if facts else "-",
                (facts.arch or "?") if facts else "-",
                python.short if python else ((facts.python_version or "-") if facts else "-"),
                ("yes" if facts.nvidia_gpu else "no") if facts else "-",
                f"{r.seconds:.1f}",
                r.message,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    out.flush()
