"""Every rendered script of the matrix parses (bash -n) and passes shellcheck at warning level."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.tools import system_tool
from tests.unit.render import scenarios


def _all_scripts(tmp: Path) -> list[Path]:
    seen: dict[str, Path] = {}
    for name, os_key in scenarios.cases():
        for gpu in (True, False):
            for role in ("control-plane", "worker"):
                for step in scenarios.plan_for(name, os_key, role=role, gpu=gpu).steps:
                    digest = hashlib.sha256(step.script.encode()).hexdigest()
                    if digest not in seen:
                        path = tmp / f"{name}--{os_key}--{step.name}--{digest[:8]}.sh"
                        path.write_text(step.script)
                        seen[digest] = path
    return list(seen.values())


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _all_scripts(tmp_path_factory.mktemp("scripts"))


def test_every_script_parses(scripts: list[Path]) -> None:
    assert len(scripts) > 100
    bad = {}
    for path in scripts:
        out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
        if out.returncode:
            bad[path.name] = out.stderr
    assert not bad


def _shellcheck() -> str:
    return system_tool("shellcheck")


def test_every_script_passes_shellcheck(scripts: list[Path]) -> None:
    exe = _shellcheck()
    out = subprocess.run(
        [exe, "--severity=warning", "--format=gcc", "--shell=bash", *map(str, scripts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[:5000]


def test_shellcheck_catches_a_bad_script(tmp_path: Path) -> None:
    """The check above can fail: a known-bad script is flagged."""
    exe = _shellcheck()
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nfor f in $(ls); do rm $f; done\nunused=1\n")
    out = subprocess.run([exe, "--severity=warning", str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode != 0
