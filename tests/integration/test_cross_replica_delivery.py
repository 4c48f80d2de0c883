"""Issue 13: two controller replicas on one PostgreSQL database; an agent streams to replica B and
every admin call goes to replica A. What A is told reaches the agent through B within a second:
a new document's plan, a rerun, a revoke; ``node list`` on A shows the agent connected, and
``events --follow`` on A shows its events."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import apply_env, ca_hash, events, nodes, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for

pytestmark = pytest.mark.integration

HELLO = "    - {name: hello, phase: pre-install, inline: 'echo hello %s'}\n"
STEP = "custom-hello"


def _replica(workdir: Path, store_url: str, key_file: Path) -> Controller:
    workdir.mkdir(parents=True, exist_ok=True)
    c = Controller(workdir, extra_args=("--store", store_url, "--store-key-file", str(key_file)))
    c.start()
    return c


@pytest.fixture
def pair(tmp_path: Path, pg_database: str) -> Iterator[tuple[Controller, Controller, Agent]]:
    """Replicas A and B, and agent ``n1`` enrolled through B and streaming to it (provisioned)."""
    key = tmp_path / "store.key"
    a = _replica(tmp_path / "a", pg_database, key)
    b = _replica(tmp_path / "b", pg_database, key)
    agent = Agent(tmp_path, "n1", b)
    try:
        apply_env(a, tmp_path, "lab", HELLO % "one")
        agent.start(token(a, "lab"), ca_hash(a))
        wait_state(b, ["n1"], "provisioned")
        yield a, b, agent
    finally:
        agent.kill()
        for c in (a, b):
            c.kill()


def _hello_lines(controller: Controller) -> list[str]:
    return [line for e in events(controller, "n1") for line in e.get("lines", []) if "hello" in line]


def test_a_change_on_one_replica_reaches_the_agent_streaming_to_the_other(
    pair: tuple[Controller, Controller, Agent], tmp_path: Path
) -> None:
    a, b, _ = pair
    listed = nodes(a)["n1"]  # the agent streams to B; A shows it connected
    assert listed["connected"] is True and listed["state"] == "provisioned"
    assert "stream open" in b.log_path.read_text() and "stream open" not in a.log_path.read_text()

    apply_env(a, tmp_path, "lab", HELLO % "two")
    applied = time.time()
    wait_for(lambda: "hello two" in _hello_lines(a), timeout=10, interval=0.05, what="the new plan's output")
    started = _started(a, generation=2)
    assert len(started) == 1 and started[0] - applied < 1.0  # the agent at B ran the new plan at once

    a.ctl("node", "rerun", "n1", "--step", STEP)
    reran = time.time()
    wait_for(lambda: len(_started(a, generation=2)) == 2, timeout=5, interval=0.05, what="the rerun")
    assert _started(a, generation=2)[1] - reran < 1.0


def _started(controller: Controller, generation: int) -> list[float]:
    """When the agent started the step under plans of ``generation`` (its clock, this machine's)."""
    return [
        datetime.fromisoformat(str(e["time"]).replace("Z", "+00:00")).timestamp()
        for e in events(controller, "n1")
        if e["step"] == STEP and e["kind"] == "started" and e["plan_generation"] == generation
    ]


def _follow(controller: Controller) -> tuple[subprocess.Popen[str], queue.Queue[dict[str, Any]]]:
    follower = subprocess.Popen(
        [str(BIN / "tetherctl"), "events", "--node", "n1", "--follow", "-o", "json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TETHER_CONFIG": str(controller.config)},
    )
    lines: queue.Queue[dict[str, Any]] = queue.Queue()

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            lines.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return follower, lines


def test_events_follow_on_one_replica_shows_an_agent_on_the_other(
    pair: tuple[Controller, Controller, Agent],
) -> None:
    a, b, _ = pair
    stored = len(events(b, "n1"))
    follower, lines = _follow(a)
    try:
        seen = [lines.get(timeout=10)["seq"] for _ in range(stored)]  # the stored ones first
        assert seen == list(range(1, stored + 1))
        b.ctl("node", "rerun", "n1", "--step", STEP)  # the agent's new events are stored by B
        live = [lines.get(timeout=5)]
        while not any(e["step"] == STEP and e["kind"] == "succeeded" for e in live):
            live.append(lines.get(timeout=5))
        assert [e["seq"] for e in live] == list(range(stored + 1, stored + 1 + len(live)))
        assert any("hello one" in e.get("lines", []) for e in live)
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout is not None:
            follower.stdout.close()


def test_a_revoke_on_one_replica_closes_the_stream_on_the_other(
    pair: tuple[Controller, Controller, Agent],
) -> None:
    a, b, _ = pair
    assert nodes(b)["n1"]["connected"] is True
    a.ctl("node", "revoke", "n1")
    revoked = time.monotonic()
    wait_for(lambda: nodes(b)["n1"]["connected"] is False, timeout=5, interval=0.05, what="B to drop it")
    assert time.monotonic() - revoked < 2.0
    assert "node revoked through another replica" in (b.log_path).read_text()
    assert nodes(a)["n1"]["state"] == "revoked" and nodes(a)["n1"]["connected"] is False


def test_the_agents_of_a_dead_replica_count_as_gone_once_it_is_stale(
    pair: tuple[Controller, Controller, Agent],
) -> None:
    a, b, agent = pair
    assert nodes(a)["n1"]["connected"] is True
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGSTOP)  # frozen: it cannot move to A meanwhile
    b.kill()  # kill -9: its registry entries stay behind
    killed = time.monotonic()
    wait_for(lambda: nodes(a)["n1"]["connected"] is False, timeout=30, interval=0.5, what="n1 gone on A")
    assert 8.0 < time.monotonic() - killed < 15.0  # stale 10 s after B's last report
    assert nodes(a)["n1"]["state"] == "offline"
