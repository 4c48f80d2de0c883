"""End to end on loopback: enroll, pull plans, run real bash, report sequenced events."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import apply_env, ca_hash, events, nodes, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for

STEPS = """\
    - name: hello
      phase: pre-install
      inline: |
        echo "hello from $TETHER_NODE"
        for i in 1 2 3; do echo "line $i"; done
    - name: configure
      env:
        GREETING: bonjour
      inline: echo "$GREETING from $TETHER_ROLE"
"""


def running(pid: int) -> bool:
    """Alive and not a zombie (orphans are reaped late by this sandbox's init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def assert_contiguous(evs: list[dict[str, object]]) -> None:
    seqs = [int(e["seq"]) for e in evs]  # type: ignore[call-overload]
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def test_three_agents_enroll_and_provision(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "demo", STEPS)
    names = ["node-a", "node-b", "node-c"]
    for name in names:
        agents(name).start(token(controller, "demo"), ca_hash(controller))
    wait_state(controller, names, "provisioned")
    listed = nodes(controller)
    for name in names:
        assert listed[name]["environment"] == "demo" and listed[name]["role"] == "worker"
        evs = events(controller, name)
        assert_contiguous(evs)
        kinds = [(e["step"], e["kind"]) for e in evs if str(e["step"]).startswith("custom-")]
        assert kinds == [
            ("custom-hello", "started"),
            ("custom-hello", "output"),
            ("custom-hello", "succeeded"),
            ("custom-configure", "started"),
            ("custom-configure", "output"),
            ("custom-configure", "succeeded"),
        ]
        lines = [line for e in evs if str(e["step"]).startswith("custom-") for line in e["lines"]]  # type: ignore[attr-defined]
        assert lines == [f"hello from {name}", "line 1", "line 2", "line 3", "bonjour from worker"]


def test_failed_step_marks_the_node_failed_and_continue_on_error_does_not(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(
        controller,
        tmp_path,
        "fails",
        """\
    - name: tolerated
      continueOnError: true
      inline: exit 4
    - name: broken
      inline: |
        echo about to fail
        exit 7
    - name: never
      inline: echo should not run
""",
    )
    agents("n1").start(token(controller, "fails"), ca_hash(controller))
    wait_state(controller, ["n1"], "failed")
    evs = events(controller, "n1")
    failed = [(e["step"], e["exit_code"]) for e in evs if e["kind"] == "failed"]
    assert failed == [("custom-tolerated", 4), ("custom-broken", 7)]
    assert not any(e["step"] == "custom-never" for e in evs)
    describe = json.loads(controller.ctl("node", "describe", "n1", "-o", "json").stdout)
    states = {s["name"]: s["state"] for s in describe["steps"] if s["name"].startswith("custom-")}
    assert states == {"custom-tolerated": "failed", "custom-broken": "failed", "custom-never": "pending"}


def test_timeout_is_enforced(controller: Controller, agents: Callable[[str], Agent], tmp_path: Path) -> None:
    apply_env(
        controller,
        tmp_path,
        "slow",
        """\
    - name: sleeper
      timeout: 2
      inline: sleep 120
""",
    )
    agents("n1").start(token(controller, "slow"), ca_hash(controller))
    wait_state(controller, ["n1"], "failed")
    failed = [e for e in events(controller, "n1") if e["kind"] == "failed"]
    assert failed[0]["exit_code"] == 124 and "timed out after 2s" in str(failed[0]["message"])


def test_kill_9_mid_step_resumes_without_rerunning_succeeded_steps(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    apply_env(
        controller,
        tmp_path,
        "resume",
        f"""\
    - name: first
      inline: echo first >> {runs}/first
    - name: long
      inline: |
        echo $$ >> {runs}/long.pids
        if [ ! -e {runs}/long.go ]; then sleep 300; fi
        echo done >> {runs}/long
    - name: last
      inline: echo last >> {runs}/last
""",
    )
    agent = agents("n1")
    agent.start(token(controller, "resume"), ca_hash(controller))
    wait_for(lambda: (runs / "long.pids").exists(), timeout=60, what="the long step to start")
    agent.kill(signal.SIGKILL)
    first_pid = int((runs / "long.pids").read_text().split()[0])
    (runs / "long.go").touch()
    agent.start()  # no token: the stored identity is used
    wait_state(controller, ["n1"], "provisioned")
    assert (runs / "first").read_text() == "first\n"  # never re-run
    assert (runs / "long").read_text() == "done\n"  # the interrupted step ran again, once
    assert (runs / "last").read_text() == "last\n"
    assert len((runs / "long.pids").read_text().split()) == 2
    assert not running(first_pid), "the orphaned attempt from before the crash was not stopped"
    evs = events(controller, "n1")
    assert_contiguous(evs)
    started = [e["step"] for e in evs if e["kind"] == "started"]
    assert started.count("custom-first") == 1 and started.count("custom-long") == 2


def test_controller_restart_mid_plan_loses_and_duplicates_no_event(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(
        controller,
        tmp_path,
        "chatty",
        """\
    - name: ticker
      inline: |
        for i in $(seq 1 60); do echo "tick $i"; sleep 0.1; done
    - name: ticker-two
      inline: |
        for i in $(seq 1 30); do echo "tock $i"; sleep 0.1; done
""",
    )
    agent = agents("n1")
    agent.start(token(controller, "chatty"), ca_hash(controller))
    wait_for(
        lambda: any(e["step"] == "custom-ticker" and e["kind"] == "output" for e in events(controller, "n1")),
        timeout=60,
        what="output to flow",
    )
    controller.kill(signal.SIGKILL)
    time.sleep(2.5)  # the agent keeps running its steps; events pile up in its outbox
    controller.start()  # same port
    wait_state(controller, ["n1"], "provisioned", timeout=60)
    evs = events(controller, "n1")
    assert_contiguous(evs)
    lines = [line for e in evs for line in e["lines"]]  # type: ignore[attr-defined]
    assert lines == [f"tick {i}" for i in range(1, 61)] + [f"tock {i}" for i in range(1, 31)]
    wait_for(lambda: '"outbox_pending": 0' in agent.status(), what="the outbox to drain")


def test_reapplying_a_changed_spec_reruns_only_changed_steps(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    steps = f"""\
    - name: stable
      inline: echo x >> {runs}/stable
    - name: changing
      inline: echo {{v}} >> {runs}/changing
"""
    apply_env(controller, tmp_path, "evolve", steps.replace("{v}", "v1"))
    agents("n1").start(token(controller, "evolve"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    apply_env(controller, tmp_path, "evolve", steps.replace("{v}", "v2"))
    wait_for(lambda: (runs / "changing").read_text() == "v1\nv2\n", what="the changed step to run")
    wait_state(controller, ["n1"], "provisioned")
    assert (runs / "stable").read_text() == "x\n"
    skipped = [e for e in events(controller, "n1") if e["kind"] == "skipped"]
    assert [e["step"] for e in skipped] == ["preflight", "custom-stable"]


def test_events_follow_streams_live(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(
        controller,
        tmp_path,
        "live",
        """\
    - name: gate
      inline: |
        while [ ! -e "$RELEASE" ]; do sleep 0.1; done
        echo released
      env:
        RELEASE: /nonexistent
""".replace("/nonexistent", str(tmp_path / "release")),
    )
    agents("n1").start(token(controller, "live"), ca_hash(controller))
    wait_for(
        lambda: any(e["step"] == "custom-gate" and e["kind"] == "started" for e in events(controller, "n1")),
        timeout=60,
        what="the step to start",
    )
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    follower = subprocess.Popen(
        [str(BIN / "tetherctl"), "events", "--node", "n1", "--follow", "-o", "json"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert follower.stdout is not None
        seen = []
        while not (seen and seen[-1]["step"] == "custom-gate" and seen[-1]["kind"] == "started"):
            seen.append(json.loads(follower.stdout.readline()))  # the history first
        (tmp_path / "release").touch()
        live = [json.loads(follower.stdout.readline()) for _ in range(2)]
        assert [(e["kind"], e["lines"]) for e in live] == [("output", ["released"]), ("succeeded", [])]
        assert [e["seq"] for e in seen + live] == list(range(1, len(seen) + 3))
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout is not None:
            follower.stdout.close()


def test_after_enrolling_the_agent_restarts_in_place_without_the_crypto_library(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    """Same PID (systemd's main process), fresh image: enrollment's libraries are not kept for life."""
    apply_env(controller, tmp_path, "lean", STEPS)
    agent = agents("lean-node")
    agent.start(token(controller, "lean"), ca_hash(controller))
    assert agent.proc is not None
    pid = agent.proc.pid
    wait_state(controller, ["lean-node"], "provisioned")
    assert agent.proc.poll() is None and running(pid)
    log = agent.log_path.read_text()
    assert "restarting the agent in place" in log and "using stored identity" in log
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "cryptography" not in maps and "grpc" in maps
    assert_contiguous(events(controller, "lean-node"))
