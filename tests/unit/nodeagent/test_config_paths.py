"""Issue 10, item 17: paths are made absolute where the configuration is loaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tether.nodeagent.config import load


def test_relative_flags_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    token = tmp_path / "tok"
    token.write_text("abcdef.0123456789abcdef0123456789abcdef\n")
    token.chmod(0o600)
    cfg = load(None, {"controller": "h:1", "state_dir": Path("agent"), "token_file": "tok"}, {})
    assert cfg.state_dir == tmp_path / "agent" and cfg.state_dir.is_absolute()
    assert cfg.token.reveal().startswith("abcdef.")


def test_relative_paths_in_a_config_file_are_relative_to_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "join-token").write_text("abcdef.0123456789abcdef0123456789abcdef\n")
    os.chmod(etc / "join-token", 0o600)
    config = etc / "agent.yaml"
    config.write_text("controller: h:1\nstate_dir: state\ntoken_file: join-token\n")
    monkeypatch.chdir(tmp_path)
    cfg = load(Path("etc/agent.yaml"), {}, {})
    assert cfg.state_dir == etc / "state"
    assert cfg.token.reveal().startswith("abcdef.")
