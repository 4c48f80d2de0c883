"""Showing a run to an operator: a live line per machine on a terminal, plain lines otherwise,
then one summary row per machine.

On a terminal (``rich.live``) the block of live lines (one per machine: its current step and last
message, cut to the terminal's width) is redrawn in place; what must stay visible (what detection
found, failures, the outcome) is printed above it as permanent lines. Elsewhere (CI, pipes,
files) every event is one plain line and nothing is coloured. Only tetherctl shows this: the node
agent never imports it (nor ``rich``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tether.bootstrap.events import BootstrapEvent, Step
from tether.bootstrap.install import Result
from tether.nodeagent.model import EventKind

KIND_STYLES = {"succeeded": "green", "failed": "bold red", "skipped": "dim", "started": "cyan"}
OUTCOME_STYLES = {"installed": "green", "already-installed": "green", "reinstalled": "green"}
UNWRAPPED = 10_000  # off a terminal a row is never wrapped


def _is_permanent(event: BootstrapEvent) -> bool:
    return (
        event.detected is not None
        or event.kind in (EventKind.FAILED,)
        or event.step is Step.DONE
        or (event.step is Step.CONNECT and "host key" in event.message)
    )


def console_for(out: TextIO, terminal: bool) -> Console:
    """A console on ``out``: colours and the terminal's width on one, plain unwrapped text elsewhere."""
    return Console(
        file=out,
        force_terminal=terminal,
        color_system="auto" if terminal else None,
        width=None if terminal else UNWRAPPED,
        highlight=False,
        markup=False,
        emoji=False,
    )


class Progress:
    """An ``EventSink`` that renders to ``out`` (``console``: where a terminal is drawn, for tests)."""

    def __init__(
        self,
        out: TextIO,
        targets: Sequence[str],
        *,
        live: bool | None = None,
        console: Console | None = None,
    ) -> None:
        self.out = out
        self.live = out.isatty() if live is None else live
        self.console = console or console_for(out, self.live)
        self._order: list[str] = []
        self._lines: dict[str, tuple[str, str, str, str]] = {}
        self._display: Live | None = None
        self.expect(targets)

    def expect(self, targets: Sequence[str]) -> None:
        """Show these machines as waiting until their first event."""
        for target in targets:
            if target not in self._lines:
                self._order.append(target)
                self._lines[target] = (target, "", "waiting", "")
        if self.live and self._order:
            self._redraw()

    def __call__(self, event: BootstrapEvent) -> None:
        label = event.node if event.node == event.target else f"{event.node} ({event.target})"
        if not self.live:
            self.out.write(f"{label}: {event.step.value:<7} {event.kind.label:<9} {event.message}\n")
            self.out.flush()
            return
        if event.target not in self._lines:
            self._order.append(event.target)
        self._lines[event.target] = (label, event.step.value, event.kind.label, event.message)
        if _is_permanent(event):
            self._live().console.print(self._line(event.target))
        self._redraw()

    def _line(self, target: str) -> Text:
        label, step, kind, message = self._lines[target]
        text = Text(f"{label}: ", style="bold")
        if step:
            text.append(f"{step:<7} ")
        text.append(f"{kind:<9}", style=KIND_STYLES.get(kind, ""))
        if message:
            text.append(f" {message}")
        return text

    def _block(self) -> Table:
        grid = Table.grid()
        grid.add_column(no_wrap=True, overflow="ellipsis")
        for target in self._order:
            grid.add_row(self._line(target))
        return grid

    def _live(self) -> Live:
        if self._display is None:
            self._display = Live(
                self._block(),
                console=self.console,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._display.start()
        return self._display

    def _redraw(self) -> None:
        self._live().update(self._block(), refresh=True)

    def close(self) -> None:
        """Leave the last state on screen."""
        if self._display is not None:
            self._display.stop()
            self._display = None


def summary(results: Sequence[Result], out: TextIO = sys.stdout, *, console: Console | None = None) -> None:
    """One row per machine: node, target, outcome, what it is, how long it took, and why."""
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for header in ("NODE", "TARGET", "OUTCOME", "OS", "ARCH", "PYTHON", "GPU", "SECONDS", "DETAIL"):
        t.add_column(header, no_wrap=header != "DETAIL", overflow="fold")
    for r in results:
        facts = r.detected.facts if r.detected else None
        python = r.detected.python if r.detected else None
        outcome = Text(r.outcome.value, style=OUTCOME_STYLES.get(r.outcome.value, "bold red"))
        t.add_row(
            r.node or "-",
            r.target,
            outcome,
            (facts.os_pretty or facts.os_id or "?") if facts else "-",
            (facts.arch or "?") if facts else "-",
            python.short if python else ((facts.python_version or "-") if facts else "-"),
            ("yes" if facts.nvidia_gpu else "no") if facts else "-",
            f"{r.seconds:.1f}",
            r.message,
        )
    console = console or console_for(out, out.isatty())
    with console.capture() as captured:
        console.print(t)
    for line in captured.get().splitlines():
        out.write(line.rstrip() + "\n")
    out.flush()
