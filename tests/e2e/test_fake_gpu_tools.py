"""The fake GPU tools (TEST FIXTURES, tests/e2e/fixtures/fake_gpu) against the agent's parsers.

Not e2e: they run on the host with the fixture's state in a temporary directory, so a change on
either side (the fake's output or what the agent reads) fails here, not as a timeout on a node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.fixtures import fake_gpu
from tether.nodeagent.facts import _bus_key, parse_nvidia_smi, parse_xids

AGENT_FIELDS = "index,name,uuid,driver_version,memory.total,pci.bus_id,ecc.errors.uncorrected.volatile.total"


def run(tool: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_FAKE_GPU_DIR": str(state), "TETHER_FAKE_GPU_LOG": str(state / "log")}
    return subprocess.run(
        [sys.executable, str(fake_gpu.HERE / tool), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def write(state: Path, gpus: list[fake_gpu.FakeGpu]) -> None:
    (state / "gpus.csv").write_text("".join(g.line() + "\n" for g in gpus))


def test_nvidia_smi_answers_the_agents_query_in_the_order_asked(tmp_path: Path) -> None:
    gpus = fake_gpu.gpus(2, driver="570.124.06", node="n1")
    gpus[1] = fake_gpu.FakeGpu(**{**gpus[1].__dict__, "ecc_uncorrected": 3})
    write(tmp_path, gpus)
    out = run("nvidia-smi", tmp_path, f"--query-gpu={AGENT_FIELDS}", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stderr
    seen = parse_nvidia_smi(out.stdout)
    assert [(g.index, g.name, g.uuid, g.driver_version, g.memory_total_mib, g.pci_bus_id) for g in seen] == [
        (g.index, g.name, g.uuid, g.driver_version, g.memory_total_mib, g.pci_bus_id) for g in gpus
    ]
    assert [g.ecc_uncorrected for g in seen] == [0, 3]
    out = run("nvidia-smi", tmp_path, "--query-gpu=memory.total,name", "--format=csv")
    assert out.stdout.splitlines() == ["memory.total [MiB], name"] + ["143771 MiB, NVIDIA H200"] * 2
    out = run("nvidia-smi", tmp_path, "--query-gpu=bogus", "--format=csv")
    assert out.returncode != 0 and 'Field "bogus" is not a valid field to query.' in out.stderr


def test_nvidia_smi_without_gpus_fails_like_without_a_driver(tmp_path: Path) -> None:
    out = run("nvidia-smi", tmp_path, f"--query-gpu={AGENT_FIELDS}", "--format=csv,noheader,nounits")
    assert out.returncode != 0
    assert "couldn't communicate with the NVIDIA driver" in out.stdout
    assert parse_nvidia_smi(out.stdout) == []


def test_an_injected_xid_line_counts_for_its_gpu() -> None:
    gpus = fake_gpu.gpus(2, driver="570.124.06")
    line = fake_gpu.xid_line(gpus[1])
    assert line.startswith("NVRM: Xid (PCI:0000:86:00): 79, ")
    assert parse_xids(line) == {_bus_key(gpus[1].pci_bus_id): 1}


def test_dcgmi_diag_passes_or_fails_as_told(tmp_path: Path) -> None:
    out = run("dcgmi", tmp_path, "diag", "-r", "1")
    assert out.returncode != 0 and "Unable to connect to host engine" in out.stdout  # no GPUs
    write(tmp_path, fake_gpu.gpus(2, driver="570.124.06"))
    out = run("dcgmi", tmp_path, "diag", "-r", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| Driver Version Detected   | 570.124.06" in out.stdout and "Fail" not in out.stdout
    (tmp_path / "diag").write_text("fail\n")
    out = run("dcgmi", tmp_path, "diag", "-r", "2")
    assert out.returncode == 1
    assert "| GPU Memory                | Fail - GPU: 1" in out.stdout
    log = (tmp_path / "log" / "dcgmi.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in log] == [
        "diag -r 1 -> no host engine",
        "diag -r 1 -> pass",
        "diag -r 2 -> fail",
    ]
    assert run("dcgmi", tmp_path, "discovery", "-l").returncode != 0
