"""The Python SDK (``tether.controller.client``) against a real controller, and its example
``docs/examples/apply_and_wait.py`` run as a platform team would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import ca_hash
from tests.integration.harness import Agent, Controller
from tether.controller.client import Client, ConfigError
from tether.controller.client.errors import InvalidArgumentError, NotFoundError

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "apply_and_wait.py"
DOCUMENT = (
    "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: {name}\n"
    'spec:\n  customTemplates:\n    - name: hello\n      inline: "echo hello"\n'
)


def run_example(controller: Controller, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_client_from_admin_conf_reads_and_raises_typed_errors(
    controller: Controller, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with Client.from_admin_conf(controller.config) as client:
        assert client.address == controller.address and client.config is not None
        reply = client.apply_environment(DOCUMENT.format(name="sdk"))
        assert reply.changed and reply.environment.generation == 1
        assert client.get_environment("sdk").generation == 1
        assert [e.name for e in client.list_environments()] == ["sdk"]
        with pytest.raises(NotFoundError) as missing:
            client.get_node("nope")
        assert "nope" in missing.value.message and isinstance(missing.value.__cause__, Exception)
        with pytest.raises(InvalidArgumentError):
            client.apply_environment("kind: Environment\nmetadata: {name: bad}\n")
    monkeypatch.setenv("TETHER_CONFIG", str(controller.config))  # as tetherctl: the variable
    with Client.from_admin_conf() as client:
        assert client.get_environment("sdk").name == "sdk"
    with pytest.raises(ConfigError, match="does not exist"):
        Client.from_admin_conf(tmp_path / "missing.conf")


def test_apply_and_wait_exits_like_tetherctl_wait(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    doc = tmp_path / "lab.yaml"
    doc.write_text(DOCUMENT.format(name="lab"))
    timed_out = run_example(controller, str(doc), "--timeout", "1")
    assert timed_out.returncode == 2, timed_out.stderr  # applied, but no node has enrolled
    assert "environment/lab applied (generation 1)" in timed_out.stdout
    assert "waiting: 0/1 node(s) enrolled" in timed_out.stderr and "timed out" in timed_out.stderr
    with Client.from_admin_conf(controller.config) as client:
        join = client.create_token("lab").token
    agents("n1").start(join, ca_hash(controller))
    done = run_example(controller, str(doc), "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert "environment/lab unchanged (generation 1)" in done.stdout
    assert "environment lab: 1 node(s) provisioned" in done.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(DOCUMENT.format(name="lab").replace("echo hello", "") + "  kernel: {version: six}\n")
    refused = run_example(controller, str(bad))
    assert refused.returncode == 1 and "invalid: " in refused.stderr, refused.stderr
    stale = run_example(controller, str(doc), "--expect-generation", "7")
    assert stale.returncode == 1 and "not applied" in stale.stderr, stale.stderr
