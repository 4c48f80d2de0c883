"""Issue 14: a single-node kubeadm environment is a cluster of one; its failed control plane still
gets the generation that fixes it (the rollout's "every control plane healthy" gate keeps other
control planes serving, and a cluster of one has none). Real controller on loopback, a real agent,
real bash: every plan here fails in its first custom template, before anything is installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import ca_hash, nodes, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for


def write_env(path: Path, version: int) -> Path:
    path.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: one}\nspec:\n"
        "  kubernetes: {install: true, installer: kubeadm}\n"
        "  customTemplates:\n"
        "    - name: stop-here\n"
        "      phase: pre-install\n"
        f"      inline: 'echo version {version}; exit 3'\n"
    )
    return path


def test_a_failed_single_node_gets_the_next_generation(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    controller.ctl("env", "apply", "-f", str(write_env(tmp_path / "one.yaml", 1)))
    agent = agents("single")
    agent.start(token(controller, "one", "--role", "control-plane"), ca_hash(controller))
    wait_state(controller, ["single"], "failed", timeout=90)
    plan = controller.ctl("plan", "--node", "single").stdout
    assert "kubeadm-init" in plan and "kubernetes-ready" in plan  # the cluster of one's init node
    controller.ctl("env", "apply", "-f", str(write_env(tmp_path / "one.yaml", 2)))
    wait_for(
        lambda: nodes(controller)["single"]["plan_generation"] == 2,
        timeout=60,
        what="the failed single node to get generation 2",
    )
