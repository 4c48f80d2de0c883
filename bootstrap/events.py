"""What the bootstrap reports: steps in start/finish pairs, in the agent's event vocabulary.

Steps run in a fixed order (``STEPS``): connect -> detect -> prereqs -> agent -> verify -> done.
Each one is wrapped in ``Reporter.step`` so it emits ``started`` and then exactly one of
``succeeded``/``failed``/``skipped``; ``done`` carries the outcome. Every message passes the
reporter's redactor before it leaves, so even a careless message cannot carry a credential or
the join token (the messages are written not to contain any in the first place).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from tether.bootstrap.errors import BootstrapError
from tether.nodeagent.model import EventKind, HostFacts, now_ms
from tether.nodeagent.secrets import Redactor


class Step(str, enum.Enum):
    CONNECT = "connect"
    DETECT = "detect"
    PREREQS = "prereqs"
    AGENT = "agent"
    VERIFY = "verify"
    DONE = "done"


STEPS = tuple(Step)


class Outcome(str, enum.Enum):
    """How adopting one machine ended."""

    INSTALLED = "installed"
    ALREADY_INSTALLED = "already-installed"
    REINSTALLED = "reinstalled"  # --force: bundle, unit and config again, same identity
    REFUSED = "refused"  # unsupported host, untrusted host key, or a conflict: nothing changed
    FAILED = "failed"

    @property
    def ok(self) -> bool:
        return self in (Outcome.INSTALLED, Outcome.ALREADY_INSTALLED, Outcome.REINSTALLED)


@dataclass(frozen=True)
class BootstrapEvent:
    target: str  # how the machine was reached (user@host:port, ssm:i-...): stable for a run
    node: str  # the node name once known, else the target
    step: Step
    kind: EventKind
    message: str
    time_ms: int
    detected: HostFacts | None = None  # on detect/succeeded
    outcome: Outcome | None = None  # on done
    retryable: bool = False  # on failed: trying again may help


EventSink = Callable[[BootstrapEvent], None]


class StepHandle:
    """Lets a running step set its final message, or mark itself skipped."""

    def __init__(self) -> None:
        self.message = ""
        self.skipped = False
        self.detected: HostFacts | None = None

    def done(self, message: str) -> None:
        self.message = message

    def skip(self, message: str) -> None:
        self.message, self.skipped = message, True


class Reporter:
    """Emits the events of one machine to a sink, redacted."""

    def __init__(self, target: str, sink: EventSink, redactor: Redactor) -> None:
        self.target = target
        self.node = target
        self._sink = sink
        self._redactor = redactor

    def emit(
        self,
        step: Step,
        kind: EventKind,
        message: str,
        *,
        detected: HostFacts | None = None,
        outcome: Outcome | None = None,
        retryable: bool = False,
    ) -> None:
        self._sink(
            BootstrapEvent(
                target=self.target,
                node=self.node,
                step=step,
                kind=kind,
                message=self._redactor.redact(message),
                time_ms=now_ms(),
                detected=detected,
                outcome=outcome,
                retryable=retryable,
            )
        )

    def output(self, step: Step, line: str) -> None:
        self.emit(step, EventKind.OUTPUT, line)

    def info(self, step: Step, message: str) -> None:
        self.emit(step, EventKind.INFO, message)

    @asynccontextmanager
    async def step(self, step: Step, message: str) -> AsyncIterator[StepHandle]:
        """``started`` now; ``succeeded``/``skipped`` on exit, or ``failed`` if it raises."""
        self.emit(step, EventKind.STARTED, message)
        handle = StepHandle()
        try:
            yield handle
        except BootstrapError as exc:
            exc.step = exc.step or step.value
            self.emit(step, EventKind.FAILED, str(exc), retryable=exc.retryable)
            raise
        except BaseException as exc:
            self.emit(
                step, EventKind.FAILED, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            )
            raise
        kind = EventKind.SKIPPED if handle.skipped else EventKind.SUCCEEDED
        self.emit(step, kind, handle.message or step.value, detected=handle.detected)
