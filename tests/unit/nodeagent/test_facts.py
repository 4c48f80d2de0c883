"""Host facts: os-release parsing, GPU detection from sysfs and nvidia-smi, cluster view."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tether.nodeagent import facts
from tether.nodeagent.model import Gpu

# Real output of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` on an 8-GPU host (shape).
SMI = """\
0, NVIDIA H200, GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000000, 570.133.20, 143771, 00000000:19:00.0
1, NVIDIA H200, GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000001, 570.133.20, 143771, 00000000:3B:00.0
"""


def test_parse_nvidia_smi() -> None:
    gpus = facts.parse_nvidia_smi(SMI)
    assert gpus[0] == Gpu(
        index=0,
        name="NVIDIA H200",
        uuid="GPU-0f1e2d3c-aaaa-bbbb-cccc-000000000000",
        driver_version="570.133.20",
        memory_total_mib=143771,
        pci_bus_id="00000000:19:00.0",
    )
    assert [g.index for g in gpus] == [0, 1]


def test_parse_nvidia_smi_ignores_noise() -> None:
    assert facts.parse_nvidia_smi("No devices were found\n\n") == []
    assert facts.parse_nvidia_smi("0, A100, GPU-x, 550.1, [N/A], 0000:00:1e.0")[0].memory_total_mib == 0


def make_pci(root: Path, addr: str, vendor: str, klass: str) -> None:
    dev = root / "bus" / "pci" / "devices" / addr
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(klass + "\n")


def test_nvidia_gpus_are_found_on_the_pci_bus_without_a_driver(tmp_path: Path) -> None:
    make_pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # Intel VGA
    make_pci(tmp_path, "0000:19:00.0", "0x10de", "0x030200")  # NVIDIA 3D controller
    make_pci(tmp_path, "0000:19:00.1", "0x10de", "0x040300")  # NVIDIA audio function: not a GPU
    make_pci(tmp_path, "0000:3b:00.0", "0x10de", "0x030000")  # NVIDIA VGA
    assert facts.nvidia_pci_devices(tmp_path) == ["0000:19:00.0", "0000:3b:00.0"]
    assert facts.nvidia_pci_devices(tmp_path / "absent") == []


@pytest.mark.parametrize(
    ("release", "family"),
    [
        ({"ID": "ubuntu", "ID_LIKE": "debian"}, "debian"),
        ({"ID": "rocky", "ID_LIKE": "rhel centos fedora"}, "rhel"),
        ({"ID": "amzn", "ID_LIKE": "fedora"}, "amazon"),
        ({"ID": "pop", "ID_LIKE": "ubuntu debian"}, "debian"),
        ({"ID": "arch"}, "unknown"),
    ],
)
def test_os_family(release: dict[str, str], family: str) -> None:
    assert facts.os_family(release) == family


def test_os_release_parsing(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text('NAME="Rocky Linux"\nVERSION_ID="9.4"\nID=rocky\n# c\n\n')
    assert facts.read_os_release(tmp_path) == {"NAME": "Rocky Linux", "VERSION_ID": "9.4", "ID": "rocky"}


def test_cluster_view_from_kubectl_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "admin.conf"
    kubeconfig.write_text("x")
    doc = {
        "items": [
            {
                "metadata": {"name": "cp-1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "nodeInfo": {"kubeletVersion": "v1.31.0"},
                    "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                },
            },
            {
                "metadata": {"name": "w-1", "labels": {}},
                "status": {
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "nodeInfo": {"kubeletVersion": "v1.31.0"},
                    "addresses": [],
                },
            },
        ]
    }
    fake = tmp_path / "kubectl"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(doc)}\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    view = facts.cluster_view(str(kubeconfig))
    assert view is not None and view.api_server == "running"
    assert [(n.name, n.ready, n.internal_ip, n.roles) for n in view.nodes] == [
        ("cp-1", True, "10.0.0.2", ("control-plane",)),
        ("w-1", False, "", ()),
    ]
    fake.write_text("#!/bin/sh\necho 'connection refused' >&2; exit 1\n")
    assert facts.cluster_view(str(kubeconfig)).api_server == "unreachable"  # type: ignore[union-attr]
    assert facts.cluster_view(str(tmp_path / "missing.conf")) is None


def test_collect_facts_on_this_host() -> None:
    f = facts.collect_facts("127.0.0.1:1")
    assert f.arch in ("amd64", "arm64") and f.kernel and f.boot_id
    assert f.addresses[0] == "127.0.0.1"


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="no NVIDIA driver on this machine (runs on GPU hosts)"
)
def test_gpu_inventory_matches_nvidia_smi_on_a_gpu_host() -> None:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    f = facts.collect_facts()
    assert f.nvidia_gpu
    assert len(f.gpus) == len([line for line in listed.splitlines() if line.startswith("GPU ")])
    for g in f.gpus:
        assert g.uuid in listed and g.memory_total_mib > 0 and g.driver_version
