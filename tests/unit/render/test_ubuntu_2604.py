"""Ubuntu 26.04 as an OS preset (``--os ubuntu-26.04``).

What differs between Ubuntu releases in a plan is the CUDA repository directory (``ubuntu2604``);
Docker's repository follows the node's ``VERSION_CODENAME`` at run time, and every package tether
installs by name is the same on 22.04, 24.04 and 26.04. So: every scenario of the render matrix
renders for 26.04 exactly as for 22.04 (whose scripts all pass ``bash -n`` and shellcheck in
``test_shell``) but for those two spots, and the 26.04 scripts pass shellcheck themselves.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import system_tool
from tests.unit.render import scenarios
from tether.controller.cli.main import main
from tether.controller.render.targets import OS_PRESETS, facts_for


def test_the_preset() -> None:
    facts = facts_for("ubuntu-26.04")
    assert (facts.os_id, facts.os_version_id, facts.os_family) == ("ubuntu", "26.04", "debian")
    assert facts.os_pretty == "Ubuntu 26.04 LTS" and facts.python_version == "3.14"
    assert facts.os_key == "ubuntu-26.04"
    assert list(OS_PRESETS).index("ubuntu-26.04") == list(OS_PRESETS).index("ubuntu-24.04") + 1


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_every_scenario_renders_as_on_22_04_but_for_the_release(name: str) -> None:
    for role in ("control-plane", "worker"):
        old = scenarios.plan_for(name, "ubuntu-22.04", role=role)
        new = scenarios.plan_for(name, "ubuntu-26.04", role=role)
        assert [s.name for s in new.steps] == [s.name for s in old.steps]
        for a, b in zip(old.steps, new.steps, strict=True):
            assert b.script == a.script.replace("ubuntu2204", "ubuntu2604"), (name, a.name)
            assert b.env == a.env
            requested = {**a.requested, **({"os": "ubuntu-26.04"} if "os" in a.requested else {})}
            assert b.requested == requested


def test_the_driver_comes_from_the_26_04_cuda_repository() -> None:
    step = scenarios.plan_for("driver-package-branch", "ubuntu-26.04").step("nvidia-driver")
    assert "/compute/cuda/repos/ubuntu2604/x86_64/" in step.script
    assert "ubuntu2204" not in step.script and "ubuntu2404" not in step.script


def test_the_26_04_scripts_pass_shellcheck(tmp_path: Path) -> None:
    """The scripts that differ from 22.04's (the rest are byte for byte the ones test_shell checks)."""
    paths: dict[str, Path] = {}
    for name in scenarios.SCENARIOS:
        for step in scenarios.plan_for(name, "ubuntu-26.04").steps:
            if "ubuntu2604" in step.script:
                path = tmp_path / f"{hashlib.sha256(step.script.encode()).hexdigest()[:12]}.sh"
                path.write_text(step.script)
                paths[path.name] = path
    assert paths
    exe = system_tool("shellcheck")
    out = subprocess.run(
        [exe, "--severity=warning", "--format=gcc", "--shell=bash", *map(str, paths.values())],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[:5000]


def test_the_cli_renders_for_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "env.yaml"
    doc.write_text(scenarios.document("driver-package-branch"))
    assert (
        main(["env", "render", "-f", str(doc), "--os", "ubuntu-26.04", "--out", str(tmp_path / "out")]) == 0
    )
    driver = next((tmp_path / "out").glob("*-nvidia-driver.sh")).read_text()
    assert "repos/ubuntu2604/" in driver
    help_text = subprocess.run(
        [str(Path(sys.executable).parent / "tetherctl"), "env", "render", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ubuntu-26.04" in help_text
