"""Letting nodes go on loopback: node delete, node reset, a revoked agent that stops, env delete."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import apply_env, ca_hash, nodes, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for
from tether.nodeagent.errors import RESET_EXIT_CODE, REVOKED_EXIT_CODE

NOOP = '    - name: noop\n      inline: "true"\n'


def provisioned(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path, *names: str
) -> list[Agent]:
    apply_env(controller, tmp_path, "life", NOOP)
    started = []
    for name in names:
        agent = agents(name)
        agent.start(token(controller, "life"), ca_hash(controller))
        started.append(agent)
    wait_state(controller, list(names), "provisioned")
    return started


def exit_code(agent: Agent, within: float = 60.0) -> int:
    """The agent's exit status, which must come within ``within`` seconds."""
    assert agent.proc is not None
    deadline = time.monotonic() + within
    while agent.proc.poll() is None:
        assert time.monotonic() < deadline, f"agent {agent.name} still runs after {within}s"
        time.sleep(0.1)
    return agent.proc.returncode


def last_line(agent: Agent) -> str:
    return agent.log_path.read_text().strip().splitlines()[-1]


def revoked_line(name: str) -> str:
    return f"tether-agent: node {name} was revoked by the controller; enroll again with a new token"


def test_a_revoked_agent_exits_with_its_code_and_one_line(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    (agent,) = provisioned(controller, agents, tmp_path, "n1")
    controller.ctl("node", "revoke", "n1")
    assert exit_code(agent) == REVOKED_EXIT_CODE
    assert last_line(agent) == revoked_line("n1")
    plain = [line for line in agent.log_path.read_text().splitlines() if not line.startswith("{")]
    assert [line for line in plain if "revoked" in line] == [revoked_line("n1")]  # besides the JSON log


def test_a_controller_restart_does_not_stop_the_agent(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    (agent,) = provisioned(controller, agents, tmp_path, "n1")
    controller.kill()
    time.sleep(2.0)  # the agent retries meanwhile (connection refused: UNAVAILABLE)
    controller.start()
    wait_state(controller, ["n1"], "provisioned")
    assert agent.proc is not None and agent.proc.poll() is None


def test_delete_refuses_a_connected_node_and_force_revokes_it_and_forgets_its_history(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    n1, n2 = provisioned(controller, agents, tmp_path, "n1", "n2")
    refused = controller.ctl("node", "delete", "n1", check=False)
    assert refused.returncode == 1 and "node 'n1' is connected: --force revokes it first" in refused.stderr
    assert "n1" in nodes(controller)

    assert controller.ctl("node", "delete", "n1", "--force").stdout.strip() == "node/n1 deleted"
    assert exit_code(n1) == REVOKED_EXIT_CODE and last_line(n1) == revoked_line("n1")
    assert list(nodes(controller)) == ["n2"]
    gone = controller.ctl("events", "--node", "n1", check=False)
    assert gone.returncode != 0 and "node 'n1' not found" in gone.stderr
    # No row of any table names it any more, except the audit log's: who deleted it stays on record.
    rows = [line for line in controller.db_dump().splitlines() if "'n1'" in line]
    assert rows and all(line.startswith('INSERT INTO "audit"') for line in rows), rows
    assert json.loads(controller.ctl("events", "--node", "n2", "-o", "json").stdout)

    # An offline node needs no --force.
    n2.kill()
    wait_state(controller, ["n2"], "offline")
    controller.ctl("node", "delete", "n2")
    assert nodes(controller) == {}


def test_reset_of_a_plain_node_removes_the_agents_state_and_forgets_it(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    agent, other = provisioned(controller, agents, tmp_path, "n1", "n2")
    out = controller.ctl("node", "reset", "n1", "--wait", "--wait-timeout", "60s", timeout=90)
    assert out.stdout.strip().endswith("node/n1 reset: the node left and is forgotten")
    assert exit_code(agent) == RESET_EXIT_CODE
    assert not agent.state_dir.exists()
    assert last_line(agent).startswith("tether-agent: node n1 was reset: removed ")
    assert list(nodes(controller)) == ["n2"]
    assert other.proc is not None and other.proc.poll() is None  # the other node is untouched


def test_reset_of_an_offline_node_happens_when_it_connects(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    (agent,) = provisioned(controller, agents, tmp_path, "n1")
    agent.kill()
    wait_state(controller, ["n1"], "offline")
    assert "reset started" in controller.ctl("node", "reset", "n1").stdout
    assert "n1" in nodes(controller)  # nothing happens until the agent is back
    agent.start()
    assert exit_code(agent) == RESET_EXIT_CODE
    wait_for(lambda: "n1" not in nodes(controller), what="n1 to be forgotten")
    assert not agent.state_dir.exists()


def test_env_delete_is_refused_with_nodes_and_force_revokes_them(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    (agent,) = provisioned(controller, agents, tmp_path, "n1")
    refused = controller.ctl("env", "delete", "life", check=False)
    assert refused.returncode == 1 and "still has 1 enrolled node(s) (n1)" in refused.stderr
    assert "--force" in refused.stderr and "--reset" in refused.stderr
    assert controller.ctl("env", "delete", "life", "--force").stdout.strip() == "environment/life deleted"
    assert exit_code(agent) == REVOKED_EXIT_CODE
    assert nodes(controller) == {}
    assert "life" not in controller.ctl("env", "list").stdout.split()


def test_env_delete_with_reset_resets_every_node_then_goes(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    started = provisioned(controller, agents, tmp_path, "n1", "n2")
    out = controller.ctl("env", "delete", "life", "--reset")
    assert "being reset" in out.stdout or "deleted" in out.stdout
    for agent in started:
        assert exit_code(agent) == RESET_EXIT_CODE
        assert not agent.state_dir.exists()
    wait_for(lambda: "life" not in controller.ctl("env", "list").stdout.split(), what="the env to go")
    assert nodes(controller) == {}
