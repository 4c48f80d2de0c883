"""The controller's standard services and the admin API's edges, as a client sees them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for
from tether.nodeagent import anonymous
from tether.nodeagent.identity import CONTROLLER_SERVER_NAME


@pytest.fixture
def anonymous_channel(controller: Controller) -> Iterator[grpc.Channel]:
    import yaml

    ca = yaml.safe_load(controller.config.read_text())["ca"].encode()
    creds = grpc.ssl_channel_credentials(ca, anonymous.key_pem(), anonymous.CERT_PEM)
    channel = grpc.secure_channel(
        controller.address, creds, options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)]
    )
    yield channel
    channel.close()


def test_health_service_reports_serving(anonymous_channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(anonymous_channel)
    for service in ("", "tether.v1.AgentService", "tether.v1.AdminService"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_server_reflection_lists_the_services(anonymous_channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(anonymous_channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"tether.v1.AgentService", "tether.v1.AdminService", "grpc.health.v1.Health"} <= names


def test_the_anonymous_identity_cannot_use_the_admin_api(anonymous_channel: grpc.Channel) -> None:
    from tether.controller import wire

    with pytest.raises(grpc.RpcError) as exc:
        wire.AdminServiceStub(anonymous_channel).ListNodes(wire.admin.ListNodesRequest(), timeout=10)
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_client_without_certificate_is_refused(controller: Controller) -> None:
    import yaml

    ca = yaml.safe_load(controller.config.read_text())["ca"].encode()
    channel = grpc.secure_channel(
        controller.address,
        grpc.ssl_channel_credentials(ca),
        options=[("grpc.ssl_target_name_override", CONTROLLER_SERVER_NAME)],
    )
    with pytest.raises(grpc.RpcError) as exc:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    channel.close()
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE


def test_node_health_is_reported_and_shown(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "h", '    - name: noop\n      inline: "true"\n')
    agents("n1").start(token(controller, "h"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")

    def health() -> dict[str, object]:
        described = json.loads(controller.ctl("node", "describe", "n1", "-o", "json").stdout)
        return described["health"] or {}  # type: ignore[no-any-return]  # null until the first report

    h = wait_for(lambda: health() if health().get("agent_version") else None, what="a health report")
    for key in ("os", "arch", "kernel", "uptime_seconds", "load1", "memory_total_bytes", "disk_total_bytes"):
        assert h.get(key), key
    text = controller.ctl("node", "describe", "n1").stdout
    assert "Health:" in text and "memory" in text


def test_offline_when_the_agent_stops_and_back_when_it_returns(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "o", '    - name: noop\n      inline: "true"\n')
    agent = agents("n1")
    agent.start(token(controller, "o"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    agent.kill()
    wait_state(controller, ["n1"], "offline")
    agent.start()
    wait_state(controller, ["n1"], "provisioned")


def test_revoked_node_is_cut_off_and_cannot_reconnect(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "r", '    - name: noop\n      inline: "true"\n')
    agent = agents("n1")
    agent.start(token(controller, "r"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    controller.ctl("node", "revoke", "n1")
    wait_state(controller, ["n1"], "revoked")
    wait_for(lambda: "revoked or unknown" in agent.log_path.read_text(), what="the agent to be refused")
    # A re-imaged machine enrolls again under the same name with a new token, keeping its history.
    before = json.loads(controller.ctl("events", "--node", "n1", "-o", "json").stdout)
    agent.kill()
    fresh = Agent(tmp_path / "reimaged", "n1", controller)
    (tmp_path / "reimaged").mkdir()
    fresh.start(token(controller, "r"), ca_hash(controller))
    try:
        wait_state(controller, ["n1"], "provisioned")
        after = json.loads(controller.ctl("events", "--node", "n1", "-o", "json").stdout)
        assert after[: len(before)] == before
        assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
    finally:
        fresh.kill()


def test_env_delete_refuses_while_nodes_are_enrolled(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(controller, tmp_path, "d", '    - name: noop\n      inline: "true"\n')
    agents("n1").start(token(controller, "d"), ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    out = controller.ctl("env", "delete", "d", check=False)
    assert out.returncode != 0 and "still has 1 enrolled node" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    controller.ctl("env", "delete", "d", "--force")
    assert "d" not in controller.ctl("env", "list").stdout.split()


def test_invalid_spec_is_rejected_with_every_problem_and_nothing_stored(
    controller: Controller, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\nmetadata:\n  name: bad/name\n"
        "spec:\n  customTemplates:\n    - name: x\n      phase: sometime\n      timeout: -1\n"
    )
    out = controller.ctl("env", "apply", "-f", str(bad), check=False)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) >= 3
    assert any(line.startswith("metadata.name:") for line in lines)
    assert any(line.startswith("spec.customTemplates[0].phase:") for line in lines)
    assert any(line.startswith("spec.customTemplates[0].timeout:") for line in lines)
    offline = controller.ctl("env", "validate", "-f", str(bad), check=False)
    assert offline.returncode != 0 and offline.stdout.strip().splitlines() == lines
    assert json.loads(controller.ctl("env", "list", "-o", "json").stdout) == []


def test_unreachable_controller_is_one_clear_line(controller: Controller) -> None:
    controller.kill()
    out = controller.ctl("node", "list", check=False, timeout=60)
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot reach the controller" in out.stderr
