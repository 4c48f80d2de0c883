"""The hardware gate on loopback (this machine has no NVIDIA GPU): an environment expecting 8 GPUs
quarantines its node before any step, `node describe` says why, `node release` lets it go on once;
failed GPU diagnostics quarantine too, and a release runs them again unchecked."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import ca_hash, events, nodes, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for

STEP = """\
  customTemplates:
    - name: marker
      phase: pre-install
      inline: echo "the first step ran"
"""
FAKE_NVIDIA_SMI = """\
#!/bin/sh
# TEST FIXTURE: two H200 GPUs with a 570 driver, as nvidia-smi --query-gpu prints them.
echo "0, NVIDIA H200, GPU-aaaa, 570.124.06, 143771, 00000000:3B:00.0, 0"
echo "1, NVIDIA H200, GPU-bbbb, 570.124.06, 143771, 00000000:5C:00.0, 0"
"""


def apply(controller: Controller, tmp_path: Path, name: str, hardware: str) -> None:
    doc = tmp_path / f"{name}.yaml"
    doc.write_text(
        f"apiVersion: tether.dev/v1alpha1\nkind: Environment\nmetadata:\n  name: {name}\nspec:\n"
        f"{STEP}  hardware:\n{hardware}"
    )
    controller.ctl("env", "apply", "-f", str(doc))


def describe(controller: Controller, name: str) -> str:
    return controller.ctl("node", "describe", name).stdout


def node_json(controller: Controller, name: str) -> dict[str, object]:
    return json.loads(controller.ctl("node", "describe", name, "-o", "json").stdout)  # type: ignore[no-any-return]


def started(controller: Controller, name: str, step: str) -> bool:
    return any(e["step"] == step and e["kind"] == "started" for e in events(controller, name))


def info(controller: Controller, name: str) -> list[str]:
    return [str(e["message"]) for e in events(controller, name) if e["kind"] == "info"]


def test_expecting_8_gpus_quarantines_before_any_step_and_release_lets_it_go_on(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply(controller, tmp_path, "h200", "    gpus: {count: 8, product: H200}\n")
    agents("gpu-1").start(token(controller, "h200"), ca_hash(controller))
    wait_state(controller, ["gpu-1"], "quarantined")

    text = describe(controller, "gpu-1")
    assert "Quarantined:  before-steps" in text, text
    assert "gpus.count: expected 8, found 0 on the PCI bus" in text, text
    assert "tetherctl node release gpu-1" in text
    listed = nodes(controller)["gpu-1"]
    assert listed["state"] == "quarantined"
    detail = node_json(controller, "gpu-1")
    assert detail["quarantine"]["expected"] == {"gpus.count": "8"}  # type: ignore[index]
    wait_for(lambda: any("quarantined before any step" in m for m in info(controller, "gpu-1")), 15)
    assert not started(controller, "gpu-1", "custom-marker")  # no step ran
    assert not started(controller, "gpu-1", "hardware-check")
    waited = controller.ctl("wait", "--env", "h200", "--for", "provisioned", "--timeout", "10s", check=False)
    assert waited.returncode == 1, waited
    assert (
        "node gpu-1: quarantined (gpus.count: expected 8, found 0 on the PCI bus)"
        in waited.stderr + waited.stdout
    )

    controller.ctl("node", "release", "gpu-1")
    wait_for(
        lambda: started(controller, "gpu-1", "custom-marker"), 30, what="the first step after the release"
    )
    # The check before the end (there is no cluster join) is a check of its own: quarantined again.
    wait_state(controller, ["gpu-1"], "quarantined")
    assert "Quarantined:  before-join" in describe(controller, "gpu-1")
    admin = controller.ctl("audit", "-o", "json").stdout
    assert "ReleaseNode" in admin
    released = [m for m in info(controller, "gpu-1") if m.startswith("released by ")]
    assert released and "despite: gpus.count: expected 8, found 0" in released[0]

    controller.ctl("node", "release", "gpu-1")
    wait_state(controller, ["gpu-1"], "provisioned")
    again = controller.ctl("node", "release", "gpu-1", check=False)
    assert again.returncode != 0 and "is not quarantined" in again.stderr


def test_matching_gpus_pass_and_missing_dcgm_fails_the_diagnostics_into_quarantine(
    controller: Controller,
    agents: Callable[[str], Agent],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")  # the agent's facts see it
    apply(
        controller,
        tmp_path,
        "diag",
        "    gpus: {count: 2, product: H200, memoryMiB: 140000, driverVersion: '570.', diagnostics: short}\n",
    )
    agents("gpu-2").start(token(controller, "diag"), ca_hash(controller))
    wait_state(controller, ["gpu-2"], "quarantined")
    steps = {s["name"]: s["state"] for s in node_json(controller, "gpu-2")["steps"]}  # type: ignore[union-attr,index]
    assert steps["hardware-check"] == "succeeded" and steps["custom-marker"] == "succeeded"
    assert steps["hardware-verify"] == "succeeded" and steps["gpu-diagnostics"] == "failed"
    text = describe(controller, "gpu-2")
    assert "Quarantined:  diagnostics" in text and "dcgmi is not installed" in text, text

    controller.ctl("node", "release", "gpu-2")
    wait_state(controller, ["gpu-2"], "provisioned")
    messages = info(controller, "gpu-2")
    assert any(m.startswith("released by ") and "gpu-diagnostics runs again" in m for m in messages)
    out = [
        line
        for e in events(controller, "gpu-2")
        if e["step"] == "gpu-diagnostics"
        for line in e.get("lines", [])  # type: ignore[attr-defined]
    ]
    assert any("not run: released by an operator" in line for line in out), out
