"""Issue 11 (journal fix): going back to an earlier spec runs the step again on the node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import apply_env, ca_hash, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for


def driver_step(marker: Path, version: str) -> str:
    return f"""\
    - name: driver
      inline: |
        echo {version} > {marker}
        echo {version} >> {marker}.runs
"""


def test_spec_a_then_b_then_a_again_runs_the_step_again(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    marker = tmp_path / "driver.installed"
    runs = tmp_path / "driver.installed.runs"
    apply_env(controller, tmp_path, "gpu", driver_step(marker, "550"))
    agents("node-1").start(token(controller, "gpu"), ca_hash(controller))
    wait_state(controller, ["node-1"], "provisioned")
    for version, expected in (("560", "550 560"), ("550", "550 560 550")):
        apply_env(controller, tmp_path, "gpu", driver_step(marker, version))
        wait_for(lambda: runs.read_text().split() == expected.split(), what=f"runs {expected}")  # noqa: B023
        wait_state(controller, ["node-1"], "provisioned")
    assert marker.read_text() == "550\n"
