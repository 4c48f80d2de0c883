"""Join tokens as operators use them: the CLI contract and every refusal."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import apply_env, ca_hash, nodes, token, wait_state
from tests.integration.harness import Agent, Controller

STEP = """\
    - name: noop
      inline: "true"
"""


@pytest.fixture
def env(controller: Controller, tmp_path: Path) -> str:
    apply_env(controller, tmp_path, "prod", STEP)
    return "prod"


def test_token_create_prints_only_the_token(controller: Controller, env: str) -> None:
    out = controller.ctl("token", "create", "--env", env, "--role", "worker").stdout
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{32}\n", out)


def test_print_join_command_is_a_runnable_agent_command(
    controller: Controller, env: str, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    out = controller.ctl(
        "token",
        "create",
        "--env",
        env,
        "--role",
        "worker",
        "--ttl",
        "15m",
        "--uses",
        "1",
        "--print-join-command",
    ).stdout.strip()
    # The token goes in the agent's environment, not on its command line (issue 10, item 13).
    m = re.fullmatch(
        r"TETHER_JOIN_TOKEN=(\S+) tether-agent run --controller (\S+) --ca-hash (sha256:[0-9a-f]{64})", out
    )
    assert m, out
    assert m.group(2) == controller.address and m.group(3) == ca_hash(controller)
    agents("joined").start(m.group(1), m.group(3))
    wait_state(controller, ["joined"], "provisioned")


def refused(agent: Agent, tok: str, controller: Controller, *extra: str) -> str:
    out = agent.run_once(tok, ca_hash(controller), *extra)
    assert out.returncode != 0, out
    lines = [line for line in out.stderr.splitlines() if line.startswith("tether-agent:")]
    assert len(lines) == 1, out.stderr
    assert tok.split(".")[1] not in out.stderr + out.stdout
    return lines[0]


def test_reused_token_is_refused(controller: Controller, env: str, agents: Callable[[str], Agent]) -> None:
    tok = token(controller, env)
    agents("first").start(tok, ca_hash(controller))
    wait_state(controller, ["first"], "provisioned")
    assert "already used" in refused(agents("second"), tok, controller)
    assert "second" not in nodes(controller)


def test_multi_use_token_enrolls_that_many(
    controller: Controller, env: str, agents: Callable[[str], Agent]
) -> None:
    tok = token(controller, env, "--uses", "2")
    for name in ("a", "b"):
        agents(name).start(tok, ca_hash(controller))
    wait_state(controller, ["a", "b"], "provisioned")
    assert "already used (2 of 2 uses)" in refused(agents("c"), tok, controller)


def test_expired_token_is_refused(controller: Controller, env: str, agents: Callable[[str], Agent]) -> None:
    tok = token(controller, env, "--ttl", "1s")
    time.sleep(1.5)
    assert "expired" in refused(agents("late"), tok, controller)


def test_revoked_token_is_refused(controller: Controller, env: str, agents: Callable[[str], Agent]) -> None:
    tok = token(controller, env)
    controller.ctl("token", "revoke", tok.split(".")[0])
    assert "revoked" in refused(agents("n"), tok, controller)
    listed = controller.ctl("token", "list", "-o", "json").stdout
    assert tok.split(".")[1] not in listed and '"revoked": true' in listed


def test_wrong_scope_is_refused(controller: Controller, env: str, agents: Callable[[str], Agent]) -> None:
    pinned = token(controller, env, "--node-name", "gpu-1")
    assert "scoped to node 'gpu-1'" in refused(agents("gpu-2"), pinned, controller)
    tok = token(controller, env)
    assert "scoped to environment 'prod', not 'staging'" in refused(
        agents("x"), tok, controller, "--env", "staging"
    )
    assert "scoped to role 'worker', not 'control-plane'" in refused(
        agents("y"), tok, controller, "--role", "control-plane"
    )
    # A refusal for scope does not use the token up.
    agents("z").start(tok, ca_hash(controller))
    wait_state(controller, ["z"], "provisioned")


def test_garbage_token_and_wrong_ca_hash(
    controller: Controller, env: str, agents: Callable[[str], Agent]
) -> None:
    assert "invalid" in refused(agents("g"), "abcdef." + "x" * 32, controller)
    tok = token(controller, env)
    out = agents("h").run_once(tok, "sha256:" + "0" * 64)
    assert out.returncode != 0 and "does not present the pinned CA" in out.stderr


def test_unknown_environment_and_role_are_clear_errors(controller: Controller, env: str) -> None:
    out = controller.ctl("token", "create", "--env", "nope", check=False)
    assert out.returncode != 0 and out.stderr.strip() == "tetherctl: environment 'nope' not found"
    out = controller.ctl("token", "create", "--env", env, "--role", "king", check=False)
    assert out.returncode != 0 and "unknown role 'king'" in out.stderr


def test_read_only_admin_cannot_create_tokens(controller: Controller, env: str, tmp_path: Path) -> None:
    import subprocess

    import yaml

    from tests.integration.harness import BIN

    ro = tmp_path / "viewer.conf"
    out = subprocess.run(
        [
            str(BIN / "tether-controller"),
            "admin",
            "issue",
            "--data-dir",
            str(controller.data_dir),
            "--name",
            "viewer",
            "--role",
            "read-only",
            "--out",
            str(ro),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "read-only access for 'viewer'" in out.stdout
    assert yaml.safe_load(ro.read_text())["role"] == "read-only"
    assert ro.stat().st_mode & 0o077 == 0
    listed = controller.ctl("--config", str(ro), "env", "list")
    assert "prod" in listed.stdout
    out = controller.ctl("--config", str(ro), "token", "create", "--env", env, check=False)
    assert out.returncode != 0 and "read-only" in out.stderr
