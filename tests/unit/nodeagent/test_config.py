"""Agent configuration: file < environment < flags, every problem at once, secrets kept private."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tether.nodeagent.config import load
from tether.nodeagent.errors import ConfigError

HASH = "sha256:" + "a" * 64


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_flags_override_the_file_and_the_token_is_masked(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"controller: 10.0.0.1:7443\nca_hash: {HASH}\nnode_name: from-file\n"
        "token: abcdef.0123456789abcdefghijklmnopqrstuv\n",
    )
    cfg = load(path, {"node_name": "from-flag", "controller": None}, {})
    assert cfg.controller == "10.0.0.1:7443" and cfg.node_name == "from-flag"
    assert cfg.token.reveal().startswith("abcdef.") and "0123456789" not in repr(cfg)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: nohost\nca_hash: md5:xyz\nheartbeat_seconds: -1\nbogus: 1\n")
    with pytest.raises(ConfigError) as exc:
        load(path, {}, {})
    text = str(exc.value)
    for fragment in ("unknown setting 'bogus'", "controller:", "ca_hash:", "heartbeat_seconds:"):
        assert fragment in text


def test_a_config_file_holding_a_token_must_be_private(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: h:1\ntoken: abcdef.0123456789abcdefghijklmnopqrstuv\n", mode=0o644)
    with pytest.raises(ConfigError) as exc:
        load(path, {}, {})
    assert "holds a join token" in str(exc.value) and "0123456789" not in str(exc.value)


def test_token_file_must_be_private_and_may_be_gone_after_enrollment(tmp_path: Path) -> None:
    token_file = tmp_path / "join-token"
    token_file.write_text("abcdef.0123456789abcdefghijklmnopqrstuv\n")
    os.chmod(token_file, 0o644)
    with pytest.raises(ConfigError):
        load(None, {"controller": "h:1", "token_file": str(token_file)}, {})
    os.chmod(token_file, 0o600)
    assert load(None, {"controller": "h:1", "token_file": str(token_file)}, {}).token
    token_file.unlink()
    assert not load(None, {"controller": "h:1", "token_file": str(token_file)}, {}).token


def test_environment_variable_token(tmp_path: Path) -> None:
    cfg = load(None, {"controller": "h:1"}, {"TETHER_JOIN_TOKEN": "abcdef.0123456789abcdefghijklmnopqrstuv"})
    assert cfg.token
