"""Step events: start/finish pairs, failures carrying the retry flag, messages redacted."""

from __future__ import annotations

import pytest

from tests.unit.bootstrap.fakes import Events
from tether.bootstrap.errors import ConnectError
from tether.bootstrap.events import Reporter, Step
from tether.nodeagent.model import EventKind
from tether.nodeagent.secrets import Redactor


async def test_a_step_emits_started_then_exactly_one_finish() -> None:
    events = Events()
    r = Reporter("root@h", events, Redactor())
    async with r.step(Step.DETECT, "detecting") as h:
        h.done("found Debian")
    async with r.step(Step.PREREQS, "checking") as h:
        h.skip("nothing to do")
    with pytest.raises(ConnectError):
        async with r.step(Step.CONNECT, "connecting"):
            raise ConnectError("cannot reach h: timeout")
    assert [(e.step, e.kind, e.message) for e in events.items] == [
        (Step.DETECT, EventKind.STARTED, "detecting"),
        (Step.DETECT, EventKind.SUCCEEDED, "found Debian"),
        (Step.PREREQS, EventKind.STARTED, "checking"),
        (Step.PREREQS, EventKind.SKIPPED, "nothing to do"),
        (Step.CONNECT, EventKind.STARTED, "connecting"),
        (Step.CONNECT, EventKind.FAILED, "cannot reach h: timeout"),
    ]
    assert events.items[-1].retryable


async def test_messages_pass_the_redactor_and_name_the_node_once_known() -> None:
    events = Events()
    r = Reporter("root@h", events, Redactor(["s3cr3t-password"]))
    r.info(Step.AGENT, "careless: s3cr3t-password")
    r.node = "gpu-1"
    r.output(Step.AGENT, "line")
    assert events.items[0].message == "careless: [REDACTED]"
    assert (events.items[1].target, events.items[1].node) == ("root@h", "gpu-1")
