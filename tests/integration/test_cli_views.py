"""What an operator reads back: env get, a node's rendered plan, provenance in node describe;
and an enrolled agent restarted with its spent token."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import Agent, Controller

STEPS = """\
    - name: probe
      phase: post-install
      inline: |
        echo "probing"
        echo "widget.version=1.2.3" >> "$TETHER_PROVENANCE"
        echo "widget.path=/opt/widget" >> "$TETHER_PROVENANCE"
"""


def test_env_get_and_the_rendered_plan(controller: Controller, tmp_path: Path) -> None:
    apply_env(controller, tmp_path, "views", STEPS)
    as_yaml = yaml.safe_load(controller.ctl("env", "get", "views").stdout)  # the document as applied
    assert as_yaml["metadata"]["name"] == "views" and as_yaml["spec"]["customTemplates"][0]["name"] == "probe"
    record = json.loads(controller.ctl("env", "get", "views", "-o", "json").stdout)
    assert record["name"] == "views" and record["generation"] == 1
    assert yaml.safe_load(record["document"]) == as_yaml
    missing = controller.ctl("env", "get", "nope", check=False)
    assert missing.returncode != 0 and "environment 'nope' not found" in missing.stderr

    text = controller.ctl("plan", "--env", "views").stdout
    assert "custom-probe" in text
    plan = json.loads(controller.ctl("plan", "--env", "views", "-o", "json").stdout)
    names = [s["name"] for s in plan["steps"]]
    assert names == ["preflight", "custom-probe"]
    probe = plan["steps"][-1]
    assert 'echo "widget.version=1.2.3"' in probe["script"] and probe["digest"]


def test_provenance_reaches_node_describe_and_a_spent_token_is_ignored_after_enrolling(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "views", STEPS)
    agent = agents("viewed")
    join = token(controller, "views")
    agent.start(join, ca_hash(controller))
    wait_state(controller, ["viewed"], "provisioned")
    described = json.loads(controller.ctl("node", "describe", "viewed", "-o", "json").stdout)
    probe = next(s for s in described["steps"] if s["name"] == "custom-probe")
    assert {k: probe["observed"][k] for k in ("widget.version", "widget.path")} == {
        "widget.version": "1.2.3",
        "widget.path": "/opt/widget",
    }
    assert "widget.version=1.2.3" in controller.ctl("node", "describe", "viewed").stdout
    assert json.loads(controller.ctl("plan", "--node", "viewed", "-o", "json").stdout)["steps"]

    assert (agent.state_dir / "key.pem").stat().st_mode & 0o777 == 0o600
    agent.kill()
    agent.start(join, ca_hash(controller))  # the single-use token is spent: the identity is what counts
    wait_state(controller, ["viewed"], "provisioned")
    log = agent.log_path.read_text()
    assert log.count("using stored identity") >= 2 and "refused" not in log
