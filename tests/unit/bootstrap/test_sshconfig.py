"""holodeck's ``auth.sshConfig`` for ``tetherctl bootstrap --inventory env.yaml``: parsing, the host key
decision (strict unless asked; ``off`` only with --insecure-ignore-host-key), and the asyncssh options
it turns into (bastion tunnel, agent path, timeouts, keepalive, retries)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh
import pytest
import yaml

from tether.bootstrap import inventory, ssh, sshconfig
from tether.bootstrap.errors import ConnectError, HostKeyError
from tether.bootstrap.hostkeys import HostKeyPolicy, HostKeyVerifier, decide_mode, policy_for
from tether.bootstrap.inventory import Entry
from tether.controller.cli import bootstrap_run
from tether.controller.cli.client import CliError
from tether.controller.cli.main import _parser
from tether.controller.spec import SpecError, load_document
from tether.nodeagent.secrets import Secret

FULL = {
    "bastion": {"host": "bastion.example.com:2222", "username": "ec2-user", "privateKey": "./bastion.pem"},
    "useAgent": True,
    "agentSocket": "/run/agent.sock",
    "knownHostsPolicy": "accept-new",
    "connectTimeout": "10s",
    "handshakeTimeout": "1m30s",
    "keepaliveInterval": 20,
    "maxRetries": 3,
}


def environment(ssh_config: Any, **auth: Any) -> dict[str, Any]:
    return {
        "apiVersion": "holodeck.nvidia.com/v1alpha1",
        "kind": "Environment",
        "metadata": {"name": "lab"},
        "spec": {
            "provider": "ssh",
            "auth": {"username": "ubuntu", "privateKey": "./id_ed25519", "sshConfig": ssh_config, **auth},
            "instance": {"hostUrl": "10.0.0.5"},
        },
    }


# --- parsing -------------------------------------------------------------------------------------


def test_every_field_is_read_with_holodeck_spellings_and_go_durations() -> None:
    config, problems, unknown = sshconfig.parse(FULL)
    assert problems == [] and unknown == []
    assert config == sshconfig.SshConfig(
        bastion=sshconfig.Bastion("bastion.example.com", 2222, "ec2-user", "./bastion.pem"),
        use_agent=True,
        agent_socket="/run/agent.sock",
        known_hosts_policy="accept-new",
        connect_timeout=10.0,
        handshake_timeout=90.0,
        keepalive_interval=20.0,
        max_retries=3,
    )
    assert config.bastion is not None and config.bastion.endpoint == "ec2-user@bastion.example.com:2222"
    # Go decodes JSON keys case-insensitively; so does tether. Zero means "the default" (holodeck).
    same, problems, _ = sshconfig.parse(
        {"KnownHostsPolicy": "strict", "connecttimeout": "0s", "MaxRetries": 0}
    )
    assert problems == [] and same == sshconfig.SshConfig(known_hosts_policy="strict")
    v6, _, _ = sshconfig.parse({"bastion": {"host": "[fd00::1]:22", "port": 22}})
    assert v6.bastion == sshconfig.Bastion("fd00::1", 22) and v6.bastion.endpoint == "[fd00::1]:22"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5s", 1.5), ("0", 0.0), ("45", 45.0), (7, 7.0)],
)
def test_durations(text: Any, seconds: float) -> None:
    assert sshconfig.parse_duration(text) == seconds


def test_every_problem_is_reported_with_its_path() -> None:
    raw = {
        "bastion": {"username": "a b", "port": 70000, "colour": "blue"},
        "useAgent": "yes",
        "knownHostsPolicy": "yolo",
        "connectTimeout": "ten seconds",
        "handshakeTimeout": "2h",
        "maxRetries": -1,
        "keepaliveCountMax": 3,
    }
    config, problems, unknown = sshconfig.parse(raw, "spec.auth.sshConfig")
    found = dict(problems)
    assert set(found) == {
        "spec.auth.sshConfig.bastion.host",
        "spec.auth.sshConfig.bastion.username",
        "spec.auth.sshConfig.bastion.port",
        "spec.auth.sshConfig.useAgent",
        "spec.auth.sshConfig.knownHostsPolicy",
        "spec.auth.sshConfig.connectTimeout",
        "spec.auth.sshConfig.handshakeTimeout",
        "spec.auth.sshConfig.maxRetries",
    }
    assert "required" in found["spec.auth.sshConfig.bastion.host"]
    assert "strict, accept-new, off" in found["spec.auth.sshConfig.knownHostsPolicy"]
    assert sorted(unknown) == ["spec.auth.sshConfig.bastion.colour", "spec.auth.sshConfig.keepaliveCountMax"]
    assert config.bastion is None and config.known_hosts_policy == ""
    _, problems, _ = sshconfig.parse({"bastion": {"host": "h:2200", "port": 22}})
    assert problems == [("spec.auth.sshConfig.bastion.port", "host says port 2200, port says 22")]
    assert sshconfig.parse(["no"])[1] == [("spec.auth.sshConfig", "must be a mapping")]


# --- the inventory -------------------------------------------------------------------------------


def test_an_environment_s_ssh_config_becomes_every_node_s_settings() -> None:
    notes: list[str] = []
    (entry,) = inventory.parse(environment({**FULL, "extra": 1}), "env.yaml", Entry(), notes)
    assert entry.target == "ubuntu@10.0.0.5" and entry.identity == "./id_ed25519"
    assert entry.jump == "ec2-user@bastion.example.com:2222" and entry.jump_identity == "./bastion.pem"
    assert (entry.host_key_policy, entry.use_agent, entry.agent_socket) == (
        "accept-new",
        True,
        "/run/agent.sock",
    )
    assert (entry.connect_timeout, entry.handshake_timeout, entry.keepalive_interval) == (10.0, 90.0, 20.0)
    assert entry.max_retries == 3
    assert notes == ["spec.auth.sshConfig.extra: unknown field, ignored"]
    # The bastion without a username logs in as the node's user (holodeck's hop-1 fallback).
    (entry,) = inventory.parse(environment({"bastion": {"host": "jump"}}), "env.yaml", Entry())
    assert entry.jump == "jump:22" and ssh.SshEndpoint.parse(entry.jump, entry.user) == ssh.SshEndpoint(
        "jump", 22, "ubuntu"
    )
    assert entry.host_key_policy == "" and entry.jump_identity == ""


def test_a_bad_ssh_config_is_refused_with_every_problem() -> None:
    doc = environment({"knownHostsPolicy": "sometimes", "bastion": {"port": 1}})
    with pytest.raises(inventory.InventoryError) as err:
        inventory.parse(doc, "env.yaml", Entry())
    text = "\n".join(err.value.problems)
    assert "spec.auth.sshConfig.knownHostsPolicy: must be one of" in text
    assert "spec.auth.sshConfig.bastion.host: required" in text


def test_a_tether_inventory_takes_the_same_settings() -> None:
    doc = {
        "defaults": {
            "env": "lab",
            "jump": "ops@bastion",
            "jump_identity": "./b.pem",
            "connect_timeout": "5s",
        },
        "nodes": [
            {"ssh": "10.0.0.5", "host_key_policy": "accept-new", "max_retries": 2, "use_agent": True},
            {"ssh": "10.0.0.6", "host_key_policy": "maybe", "handshake_timeout": "soon", "max_retries": -1},
        ],
    }
    with pytest.raises(inventory.InventoryError) as err:
        inventory.parse(doc, "inv.yaml", Entry())
    text = "\n".join(err.value.problems)
    for phrase in (
        "nodes[1].host_key_policy: must be one of",
        "nodes[1].handshake_timeout:",
        "nodes[1].max_retries:",
    ):
        assert phrase in text
    doc["nodes"] = doc["nodes"][:1]
    (entry,) = inventory.parse(doc, "inv.yaml", Entry())
    assert (entry.jump_identity, entry.connect_timeout, entry.max_retries, entry.use_agent) == (
        "./b.pem",
        5.0,
        2,
        True,
    )
    with pytest.raises(inventory.InventoryError, match="jump_identity: there is no jump host"):
        inventory.parse({"nodes": [{"ssh": "h", "env": "lab", "jump_identity": "k"}]}, "inv.yaml", Entry())


# --- the host key decision -----------------------------------------------------------------------


def test_strict_unless_asked_accept_new_only_when_asked() -> None:
    assert decide_mode() == "strict"
    assert decide_mode("strict") == "strict"
    assert decide_mode("accept-new") == "accept-new"
    assert decide_mode(accept_new=True) == "accept-new"
    assert decide_mode("accept-new", accept_new=True) == "accept-new"
    assert decide_mode(pinned=True) == "strict" and decide_mode("strict", pinned=True) == "strict"


def test_off_is_refused_without_the_insecure_flag_and_conflicts_are_never_guessed() -> None:
    with pytest.raises(HostKeyError, match="refused unless --insecure-ignore-host-key"):
        decide_mode("off")
    assert decide_mode("off", insecure=True) == "off"
    assert decide_mode(insecure=True) == "off"  # the flag alone says so too
    for kwargs in (
        {"policy": "strict", "accept_new": True},
        {"policy": "strict", "insecure": True},
        {"policy": "accept-new", "insecure": True},
        {"policy": "accept-new", "pinned": True},
        {"policy": "off", "accept_new": True, "insecure": True},
        {"pinned": True, "insecure": True},
    ):
        with pytest.raises(HostKeyError, match="conflicting host key settings"):
            decide_mode(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(HostKeyError, match="unknown knownHostsPolicy"):
        decide_mode("tofu")


def test_off_verifies_nothing_and_the_other_modes_keep_their_rules(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    off = HostKeyVerifier(policy_for("off", known_hosts=(tmp_path / "kh",)), "10.0.0.5", 22)
    assert off.known_hosts is None and off.validate("10.0.0.5", "10.0.0.5", 22, key)
    assert not (tmp_path / "kh").exists()  # nothing learned, nothing written
    strict = HostKeyVerifier(policy_for("strict", known_hosts=(tmp_path / "kh",)), "10.0.0.5", 22)
    assert strict.known_hosts is not None and not strict.validate("10.0.0.5", "10.0.0.5", 22, key)
    tofu = policy_for("accept-new", known_hosts=(tmp_path / "kh",))
    assert tofu.accept_new and tofu.verify and tofu.mode == "accept-new"
    assert HostKeyPolicy(verify=False).without_pin().verify is False


# --- from the command line to asyncssh -----------------------------------------------------------


def key_file(path: Path) -> Path:
    path.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    return path


def parse_args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["bootstrap", *argv])


def write_env(tmp_path: Path, ssh_config: dict[str, Any]) -> Path:
    key_file(tmp_path / "id_ed25519")
    key_file(tmp_path / "bastion.pem")
    doc = environment(ssh_config)
    doc["spec"]["auth"]["privateKey"] = str(tmp_path / "id_ed25519")
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_target_built_from_an_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    config = {**FULL, "bastion": {**FULL["bastion"], "privateKey": str(tmp_path / "bastion.pem")}}
    args = parse_args("--inventory", str(write_env(tmp_path, config)))
    (entry,) = bootstrap_run._entries(args)
    secrets = bootstrap_run._Secrets()
    target = bootstrap_run._ssh_target(entry, args, secrets)
    assert target.endpoint == ssh.SshEndpoint("10.0.0.5", 22, "ubuntu")
    assert target.jump == ssh.SshEndpoint("bastion.example.com", 2222, "ec2-user")
    assert target.jump_credentials is not None and target.jump_credentials.private_key
    assert target.jump_credentials.private_key != target.credentials.private_key
    assert not target.jump_credentials.agent_path  # holodeck: the bastion hop never uses the agent
    assert target.credentials.agent_path == "/run/agent.sock"
    assert target.host_keys.mode == "accept-new"
    assert (target.connect_timeout, target.handshake_timeout) == (10.0, 90.0)
    assert target.timeouts() == (100.0, 90.0)
    assert (target.keepalive_interval, target.attempts) == (20.0, 3)
    assert str(target) == "ubuntu@10.0.0.5 via ec2-user@bastion.example.com:2222"
    for secret in (target.credentials.private_key, target.jump_credentials.private_key):
        assert (
            secret.reveal() not in repr(target) and secrets.redactor.redact(secret.reveal()) == "[REDACTED]"
        )


def test_without_ssh_config_nothing_changes(tmp_path: Path) -> None:
    args = parse_args("--inventory", str(write_env(tmp_path, {})))
    (entry,) = bootstrap_run._entries(args)
    target = bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets())
    assert target.jump is None and target.jump_credentials is None
    assert target.host_keys.mode == "strict"
    assert target.timeouts() == (ssh.CONNECT_TIMEOUT, ssh.CONNECT_TIMEOUT) and target.attempts == 1
    # Only connectTimeout: the handshake gets holodeck's default on top.
    args = parse_args("--inventory", str(write_env(tmp_path, {"connectTimeout": "4s"})))
    (entry,) = bootstrap_run._entries(args)
    t = bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets())
    assert t.timeouts() == (4.0 + ssh.HANDSHAKE_TIMEOUT, ssh.HANDSHAKE_TIMEOUT)


def test_agent_socket_is_used_only_with_use_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/env-agent.sock")
    path = write_env(tmp_path, {"agentSocket": "/run/file-agent.sock"})  # no useAgent: ignored
    for flags, agent in ((("--ssh-agent",), "/run/env-agent.sock"), ((), "")):
        args = parse_args("--inventory", str(path), *flags)
        (entry,) = bootstrap_run._entries(args)
        assert (
            bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets()).credentials.agent_path == agent
        )
    path = write_env(tmp_path, {"agentSocket": "/run/file-agent.sock", "useAgent": True})
    args = parse_args("--inventory", str(path))
    (entry,) = bootstrap_run._entries(args)
    target = bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets())
    assert target.credentials.agent_path == "/run/file-agent.sock"


def test_off_in_the_file_needs_the_flag_and_flags_must_agree_with_the_file(tmp_path: Path) -> None:
    path = write_env(tmp_path, {"knownHostsPolicy": "off"})
    with pytest.raises(CliError, match="refused unless --insecure-ignore-host-key"):
        bootstrap_run._entries(parse_args("--inventory", str(path)))
    args = parse_args("--inventory", str(path), "--insecure-ignore-host-key")
    (entry,) = bootstrap_run._entries(args)
    assert bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets()).host_keys.verify is False
    strict = write_env(tmp_path, {"knownHostsPolicy": "strict"})
    with pytest.raises(CliError, match="conflicting host key settings: knownHostsPolicy strict, --accept"):
        bootstrap_run._entries(parse_args("--inventory", str(strict), "--accept-new-host-key"))
    tofu = write_env(tmp_path, {"knownHostsPolicy": "accept-new"})
    args = parse_args("--inventory", str(tofu))
    (entry,) = bootstrap_run._entries(args)
    assert bootstrap_run._ssh_target(entry, args, bootstrap_run._Secrets()).host_keys.accept_new


def test_via_controller_refuses_what_its_request_cannot_carry(tmp_path: Path) -> None:
    config = {"bastion": {"host": "b", "privateKey": str(tmp_path / "bastion.pem")}, "maxRetries": 2}
    args = parse_args("--inventory", str(write_env(tmp_path, config)), "--via-controller")
    (entry,) = bootstrap_run._entries(args)
    with pytest.raises(CliError, match=r"cannot carry a bastion key of its own .*maxRetries"):
        bootstrap_run._request_pb(entry, args, bootstrap_run._Secrets(), "10.0.0.1:7443")
    args = parse_args("--inventory", str(write_env(tmp_path, {"knownHostsPolicy": "accept-new"})))
    (entry,) = bootstrap_run._entries(args)
    request = bootstrap_run._request_pb(entry, args, bootstrap_run._Secrets(), "10.0.0.1:7443")
    assert request.ssh.accept_new_host_key


@dataclass
class FakeConn:
    host: str
    options: dict[str, Any]
    closed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def set_extra_info(self, **kw: Any) -> None:
        self.extra.update(kw)

    async def run(self, command: str, **kw: Any) -> Any:
        return argparse.Namespace(exit_status=0, returncode=0, stdout=b"0\n", stderr=b"")

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


def target_with_bastion(tmp_path: Path, **kw: Any) -> ssh.SshTarget:
    node_key = Secret(key_file(tmp_path / "node").read_text())
    bastion_key = Secret(key_file(tmp_path / "bastion").read_text())
    return ssh.SshTarget(
        ssh.SshEndpoint("10.0.0.12", 22, "root"),
        ssh.SshCredentials(node_key, agent_path="/run/agent.sock"),
        HostKeyPolicy(known_hosts=(tmp_path / "known_hosts",), pinned=kw.pop("pinned", "")),
        ssh.SshEndpoint("10.0.0.11", 2222, "tester"),
        connect_timeout=10.0,
        jump_credentials=ssh.SshCredentials(bastion_key),
        handshake_timeout=20.0,
        keepalive_interval=7.0,
        **kw,
    )


async def test_the_bastion_is_dialled_first_and_carries_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[FakeConn] = []

    async def fake_connect(host: str, **options: Any) -> FakeConn:
        calls.append(FakeConn(host, options))
        return calls[-1]

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    pinned = (
        "ssh-ed25519 " + asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[1]
    )
    transport = await ssh.connect(target_with_bastion(tmp_path, pinned=pinned))
    bastion, node = calls
    assert (bastion.host, bastion.options["port"], bastion.options["username"]) == (
        "10.0.0.11",
        2222,
        "tester",
    )
    assert "tunnel" not in bastion.options and node.options["tunnel"] is bastion
    assert (node.host, node.options["port"], node.options["username"]) == ("10.0.0.12", 22, "root")
    # Each hop logs in with its own key; the agent is offered to the target only.
    assert bastion.options["client_keys"][0] != node.options["client_keys"][0]
    assert bastion.options["agent_path"] is None and node.options["agent_path"] == "/run/agent.sock"
    for conn in calls:
        assert conn.options["connect_timeout"] == 30.0 and conn.options["login_timeout"] == 20.0
        assert conn.options["keepalive_interval"] == 7.0 and conn.options["config"] == []
    # Both host keys are verified: the target against its pin, the bastion against the files.
    assert node.options["known_hosts"].match("10.0.0.12", "10.0.0.12", None)[0]
    assert bastion.options["known_hosts"] is not None
    assert not bastion.options["known_hosts"].match("10.0.0.11", "10.0.0.11", 2222)[0]
    await transport.close()
    assert bastion.closed and node.closed


async def test_off_passes_no_known_hosts_to_either_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[FakeConn] = []

    async def fake_connect(host: str, **options: Any) -> FakeConn:
        calls.append(FakeConn(host, options))
        return calls[-1]

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    target = target_with_bastion(tmp_path)
    target = ssh.SshTarget(**{**target.__dict__, "host_keys": policy_for("off")})
    await (await ssh.connect(target)).close()
    assert [c.options["known_hosts"] for c in calls] == [None, None]


async def test_connecting_is_retried_max_retries_times_but_a_refused_key_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[str] = []
    monkeypatch.setattr(ssh, "RETRY_DELAY", 0.0)

    async def refused(host: str, **options: Any) -> FakeConn:
        attempts.append(host)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(asyncssh, "connect", refused)
    with pytest.raises(
        ConnectError, match=r"cannot reach bastion tester@10\.0\.0\.11:2222: Connection refused"
    ):
        await ssh.connect(target_with_bastion(tmp_path, attempts=3))
    assert attempts == ["10.0.0.11"] * 3

    async def bad_key(host: str, **options: Any) -> FakeConn:
        attempts.append(host)
        raise asyncssh.HostKeyNotVerifiable("no")

    attempts.clear()
    monkeypatch.setattr(asyncssh, "connect", bad_key)
    with pytest.raises(HostKeyError, match=r"^bastion: host key of tester@10\.0\.0\.11:2222 not verified"):
        await ssh.connect(target_with_bastion(tmp_path, attempts=5))
    assert attempts == ["10.0.0.11"]


# --- the spec validator --------------------------------------------------------------------------


def test_the_spec_validator_accepts_ssh_config_and_checks_its_shape() -> None:
    loaded = load_document(yaml.safe_dump(environment(FULL)))
    assert any(
        n.startswith("spec.auth.sshConfig: read by `tetherctl bootstrap --inventory` only")
        for n in loaded.notes
    )
    assert any(n.startswith("spec.auth.sshConfig.knownHostsPolicy: accept-new trusts") for n in loaded.notes)
    off = load_document(yaml.safe_dump(environment({"knownHostsPolicy": "off"})))
    assert any("--insecure-ignore-host-key" in n for n in off.notes)
    bad = {"bastion": {"port": "x"}, "knownHostsPolicy": "yolo", "connectTimeout": "soon", "maxRetries": 1000}
    with pytest.raises(SpecError) as err:
        load_document(yaml.safe_dump(environment(bad)))
    text = "\n".join(err.value.problems) if isinstance(err.value.problems[0], str) else str(err.value)
    for path in ("bastion.host", "bastion.port", "knownHostsPolicy", "connectTimeout", "maxRetries"):
        assert f"spec.auth.sshConfig.{path}" in text


@pytest.mark.parametrize(
    "config",
    [
        {"bastion": {"host": "b:2222", "port": 22}},  # the bootstrap refuses it: so does env validate
        {"bastion": {"host": "b:2222", "PORT": 2222}, "useAgent": "yes"},
        {"keepaliveInterval": True, "connectTimeout": 45, "handshakeTimeout": "1h1s"},
        {"bastion": {"host": "b", "Host": "c"}, "maxRetries": 2.5},
        {"bastion": ["b"], "agentSocket": "a\nb", "knownHostsPolicy": "Strict"},
        {"bastion": {"host": "b", "port": 22, "username": "ec2-user"}, "useAgent": True},
    ],
)
def test_the_spec_validator_and_the_bootstrap_read_ssh_config_alike(config: dict[str, Any]) -> None:
    text = yaml.safe_dump(environment(config))
    _, refused, _ = sshconfig.parse(yaml.safe_load(text)["spec"]["auth"]["sshConfig"], "spec.auth.sshConfig")
    try:
        load_document(text)
        validator: list[str] = []
    except SpecError as err:
        validator = [str(p) for p in err.problems]
    assert validator == [f"{path}: {message}" for path, message in refused]


def test_a_bastion_port_that_contradicts_its_host_is_refused_by_env_validate() -> None:
    with pytest.raises(SpecError) as err:
        load_document(yaml.safe_dump(environment({"bastion": {"host": "b:2222", "port": 22}})))
    assert [str(p) for p in err.value.problems] == [
        "spec.auth.sshConfig.bastion.port: host says port 2222, port says 22"
    ]


def test_unknown_ssh_config_fields_follow_the_api_version_and_keep_their_paths() -> None:
    config = {"bastion": {"host": "b", "colour": "blue"}, "a.b": 1}
    loaded = load_document(yaml.safe_dump(environment(config)))
    assert "spec.auth.sshConfig.bastion.colour: ignored: not a holodeck field tether knows" in loaded.notes
    assert 'spec.auth.sshConfig["a.b"]: ignored: not a holodeck field tether knows' in loaded.notes
    tethers = environment(config)
    tethers["apiVersion"] = "tether.dev/v1alpha1"
    with pytest.raises(SpecError) as err:
        load_document(yaml.safe_dump(tethers))
    found = [str(p) for p in err.value.problems]
    assert "spec.auth.sshConfig.bastion.colour: unknown field" in found
    assert 'spec.auth.sshConfig["a.b"]: unknown field' in found
