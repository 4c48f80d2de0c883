"""The adoption pipeline against a simulated machine: order, exactly-once, refusals, secrets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bootstrap.fakes import LAYOUT, Events, FakeBundles, FakeMachine, FakeRegistry, FakeTransport
from tether.bootstrap.delivery import Push
from tether.bootstrap.errors import ConnectError, HostKeyError
from tether.bootstrap.events import Outcome
from tether.bootstrap.install import Request, Result, adopt
from tether.bootstrap.transport import Transport
from tether.nodeagent.secrets import Redactor

FRESH_STEPS = [
    ("connect", "started"),
    ("connect", "succeeded"),
    ("detect", "started"),
    ("detect", "succeeded"),
    ("prereqs", "started"),
    ("prereqs", "skipped"),
    ("agent", "started"),
    ("agent", "succeeded"),
    ("verify", "started"),
    ("verify", "succeeded"),
    ("done", "succeeded"),
]


class Served:
    description = "downloaded from a test URL"

    async def url(self, bundle: Any) -> str:
        return f"http://10.0.0.1:9/bundles/{bundle.sha256}.tar.gz"


async def run(
    machine: FakeMachine,
    registry: FakeRegistry,
    tmp_path: Path,
    *,
    transport: FakeTransport | None = None,
    redactor: Redactor | None = None,
    delivery: Any = None,
    opener: Any = None,
    **overrides: Any,
) -> tuple[Result, Events]:
    machine.registry = registry
    events = Events()
    fields: dict[str, Any] = {
        "environment": "lab",
        "role": "worker",
        "controller": "10.0.0.1:7443",
        "poll_seconds": 0.0,
        "verify_timeout": 0.05,
    }
    fields.update(overrides)
    t = transport or FakeTransport(machine)

    async def open_it() -> Transport:
        return t

    result = await adopt(
        opener or open_it,
        "root@gpu-1",
        Request(**fields),
        registry=registry,
        bundles=FakeBundles(tmp_path),
        delivery=delivery or Push(),
        sink=events,
        redactor=redactor,
    )
    return result, events


async def test_fresh_install_runs_every_step_in_order_and_enrolls(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    result, events = await run(machine, registry, tmp_path)
    assert result.outcome is Outcome.INSTALLED, result.message
    assert events.steps() == FRESH_STEPS
    assert registry.nodes["gpu-1"].environment == "lab"
    assert machine.unit_active == "active"
    # What was written, with which modes; the spent join token is gone again.
    assert machine.mode(LAYOUT.config) == 0o600
    assert machine.mode(LAYOUT.unit) == 0o644
    assert machine.mode(LAYOUT.launcher) == 0o755
    assert not machine.has(LAYOUT.token)
    assert f"write {LAYOUT.token} 600" in machine.changes
    marker = json.loads(machine.text(LAYOUT.marker))
    assert marker["state"] == "installed"
    assert marker["node_name"] == "gpu-1"
    assert marker["token_id"] == registry.created[0]
    assert marker["cert_fingerprint"] == registry.nodes["gpu-1"].cert_fingerprint
    assert "controller: 10.0.0.1:7443" in machine.text(LAYOUT.config)
    assert "token_file: /etc/tether/join-token" in machine.text(LAYOUT.config)


async def test_several_controller_replicas_go_into_the_agent_config(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    result, _ = await run(machine, registry, tmp_path, controller="10.0.0.1:7443,10.0.0.2:7443")
    assert result.outcome is Outcome.INSTALLED, result.message
    config = machine.text(LAYOUT.config)
    assert "controllers:\n- 10.0.0.1:7443\n- 10.0.0.2:7443\n" in config  # the agent tries each
    assert "\ncontroller:" not in config


async def test_detected_facts_are_reported_before_the_first_change(tmp_path: Path) -> None:
    machine = FakeMachine()
    recorded: list[tuple[str, int]] = []
    events = Events()

    def sink(event: Any) -> None:
        events(event)
        recorded.append((event.step.value, len(machine.changes)))

    machine.registry = registry = FakeRegistry()

    async def open_it() -> Transport:
        return FakeTransport(machine)

    await adopt(
        open_it,
        "root@gpu-1",
        Request("lab", "worker", "10.0.0.1:7443", poll_seconds=0),
        registry=registry,
        bundles=FakeBundles(tmp_path),
        delivery=Push(),
        sink=sink,
    )
    detected = [e for e in events.items if e.detected is not None]
    assert len(detected) == 1
    assert detected[0].detected is not None
    assert detected[0].detected.os_id == "debian"
    assert detected[0].detected.arch == "amd64"
    assert "Python 3.11.2" in detected[0].message
    index = events.items.index(detected[0])
    assert recorded[index][1] == 0  # nothing had changed on the machine yet


async def test_the_marker_records_intent_before_the_token_is_written(tmp_path: Path) -> None:
    machine = FakeMachine()
    await run(machine, FakeRegistry(), tmp_path)
    writes = [c for c in machine.changes if c.startswith("write ")]
    assert writes[0] == f"write {LAYOUT.marker} 600"
    assert writes.index(f"write {LAYOUT.marker} 600") < writes.index(f"write {LAYOUT.token} 600")


async def test_second_run_reports_already_installed_and_changes_nothing(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    first, _ = await run(machine, registry, tmp_path)
    assert first.outcome is Outcome.INSTALLED
    machine.changes.clear()
    tokens_before = list(registry.created)
    second, events = await run(machine, registry, tmp_path)
    assert second.outcome is Outcome.ALREADY_INSTALLED, second.message
    assert machine.changes == []
    assert registry.created == tokens_before  # no new join token, nothing rewritten
    assert ("prereqs", "skipped") in events.steps()
    assert ("agent", "skipped") in events.steps()
    assert "already-installed" in events.items[-1].message


async def test_force_reinstalls_bundle_unit_and_config_but_keeps_the_identity(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    await run(machine, registry, tmp_path)
    fingerprint = machine.fingerprint
    identity = {p: machine.files[p] for p in LAYOUT.identity_files}
    machine.changes.clear()
    result, _ = await run(machine, registry, tmp_path, force=True)
    assert result.outcome is Outcome.REINSTALLED, result.message
    assert len(registry.created) == 1  # no token for a reinstall
    assert {p: machine.files[p] for p in LAYOUT.identity_files} == identity
    assert machine.fingerprint == fingerprint
    assert not any(LAYOUT.token in c for c in machine.changes)
    assert not any(LAYOUT.state_dir in c and "bootstrap.json" not in c for c in machine.changes)
    assert any(c.startswith("unpack ") for c in machine.changes)  # --force delivers the bundle again
    assert f"write {LAYOUT.unit} 644" in machine.changes
    assert f"write {LAYOUT.config} 600" in machine.changes


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"systemd": False}, "systemd is not running"),
        ({"machine": "riscv64"}, "unsupported architecture riscv64"),
        (
            {
                "pythons": {"/usr/bin/python3": "3.8.10"},
                "os_id": "ubuntu",
                "os_version": "20.04",
                "pretty": "Ubuntu 20.04.6 LTS",
            },
            "Ubuntu 20.04.6 LTS has no Python >= 3.10",
        ),
        ({"libc": "musl 1.2"}, "glibc >= 2.17"),
        ({"hostname": "Bad_Name!"}, "not a valid node name"),
    ],
)
async def test_unsupported_hosts_are_refused_with_a_reason_and_left_untouched(
    tmp_path: Path, change: dict[str, Any], reason: str
) -> None:
    machine, registry = FakeMachine(**change), FakeRegistry()
    result, events = await run(machine, registry, tmp_path)
    assert result.outcome is Outcome.REFUSED
    assert reason in result.message
    assert machine.changes == []
    assert registry.created == []
    assert ("detect", "failed") in events.steps()
    assert events.items[-1].outcome is Outcome.REFUSED


async def test_old_python_is_replaced_by_the_distro_package(tmp_path: Path) -> None:
    machine = FakeMachine(
        os_id="rocky",
        os_version="9.4",
        pretty="Rocky Linux 9.4",
        package_manager="dnf",
        pythons={"/usr/bin/python3": "3.9.18"},
        installable={"python3.11": "3.11.7"},
    )
    result, events = await run(machine, FakeRegistry(), tmp_path)
    assert result.outcome is Outcome.INSTALLED, result.message
    assert ("prereqs", "succeeded") in events.steps()
    assert machine.changes[0] == "install python3.11"
    assert "/usr/bin/python3.11" in machine.text(LAYOUT.launcher)
    assert "will install python3.11" in next(
        e.message for e in events.items if e.step.value == "detect" and e.kind.label == "succeeded"
    )


async def test_a_node_name_enrolled_by_another_machine_is_never_taken_over(tmp_path: Path) -> None:
    registry = FakeRegistry()
    other = FakeMachine()
    await run(other, registry, tmp_path)
    fresh = FakeMachine()  # same hostname, no identity: another (or a re-imaged) machine
    result, _ = await run(fresh, registry, tmp_path)
    assert result.outcome is Outcome.REFUSED
    assert "already enrolled by another machine" in result.message
    assert "tetherctl node revoke gpu-1" in result.message
    assert fresh.changes == []
    assert len(registry.created) == 1


async def test_a_machine_installed_under_another_name_is_refused(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    await run(machine, registry, tmp_path)
    machine.changes.clear()
    result, _ = await run(machine, registry, tmp_path, node_name="other-name")
    assert result.outcome is Outcome.REFUSED
    assert "already installed as node 'gpu-1'" in result.message
    assert machine.changes == []


async def test_an_unfinished_install_is_redone_with_a_new_token_and_the_old_one_revoked(
    tmp_path: Path,
) -> None:
    machine, registry = FakeMachine(agent_enrolls=False), FakeRegistry()
    first, _ = await run(machine, registry, tmp_path)
    assert first.outcome is Outcome.FAILED
    assert "journal: enrollment refused" in first.message
    assert json.loads(machine.text(LAYOUT.marker))["state"] == "installing"
    machine.agent_enrolls = True
    second, _ = await run(machine, registry, tmp_path)
    assert second.outcome is Outcome.INSTALLED, second.message
    assert registry.revoked == [registry.created[0]]
    assert len(registry.created) == 2


async def test_events_and_results_never_carry_the_token_or_credentials(tmp_path: Path) -> None:
    password, passphrase = "pw-canary-8f1e2d3c", "pp-canary-0a9b8c7d"
    redactor = Redactor([password, passphrase])
    machine, registry = FakeMachine(), FakeRegistry()

    class Careless(FakeTransport):
        async def run(self, command: str, **kw: Any) -> Any:
            if command.startswith("journalctl"):  # a failing agent whose log shows secrets
                token = registry.tokens[registry.created[-1]][0]
                from tether.bootstrap.transport import CommandResult

                return CommandResult(0, f"bad token {token} from {password} / {passphrase}\n", "")
            return await super().run(command, **kw)

    machine.agent_enrolls = False
    result, events = await run(machine, registry, tmp_path, transport=Careless(machine), redactor=redactor)
    token = registry.tokens[registry.created[0]][0]
    assert result.outcome is Outcome.FAILED
    assert "bad token [REDACTED]" in result.message  # the journal tail made it in, masked
    shown = events.text() + result.message + repr(result)
    for secret in (token, token.split(".")[1], password, passphrase):
        assert secret not in shown
    assert token.encode() in machine.stdin_seen or machine.has(LAYOUT.token)  # it did reach the machine


async def test_connection_failures_end_the_run_as_failed_or_refused(tmp_path: Path) -> None:
    async def unreachable() -> Transport:
        raise ConnectError("cannot reach root@gpu-1: Connection refused")

    async def wrong_key() -> Transport:
        raise HostKeyError("host key mismatch for gpu-1")

    machine = FakeMachine()
    failed, events = await run(machine, FakeRegistry(), tmp_path, opener=unreachable)
    assert failed.outcome is Outcome.FAILED
    assert events.items[-1].retryable
    refused, events = await run(machine, FakeRegistry(), tmp_path, opener=wrong_key)
    assert refused.outcome is Outcome.REFUSED
    assert events.steps() == [("connect", "started"), ("connect", "failed"), ("done", "failed")]
    assert machine.commands == []


async def test_a_transport_that_records_input_must_download_the_bundle(tmp_path: Path) -> None:
    machine = FakeMachine()
    result, _ = await run(
        machine, FakeRegistry(), tmp_path, transport=FakeTransport(machine, confidential=False)
    )
    assert result.outcome is Outcome.FAILED
    assert "--bundle-s3" in result.message  # says how to give the node a URL
    assert machine.stdin_seen == []


async def test_a_downloading_node_gets_the_url_and_the_checksum(tmp_path: Path) -> None:
    machine = FakeMachine()
    result, _ = await run(machine, FakeRegistry(), tmp_path, delivery=Served())
    assert result.outcome is Outcome.INSTALLED, result.message
    unpack = next(c for c in machine.commands if "import compileall" in c)
    assert "http://10.0.0.1:9/bundles/" in unpack
    assert not any(LAYOUT.cache_dir in c for c in machine.changes)  # nothing pushed


async def test_unknown_environment_fails_before_any_change(tmp_path: Path) -> None:
    machine = FakeMachine()
    result, _ = await run(machine, FakeRegistry(), tmp_path, environment="nope")
    assert result.outcome is Outcome.FAILED
    assert "environment 'nope' not found" in result.message
    assert machine.changes == []


async def test_a_failure_before_the_agent_starts_revokes_the_new_token(tmp_path: Path) -> None:
    machine, registry = FakeMachine(unpack_fails=True), FakeRegistry()
    result, events = await run(machine, registry, tmp_path)
    assert result.outcome is Outcome.FAILED
    assert "unpacking the agent bundle failed (exit 1): agent bundle checksum mismatch" in result.message
    assert registry.revoked == registry.created
    assert ("agent", "failed") in events.steps()
    assert machine.unit_active == "inactive"
    assert not machine.has(LAYOUT.token)


async def test_a_reinstall_pins_the_controller_ca_from_the_registry(tmp_path: Path) -> None:
    machine, registry = FakeMachine(), FakeRegistry()
    await run(machine, registry, tmp_path)
    machine.files.pop(LAYOUT.marker)  # an agent some other tool installed: no marker to read from
    result, _ = await run(machine, registry, tmp_path, force=True)
    assert result.outcome is Outcome.REINSTALLED, result.message
    assert f"ca_hash: {registry.ca_hash}" in machine.text(LAYOUT.config)
