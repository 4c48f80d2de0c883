"""Issue 12: ``tether-controller serve --metrics-listen`` (Prometheus /metrics, /healthz, /readyz)
and the agent's ``--metrics-textfile``, scraped from a real controller and a real agent that
provisions a node and then takes part in a rollout."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import sqlite3
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import ca_hash, token, wait_state
from tests.integration.harness import BIN, Agent, Controller, wait_for
from tests.tools import system_tool

pytestmark = pytest.mark.integration

STEP = "custom-driver"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def promtool() -> str:
    return system_tool("promtool", "prometheus")


def promtool_check(text: str) -> None:
    out = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0, f"promtool check metrics: {out.stdout}{out.stderr}"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def write_env(path: Path, version: str) -> Path:
    path.write_text(
        "apiVersion: holodeck.nvidia.com/v1alpha1\nkind: Environment\n"
        "metadata:\n  name: gpu\nspec:\n  customTemplates:\n"
        f"    - name: driver\n      inline: |\n        echo installed {version}\n"
    )
    return path


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[tuple[Controller, str]]:
    """A controller with its metrics listener on a free port, and that listener's address."""
    c = Controller(tmp_path, extra_args=("--metrics-listen", "127.0.0.1:0"))
    c.start()
    try:
        assert c.proc is not None and c.proc.stdout is not None
        line = c.proc.stdout.readline()
        m = re.fullmatch(r"metrics on (127\.0\.0\.1:\d+)\n", line)
        assert m, f"expected 'metrics on HOST:PORT' after the listening line, got {line!r}"
        yield c, m.group(1)
    finally:
        c.kill()


def stored_events(c: Controller) -> int:
    with contextlib.closing(sqlite3.connect(c.data_dir / "tether.db")) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])


@pytest.mark.timeout(600)
def test_scrape_after_provisioning_and_a_rollout(metered: tuple[Controller, str], tmp_path: Path) -> None:
    controller, address = metered
    base = f"http://{address}"
    assert get(f"{base}/healthz") == (200, "ok event loop\n")
    status, body = get(f"{base}/readyz")
    assert status == 200 and "ok store" in body and f"ok grpc {controller.address}" in body, body

    controller.ctl("env", "apply", "-f", str(write_env(tmp_path / "v1.yaml", "v1")))
    textfile = tmp_path / "textfile" / "tether-agent.prom"
    textfile.parent.mkdir()
    agent = Agent(tmp_path, "node-1", controller)
    agent.start(token(controller, "gpu"), ca_hash(controller), "--metrics-textfile", str(textfile))
    try:
        wait_state(controller, ["node-1"], "provisioned", timeout=90)
        controller.ctl("env", "apply", "-f", str(write_env(tmp_path / "v2.yaml", "v2")))
        complete = ("tether_rollout_state", (("environment", "gpu"), ("state", "complete")))
        wait_for(lambda: samples(get(f"{base}/metrics")[1]).get(complete) == 1, 90, what="rollout complete")
        wait_state(controller, ["node-1"], "provisioned", timeout=60)
        text = wait_for(lambda: _settled(controller, base), 30, what="events stored = the store's rows")
        _check_controller_figures(samples(text))
        promtool_check(text)

        agent_text = wait_for(lambda: _agent_settled(textfile), 30, what="the agent's textfile")
        promtool_check(agent_text)
    finally:
        agent.kill(signal.SIGTERM)


def _settled(controller: Controller, base: str) -> str | None:
    """The scrape once the events counter equals the rows in the store (the agent has gone quiet)."""
    status, text = get(f"{base}/metrics")
    assert status == 200
    counted = samples(text)[("tether_events_stored_total", ())]
    return text if counted == stored_events(controller) and counted > 0 else None


def _check_controller_figures(got: Samples) -> None:
    gpu = (("environment", "gpu"),)
    assert got[("tether_agents_connected", ())] == 1
    assert got[("tether_nodes", (*gpu, ("state", "provisioned")))] == 1
    assert got[("tether_nodes", (*gpu, ("state", "failed")))] == 0
    assert got[("tether_enrollments_total", (("result", "enrolled"),))] == 1
    assert got[("tether_enrollments_total", (("result", "refused"),))] == 0
    finished = (*gpu, ("result", "succeeded"), ("step", STEP))
    assert got[("tether_step_duration_seconds_count", finished)] == 2  # generation 1, then 2
    assert got[("tether_rpc_duration_seconds_count", (("method", "Enroll"),))] == 1
    assert got[("tether_rpc_duration_seconds_count", (("method", "ApplyEnvironment"),))] == 2
    assert got[("tether_store_commit_duration_seconds_count", ())] > 0
    assert got[("tether_store_writes_total", ())] >= got[("tether_store_commit_duration_seconds_count", ())]
    assert got[("tether_rollout_generation", gpu)] == 2
    assert got[("tether_rollout_nodes", (*gpu, ("stage", "updated")))] == 1
    assert not any(dict(labels).get("node") for _, labels in got), "no metric names a node"


def _agent_settled(path: Path) -> str | None:
    if not path.exists():
        return None
    text = path.read_text()
    got = samples(text)
    done = got.get(("tether_agent_steps", (("state", "succeeded"),)))
    if got.get(("tether_agent_plan_generation", ())) != 2 or not done:
        return None
    assert got[("tether_agent_connected", ())] == 1
    assert got[("tether_agent_outbox_pending_events", ())] == 0
    assert got[("tether_agent_steps", (("state", "failed"),))] == 0
    assert got[("tether_agent_last_connected_timestamp_seconds", ())] > 1_600_000_000
    return text


def test_readiness_fails_while_stopping_and_the_listener_goes_with_the_controller(
    metered: tuple[Controller, str],
) -> None:
    controller, address = metered
    assert get(f"http://{address}/readyz")[0] == 200
    assert controller.proc is not None
    controller.proc.send_signal(signal.SIGTERM)
    assert controller.proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/healthz", timeout=5)


def test_a_taken_metrics_port_fails_the_start_and_leaves_no_state(tmp_path: Path) -> None:
    data_dir = tmp_path / "controller"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                str(BIN / "tether-controller"),
                "serve",
                "--data-dir",
                str(data_dir),
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == f"tether-controller: cannot listen on 127.0.0.1:{port}: the port is already in use"
    )
    assert not data_dir.exists()


def test_grpc_health_answers_the_public_anonymous_identity(metered: tuple[Controller, str]) -> None:
    """What docs/operations.md tells a probe on the gRPC port to do (no node or admin certificate)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tether.controller.adminconf import AdminConfig
    from tether.nodeagent import anonymous

    controller, _ = metered
    creds = grpc.ssl_channel_credentials(
        root_certificates=AdminConfig.read(controller.config).ca_pem,
        private_key=anonymous.key_pem(),
        certificate_chain=anonymous.CERT_PEM,
    )
    with grpc.secure_channel(controller.address, creds) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tether.v1.AgentService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
