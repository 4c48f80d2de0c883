"""GPU drift as health on loopback: a real controller, a real agent, a fake ``nvidia-smi``.

The fake (``tests/e2e/fixtures/fake_gpu/nvidia-smi``, a test fixture) is first on the agent's PATH
and lists the GPUs of a file this test rewrites; the agent reports them with every heartbeat.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ca_hash, events, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for

FAKE_NVIDIA_SMI = Path(__file__).parents[1] / "e2e" / "fixtures" / "fake_gpu" / "nvidia-smi"
BUS_IDS = ("00000000:3B:00.0", "00000000:86:00.0")
DRIVER = "570.124.06"

DOC = """\
apiVersion: holodeck.nvidia.com/v1alpha1
kind: Environment
metadata:
  name: gpus
spec:
  hardware:
    gpus: {count: 2, driverVersion: "570."}
  customTemplates:
    - name: hello
      phase: pre-install
      inline: echo hello
"""


def write_gpus(state: Path, *, count: int = 2, ecc: tuple[int, ...] = ()) -> None:
    """The fake's GPUs: index,name,uuid,driver_version,memory.total,pci.bus_id,ecc_uncorrected."""
    lines = [
        f"{i},NVIDIA H200,GPU-0000-{i:04d},{DRIVER},143771,{BUS_IDS[i]},{ecc[i] if i < len(ecc) else 0}"
        for i in range(count)
    ]
    tmp = state / "gpus.csv.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(state / "gpus.csv")  # never half a file for a heartbeat to read


def describe(controller: Controller, node: str) -> dict[str, Any]:
    return json.loads(controller.ctl("node", "describe", node, "-o", "json").stdout)  # type: ignore[no-any-return]


def conditions(controller: Controller, node: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in describe(controller, node).get("conditions", [])}


def notices(controller: Controller, node: str) -> list[str]:
    return [str(e.get("message", "")) for e in events(controller, node) if e["kind"] == "info"]


def test_a_gpu_disappearing_after_provisioning_raises_gpus_missing_and_clears(
    controller: Controller,
    agents: Callable[[str], Agent],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = tmp_path / "fake-gpu"
    state.mkdir()
    write_gpus(state)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FAKE_NVIDIA_SMI)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # the agent inherits it
    monkeypatch.setenv("TETHER_FAKE_GPU_DIR", str(state))
    doc = tmp_path / "gpus.yaml"
    doc.write_text(DOC)
    controller.ctl("env", "apply", "-f", str(doc))
    agents("g1").start(token(controller, "gpus"), ca_hash(controller))
    wait_state(controller, ["g1"], "provisioned")
    assert conditions(controller, "g1") == {}

    write_gpus(state, count=1)  # GPU 1 gone from nvidia-smi (and this machine's PCI bus has none)
    held = wait_for(lambda: conditions(controller, "g1").get("GPUsMissing"), 30, what="GPUsMissing")
    assert held["reason"] == "NotDetected"
    assert held["message"] == "expected 2 GPUs, nvidia-smi lists 1 (missing 0000:86:00.0)"
    text = controller.ctl("node", "describe", "g1").stdout
    assert "Conditions:" in text and "GPUsMissing (NotDetected)" in text
    wait_for(
        lambda: any(m.startswith("GPU drift: GPUsMissing (NotDetected)") for m in notices(controller, "g1")),
        30,
        what="the GPUsMissing event",
    )
    assert describe(controller, "g1")["state"] == "provisioned"  # a condition, not a state

    write_gpus(state, ecc=(0, 2))  # back on the bus, with uncorrected ECC errors
    wait_for(lambda: list(conditions(controller, "g1")) == ["GPUErrors"], 30, what="GPUErrors only")
    errors = conditions(controller, "g1")["GPUErrors"]
    assert errors["reason"] == "UncorrectedECC"
    assert errors["message"] == "uncorrected ECC errors on GPU 1 (0000:86:00.0): 2"
    write_gpus(state, ecc=(0, 5))  # more errors on the same GPU: the same condition, not a change
    time.sleep(3)  # a few heartbeats (one a second)
    assert conditions(controller, "g1")["GPUErrors"] == errors  # as raised: no write, no event

    write_gpus(state)
    wait_for(lambda: conditions(controller, "g1") == {}, 30, what="the conditions to clear")
    said = wait_for(
        lambda: (
            [m for m in notices(controller, "g1") if m.startswith("GPU drift:")]
            if any("GPUErrors cleared" in m for m in notices(controller, "g1"))
            else None
        ),
        30,
        what="the cleared events",
    )
    # A condition is raised once two reports in a row show it, and clears with the first that
    # does not: GPUsMissing cleared one report before GPUErrors was raised.
    assert said == [
        "GPU drift: GPUsMissing (NotDetected): expected 2 GPUs, nvidia-smi lists 1 (missing 0000:86:00.0)",
        "GPU drift: GPUsMissing cleared",
        "GPU drift: GPUErrors (UncorrectedECC): uncorrected ECC errors on GPU 1 (0000:86:00.0): 2",
        "GPU drift: GPUErrors cleared",
    ]
