"""Issue 10, items 13 and 17 against a real controller: the join token stays off the agent's
command line and environment, and an agent started the quickstart way (relative --state-dir,
the printed join command) provisions."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import apply_env, ca_hash, events, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for

STEP = """\
    - name: noop
      inline: echo "ran in $PWD"
"""
JOIN_RE = re.compile(
    r"TETHER_JOIN_TOKEN=([a-z0-9]{6}\.[a-z0-9]{32}) tether-agent run "
    r"--controller (\S+) --ca-hash (sha256:[0-9a-f]{64})"
)


@pytest.fixture
def env(controller: Controller, tmp_path: Path) -> str:
    apply_env(controller, tmp_path, "prod", STEP)
    return "prod"


@pytest.fixture
def shells() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def agent_pids(marker: str) -> list[int]:
    """PIDs of tether-agent processes whose command line mentions ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"tether-agent" in a for a in argv) and any(marker.encode() in a for a in argv):
            pids.append(int(proc.name))
    return pids


def assert_token_hidden(pid: int, tok: str) -> None:
    secret = tok.split(".")[1].encode()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert secret not in cmdline, cmdline
    assert secret not in environ and b"TETHER_JOIN_TOKEN" not in environ


def printed_join_command(controller: Controller, env: str, *extra: str) -> str:
    out = controller.ctl("token", "create", "--env", env, "--role", "worker", *extra, "--print-join-command")
    assert out.stdout.count("\n") == 1, out.stdout
    return out.stdout.strip()


def test_the_printed_join_command_keeps_the_token_off_the_command_line(
    controller: Controller, env: str
) -> None:
    line = printed_join_command(controller, env, "--ttl", "15m")
    m = JOIN_RE.fullmatch(line)
    assert m, line
    assert m.group(2) == controller.address and m.group(3) == ca_hash(controller)
    assert "--token" not in line
    named = printed_join_command(controller, env, "--node-name", "gpu-1")
    assert JOIN_RE.match(named) and named.endswith(" --node-name gpu-1")


def test_an_agent_started_by_pasting_the_join_command_never_shows_the_token(
    controller: Controller, env: str, tmp_path: Path, shells: list[subprocess.Popen[bytes]]
) -> None:
    line = printed_join_command(controller, env)
    tok = JOIN_RE.fullmatch(line).group(1)  # type: ignore[union-attr]
    cwd = tmp_path / "operator"
    cwd.mkdir()
    # As the quickstart does it: paste, append flags, a state directory relative to where one stands.
    pasted = f"{line} --state-dir ./agent --node-name pasted --heartbeat-seconds 1 --backoff-max-seconds 1"
    shell_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    with (tmp_path / "pasted.log").open("w") as log:
        shells.append(
            subprocess.Popen(["bash", "-c", pasted], cwd=cwd, env=shell_env, stdout=log, stderr=log)
        )
    wait_state(controller, ["pasted"], "provisioned")
    step = [e for e in events(controller, "pasted") if e["step"] == "custom-noop"]
    assert [e["kind"] for e in step] == ["started", "output", "succeeded"], step
    assert step[1]["lines"] == [f"ran in {cwd / 'agent' / 'workspace'}"]
    pids = wait_for(lambda: agent_pids("./agent"), what="the agent process")
    for pid in pids:
        assert_token_hidden(pid, tok)


def test_the_reexec_drops_a_token_given_on_the_command_line(
    controller: Controller, env: str, agents: Callable[[str], Agent]
) -> None:
    tok = token(controller, env)
    agent = agents("flagged")
    agent.start(tok, ca_hash(controller))
    wait_state(controller, ["flagged"], "provisioned")
    assert agent.proc is not None and agent.proc.poll() is None
    assert_token_hidden(agent.proc.pid, tok)


def test_an_enrolled_agent_started_with_the_token_again_drops_it_at_once(
    controller: Controller, env: str, agents: Callable[[str], Agent]
) -> None:
    tok = token(controller, env)
    agent = agents("again")
    agent.start(tok, ca_hash(controller))
    wait_state(controller, ["again"], "provisioned")
    agent.kill()
    agent.start(tok, ca_hash(controller))  # e.g. a unit file that still passes --token
    assert agent.proc is not None
    pid = agent.proc.pid

    def reexeced() -> bool:
        return tok.split(".")[1].encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

    wait_for(reexeced, what="the agent to exec itself without the token")
    assert_token_hidden(pid, tok)
