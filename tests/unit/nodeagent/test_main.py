"""The agent's command line: status only looks, facts print JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tether.nodeagent.main import main


def test_status_of_a_missing_state_dir_is_an_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    assert main(["status", "--state-dir", str(missing)]) == 1
    assert not missing.exists()
    assert "no agent state" in capsys.readouterr().err


def test_facts_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["arch"] in ("amd64", "arm64") and "nvidia_gpu" in doc
