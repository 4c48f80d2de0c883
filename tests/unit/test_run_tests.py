"""scripts/run_tests.py (make test): both groups run, and either failing fails the run —
pytest's exit code 5 ("no tests collected") included."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_tests"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def groups(tmp_path: Path) -> dict[str, Path]:
    passing, empty = tmp_path / "passing", tmp_path / "empty"
    passing.mkdir()
    empty.mkdir()
    (passing / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (empty / "notes.txt").write_text("no tests here\n")
    return {"passing": passing, "empty": empty}


def test_both_groups_passing_pass(
    groups: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    rt = runner()
    monkeypatch.setattr(rt, "GROUPS", {"a": [str(groups["passing"])], "b": [str(groups["passing"])]})
    assert rt.main(["-p", "no:cacheprovider"]) == 0
    out = capfd.readouterr().out
    assert "[a] " in out and "[b] " in out
    assert "a: passed in" in out and "b: passed in" in out


def test_a_group_that_collects_nothing_fails_the_run(
    groups: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    rt = runner()
    monkeypatch.setattr(rt, "GROUPS", {"a": [str(groups["passing"])], "b": [str(groups["empty"])]})
    assert rt.main(["-p", "no:cacheprovider", "--serial"]) == 1
    out = capfd.readouterr().out
    assert "a: passed in" in out and "b: FAILED (pytest exit code 5)" in out
