"""Log format: one event per line; JSON off a terminal, for our events and third-party records alike."""

from __future__ import annotations

import io
import json
import logging

from tether.nodeagent import logs


def test_json_lines_carry_bound_context_and_third_party_records() -> None:
    stream = io.StringIO()
    logs.configure("info", stream=stream, json=True)
    log = logs.get_logger("tether.test")
    with logs.bound(node="node-7", step="custom-hello"):
        log.info("step started", attempt=1)
        log.debug("not shown at info")
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            logging.getLogger("asyncssh").exception("connection lost")
    logging.getLogger("grpc").info("below WARNING: third-party chatter is dropped")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines  # the traceback stays inside its event's line
    ours, theirs = (json.loads(line) for line in lines)
    assert ours["event"] == "step started" and ours["level"] == "info" and ours["attempt"] == 1
    assert ours["node"] == "node-7" and ours["step"] == "custom-hello" and ours["timestamp"].endswith("Z")
    assert theirs["logger"] == "asyncssh" and theirs["level"] == "error" and theirs["node"] == "node-7"
    assert theirs["event"].startswith("connection lost\nTraceback") and "ValueError: bad" in theirs["event"]


def test_console_format_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    logs.configure("info", stream=stream)
    logs.get_logger("t").info("hello", node="n")
    line = stream.getvalue().strip()
    assert "hello" in line and "node=n" in line and not line.startswith("{")
