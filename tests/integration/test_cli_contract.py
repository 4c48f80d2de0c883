"""What scripts rely on, through a real controller: numbers are numbers and times RFC 3339 in every
json/yaml view, ``env get -o yaml | env apply -f -`` is a no-op, token status, ``version``, -o wide,
``node describe`` in 120 columns, and several controllers in one config with contexts."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for

STEPS = """\
    - name: probe
      phase: post-install
      inline: |
        echo "probing"
        echo "widget.version=1.2.3" >> "$TETHER_PROVENANCE"
        echo "widget.long=$(printf 'x%.0s' $(seq 1 300))" >> "$TETHER_PROVENANCE"
"""
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
TIMES = {"last_seen", "enrolled", "created", "expires", "updated", "updated_at", "time", "started"}
NUMBERS = {
    "generation",
    "plan_generation",
    "from_generation",
    "seq",
    "stored_seq",
    "node_count",
    "uses",
    "max_uses",
    "memory_total_bytes",
    "disk_total_bytes",
    "attempt",
    "exit_code",
    "running",
    "pending",
    "failed",
}


def check_shape(data: Any, where: str = "$") -> int:
    """Every ``*_ms`` gone, every time RFC 3339 (or null), every count a number; how many checked."""
    checked = 0
    if isinstance(data, list):
        return sum(check_shape(v, f"{where}[{i}]") for i, v in enumerate(data))
    if not isinstance(data, dict):
        return 0
    for key, value in data.items():
        at = f"{where}.{key}"
        assert not key.endswith("_ms"), at
        if key in TIMES and not isinstance(value, (dict, list)):
            if key == "updated" and isinstance(value, int):  # Rollout.updated: a count of nodes
                continue
            assert value is None or (isinstance(value, str) and RFC3339.match(value)), (at, value)
            if value:
                parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
                assert abs(parsed.timestamp() - time.time()) < 2 * 86400, (at, value)  # near now
            checked += 1
        elif key in NUMBERS and not isinstance(value, dict):
            assert isinstance(value, int) and not isinstance(value, bool), (at, value)
            checked += 1
        checked += check_shape(value, at)
    return checked


def ctl_json(controller: Controller, *args: str) -> Any:
    return json.loads(controller.ctl(*args, "-o", "json").stdout)


def ctl_input(controller: Controller, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_CONFIG": str(controller.config)}
    return subprocess.run(
        [str(BIN / "tetherctl"), *args], input=text, capture_output=True, text=True, env=env, timeout=60
    )


@pytest.fixture
def provisioned(controller: Controller, agents: Callable[[str], Agent], tmp_path: Path) -> Agent:
    apply_env(controller, tmp_path, "contract", STEPS)
    agent = agents("n1")
    agent.start(token(controller, "contract"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    wait_for(lambda: ctl_json(controller, "node", "describe", "n1")["health"], what="the node's first health")
    return agent


def test_every_json_and_yaml_view_has_numbers_and_rfc3339_times(
    controller: Controller, provisioned: Agent
) -> None:
    views = [
        ("env", "list"),
        ("env", "get", "contract"),
        ("node", "list"),
        ("node", "describe", "n1"),
        ("token", "list"),
        ("events", "--node", "n1"),
        ("rollout", "status", "--env", "contract"),
        ("plan", "--node", "n1"),
        ("agent", "bundles"),
    ]
    for view in views:
        assert check_shape(ctl_json(controller, *view)) > 0 or view[0] == "agent", view
    node = ctl_json(controller, "node", "describe", "n1")
    assert node["plan_generation"] == 1 and isinstance(node["stored_seq"], int)
    assert RFC3339.match(node["enrolled"]) and RFC3339.match(node["health"]["time"])
    assert node["health"]["memory_total_bytes"] > 0 and node["steps"][0]["updated"]
    events = ctl_json(controller, "events", "--node", "n1")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(RFC3339.match(e["time"]) and "time_ms" not in e for e in events)
    rollout = ctl_json(controller, "rollout", "status", "--env", "contract")
    assert isinstance(rollout["updated"], int) and RFC3339.match(rollout["updated_at"])
    # yaml is the same data (its times stay strings, not YAML timestamps)
    for view in (("token", "list"), ("env", "list"), ("rollout", "status", "--env", "contract")):
        as_yaml = yaml.safe_load(controller.ctl(*view, "-o", "yaml").stdout)
        assert as_yaml == ctl_json(controller, *view), view
    follower = subprocess.Popen(
        [str(BIN / "tetherctl"), "events", "--node", "n1", "--follow", "-o", "json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TETHER_CONFIG": str(controller.config)},
    )
    try:
        assert follower.stdout is not None
        followed = [json.loads(follower.stdout.readline()) for _ in events]  # one JSON object a line
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout is not None:
            follower.stdout.close()
    assert followed == events and check_shape(followed)


def test_env_get_yaml_piped_into_apply_is_a_no_op(controller: Controller, tmp_path: Path) -> None:
    document = (
        "# a comment that must survive\n"
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        "metadata: {name: roundtrip}\n"
        "spec:\n  customTemplates:\n    - name: a\n      inline: 'true'   # spaced oddly\n"
    )
    (tmp_path / "rt.yaml").write_text(document)
    assert "generation 1" in controller.ctl("env", "apply", "-f", str(tmp_path / "rt.yaml")).stdout
    got = controller.ctl("env", "get", "roundtrip", "-o", "yaml").stdout
    assert got == document  # the applied document itself, byte for byte
    again = ctl_input(controller, got, "env", "apply", "-f", "-")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "environment/roundtrip unchanged (generation 1)"
    assert ctl_json(controller, "env", "get", "roundtrip")["generation"] == 1


def test_token_list_shows_each_status(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "tok", '    - name: a\n      inline: "true"\n')
    short = token(controller, "tok", "--ttl", "1s", "--description", "short")
    revoked = token(controller, "tok", "--description", "gone")
    used = token(controller, "tok", "--description", "spent")
    token(controller, "tok", "--description", "fresh")
    controller.ctl("token", "revoke", revoked.split(".")[0])
    agents("u1").start(used, ca_hash(controller))
    wait_state(controller, ["u1"], "provisioned")
    time.sleep(1.2)  # the 1 s token has expired
    by_description = {t["description"]: t for t in ctl_json(controller, "token", "list")}
    assert {d: t["status"] for d, t in by_description.items()} == {
        "short": "expired",
        "gone": "revoked",
        "spent": "used up",
        "fresh": "active",
    }
    assert by_description["spent"]["uses"] == 1 and by_description["spent"]["max_uses"] == 1
    assert short.split(".")[0] == by_description["short"]["id"]
    lines = controller.ctl("token", "list").stdout.splitlines()
    assert lines[0].split()[:7] == ["ID", "ENVIRONMENT", "ROLE", "NODE", "USES", "STATUS", "EXPIRES"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "used up" in rows[used.split(".")[0]] and "revoked" in rows[revoked.split(".")[0]]
    wide = controller.ctl("token", "list", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-1] == "CREATED"


def test_version_of_client_and_controller(controller: Controller, tmp_path: Path) -> None:
    text = controller.ctl("version").stdout.splitlines()
    assert text == ["Client:     0.1.0", f"Controller: 0.1.0 (API tether.v1) at {controller.address}"]
    data = ctl_json(controller, "version")
    assert data == {
        "client": {"version": "0.1.0"},
        "controller": {"version": "0.1.0", "api_version": "tether.v1", "address": controller.address},
    }
    controller.kill()
    down = controller.ctl("version", check=False)
    assert down.returncode == 1 and down.stdout == "Client:     0.1.0\n"
    assert "cannot reach the controller" in down.stderr
    alone = subprocess.run(
        [str(BIN / "tetherctl"), "--config", str(tmp_path / "none.conf"), "version", "--client"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert alone.returncode == 0 and alone.stdout == "Client:     0.1.0\n"


def test_wide_lists_and_describe_in_120_columns(controller: Controller, provisioned: Agent) -> None:
    plain = controller.ctl("node", "list").stdout.splitlines()
    wide = controller.ctl("node", "list", "-o", "wide").stdout.splitlines()
    assert plain[0].split() == [
        "NAME",
        "ENVIRONMENT",
        "ROLE",
        "STATE",
        "OS",
        "AGENT",
        "SEEN",
        "ETA",
        "STRAGGLER",
    ]
    assert wide[0].split()[9:] == ["GENERATION", "ARCH", "KERNEL", "GPUS", "ADDRESSES", "ENROLLED"]
    assert "\x1b[" not in "".join(wide)  # off a terminal: no colour codes
    assert controller.ctl("env", "list", "-o", "wide").stdout.split()[6:8] == ["CREATED", "AGENT"]
    described = controller.ctl("node", "describe", "n1").stdout
    assert max(len(line) for line in described.splitlines()) <= 120
    assert "widget.version=1.2.3" in described
    assert "x" * 100 in described  # the long observed value is wrapped, not cut


@pytest.fixture
def second(tmp_path: Path) -> Iterator[Controller]:
    c = Controller(tmp_path / "second")
    (tmp_path / "second").mkdir()
    c.start()
    yield c
    c.kill()


def test_contexts_pick_one_of_several_controllers(
    controller: Controller, second: Controller, tmp_path: Path
) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata: {name: only-a}\n"
        "spec:\n  customTemplates:\n    - name: a\n      inline: 'true'\n"
    )
    controller.ctl("env", "apply", "-f", str(tmp_path / "a.yaml"))
    conf = tmp_path / "contexts.conf"

    def ctl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if k not in ("TETHER_CONFIG", "TETHER_CONTEXT")}
        return subprocess.run(
            [str(BIN / "tetherctl"), "--config", str(conf), *args],
            capture_output=True,
            text=True,
            env={**full, **env},
            timeout=60,
        )

    assert ctl("config", "add-context", "a", "--from", str(controller.config)).returncode == 0
    assert ctl("config", "add-context", "b", "--from", str(second.config)).returncode == 0
    assert conf.stat().st_mode & 0o777 == 0o600
    assert ctl("config", "current-context").stdout == "a\n"  # the first one added
    names = lambda out: [e["name"] for e in json.loads(out.stdout)]  # noqa: E731
    assert names(ctl("env", "list", "-o", "json")) == ["only-a"]
    assert names(ctl("--context", "b", "env", "list", "-o", "json")) == []
    assert names(ctl("env", "list", "-o", "json", TETHER_CONTEXT="b")) == []
    assert names(ctl("--context", "a", "env", "list", "-o", "json", TETHER_CONTEXT="b")) == ["only-a"]
    assert second.address in ctl("--context", "b", "version").stdout
    assert ctl("config", "use-context", "b").returncode == 0
    assert names(ctl("env", "list", "-o", "json")) == []
    listed = ctl("config", "get-contexts").stdout.splitlines()
    assert listed[0].split() == ["CURRENT", "NAME", "CONTROLLER", "USER", "ROLE"]
    assert listed[2].split()[:3] == ["*", "b", second.address]
    missing = ctl("--context", "nope", "env", "list")
    assert missing.returncode == 1 and "no context 'nope' (it has: a, b)" in missing.stderr
    # the plain single-controller file keeps working, and refuses a context it does not have
    shutil.copy(controller.config, tmp_path / "plain.conf")
    os.chmod(tmp_path / "plain.conf", 0o600)
    conf = tmp_path / "plain.conf"
    assert names(ctl("env", "list", "-o", "json")) == ["only-a"]
    assert "has no contexts" in ctl("--context", "b", "env", "list").stderr
