"""Issue 10 item 3: a step that prints a flood while the controller is down never wedges the outbox."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import apply_env, ca_hash, events, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for
from tests.integration.test_provisioning import assert_contiguous
from tether.nodeagent.limits import MAX_LINE_BYTES


def plan_done(agent: Agent) -> bool:
    steps = json.loads(agent.status())["steps"]
    return bool(steps) and all(s["state"] == "succeeded" for s in steps)


@pytest.mark.timeout(900)
def test_thirty_megabytes_printed_while_the_controller_is_down_drain_once_it_is_back(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    go = tmp_path / "go"
    apply_env(
        controller,
        tmp_path,
        "flood",
        f"""\
    - name: flood
      inline: |
        while [ ! -e {go} ]; do sleep 0.1; done
        for i in 1 2 3; do head -c 102400 /dev/zero | tr '\\0' L; echo; done
        head -c 30000000 /dev/zero | tr '\\0' 0 | fold -w 199
        echo flood-done
    - name: after
      inline: echo after
""",
    )
    agent = agents("n1")
    agent.start(token(controller, "flood"), ca_hash(controller))
    wait_for(
        lambda: any(e["step"] == "custom-flood" and e["kind"] == "started" for e in events(controller, "n1")),
        timeout=90,
        what="the flood step to start",
    )
    controller.kill(signal.SIGKILL)
    go.touch()
    wait_for(lambda: plan_done(agent), timeout=180, interval=1, what="the plan to finish offline")
    assert json.loads(agent.status())["outbox_pending"] > 100  # 30 MB waits in the outbox
    controller.start()  # same port
    wait_state(controller, ["n1"], "provisioned", timeout=240)
    wait_for(
        lambda: json.loads(agent.status())["outbox_pending"] == 0, timeout=120, what="the outbox to drain"
    )
    evs = events(controller, "n1")
    assert_contiguous(evs)
    lines = [str(line) for e in evs if e["step"] == "custom-flood" for line in e["lines"]]  # type: ignore[attr-defined]
    assert all(len(line.encode()) <= MAX_LINE_BYTES for line in lines)
    long = [line for line in lines if line.startswith("LLLL")]
    assert len(long) == 3 and all("cut" in line or "truncated" in line for line in long)
    assert any(e["step"] == "custom-after" and e["kind"] == "succeeded" for e in evs)
