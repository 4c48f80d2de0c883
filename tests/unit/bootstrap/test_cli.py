"""tetherctl bootstrap's edges: secrets only from the environment or a prompt, masked everywhere."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import asyncssh
import pytest

from tether.controller.cli import bootstrap_run
from tether.controller.cli.client import CliError
from tether.controller.cli.main import _parser
from tether.nodeagent.secrets import PROCESS_REDACTOR


def key_file(tmp_path: Path, passphrase: str) -> Path:
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "id"
    data = key.export_private_key("pkcs8-pem", passphrase) if passphrase else key.export_private_key()
    path.write_bytes(data)
    return path


def test_an_encrypted_key_needs_a_passphrase_from_env_or_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = key_file(tmp_path, "prompted-canary-passphrase")
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal
    with pytest.raises(CliError, match="is encrypted: no terminal to ask on"):
        bootstrap_run._Secrets().key(str(path), "")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(bootstrap_run.getpass, "getpass", lambda prompt: "prompted-canary-passphrase")
    secrets = bootstrap_run._Secrets()
    key, passphrase = secrets.key(str(path), "")
    assert passphrase.reveal() == "prompted-canary-passphrase"
    assert "prompted-canary-passphrase" not in repr(passphrase)
    assert PROCESS_REDACTOR.redact("x prompted-canary-passphrase y") == "x [REDACTED] y"
    assert secrets.redactor.redact(key.reveal()) == "[REDACTED]"
    monkeypatch.setenv("PP_VAR", "from-env-canary-passphrase")
    assert bootstrap_run._Secrets().key(str(path), "PP_VAR")[1].reveal() == "from-env-canary-passphrase"
    with pytest.raises(CliError, match="NOPE_VAR is not set"):
        bootstrap_run._Secrets().key(str(path), "NOPE_VAR")


def test_a_plain_key_is_read_without_asking(tmp_path: Path) -> None:
    key, passphrase = bootstrap_run._Secrets().key(str(key_file(tmp_path, "")), "")
    assert key and not passphrase


def test_addresses() -> None:
    assert bootstrap_run._is_loopback("127.0.0.1:7443")
    assert bootstrap_run._is_loopback("localhost:1")
    assert bootstrap_run._is_loopback("[::1]:7443")
    assert not bootstrap_run._is_loopback("10.0.0.1:7443")
    assert bootstrap_run._host_port("10.0.0.1") == ("10.0.0.1", 0)
    assert bootstrap_run._host_port("10.0.0.1:8080") == ("10.0.0.1", 8080)
    assert bootstrap_run._host_port("[fd00::1]:80") == ("fd00::1", 80)


def test_the_command_line_contract_parses() -> None:
    args = _parser().parse_args(
        [
            "--config",
            "admin.conf",
            "bootstrap",
            "--env",
            "lab",
            "--role",
            "worker",
            "--ssh",
            "root@10.0.0.5:2222",
            "--identity",
            "k",
            "--host-key",
            "ssh-ed25519 AAAA",
            "--node-name",
            "gpu-1",
            "--jump",
            "ops@bastion",
            "--force",
            "--concurrency",
            "4",
            "--controller",
            "10.0.0.1:7443",
            "--password-env",
            "PW",
        ]
    )
    assert isinstance(args, argparse.Namespace)
    assert (args.ssh, args.environment, args.role, args.node_name, args.force, args.concurrency) == (
        "root@10.0.0.5:2222",
        "lab",
        "worker",
        "gpu-1",
        True,
        4,
    )
    with pytest.raises(SystemExit):
        _parser().parse_args(["bootstrap", "--env", "lab", "--ssh", "h", "--ssm", "i-1"])
    with pytest.raises(SystemExit):
        _parser().parse_args(
            ["bootstrap", "--env", "lab", "--password", "in-argv"]
        )  # no such flag, by design
