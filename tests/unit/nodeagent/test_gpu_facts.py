"""The GPU view the gate and the drift watch read: PCI names, ECC counts, Xid lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tether.nodeagent import facts

PCI_IDS = """\
# pci.ids excerpt (TEST FIXTURE)
10de  NVIDIA Corporation
\t2330  GH100 [H100 SXM5 80GB]
# a comment inside the vendor's block
\t2335  GH100 [H200 SXM 141GB]
\t\t10de 18be  H200 SXM (subsystem line: not a device)

10df  Emulex Corporation
\t1ae5  LP6000 Fibre Channel Host Adapter
"""


def pci_device(root: Path, address: str, vendor: str, klass: str, device: str) -> None:
    d = root / "bus" / "pci" / "devices" / address
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(klass + "\n")
    (d / "device").write_text(device + "\n")


def test_device_names_survive_comments_inside_the_vendor_block(tmp_path: Path) -> None:
    ids = tmp_path / "pci.ids"
    ids.write_text(PCI_IDS)
    assert facts.nvidia_device_names(ids) == {
        "0x2330": "GH100 [H100 SXM5 80GB]",
        "0x2335": "GH100 [H200 SXM 141GB]",
    }
    assert facts.nvidia_device_names(tmp_path / "absent") == {}


def test_pci_gpus_are_named_from_pci_ids(tmp_path: Path) -> None:
    ids = tmp_path / "pci.ids"
    ids.write_text(PCI_IDS)
    pci_device(tmp_path, "0000:3b:00.0", "0x10de", "0x030200", "0x2335")
    pci_device(tmp_path, "0000:5c:00.0", "0x10de", "0x030200", "0x2999")  # unknown id: no name
    pci_device(tmp_path, "0000:00:1f.6", "0x8086", "0x020000", "0x15bb")  # a NIC
    assert facts.pci_gpus(tmp_path, ids) == [
        facts.PciGpu("0000:3b:00.0", "0x2335", "GH100 [H200 SXM 141GB]"),
        facts.PciGpu("0000:5c:00.0", "0x2999", ""),
    ]


def test_the_ecc_column_is_read_and_not_supported_counts_zero() -> None:
    text = (
        "0, NVIDIA H200, GPU-a, 570.124.06, 143771, 00000000:3B:00.0, 2\n"
        "1, NVIDIA H200, GPU-b, 570.124.06, 143771, 00000000:5C:00.0, [N/A]\n"
    )
    gpus = facts.parse_nvidia_smi(text)
    assert [g.ecc_uncorrected for g in gpus] == [2, 0]


def test_xids_are_counted_per_gpu_in_either_address_form() -> None:
    text = (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit error\n"
        "NVRM: GPU at PCI:0000:5c:00: GPU-b\n"
    )
    assert facts.parse_xids(text) == {"0000:3b:00": 2}
    assert facts._bus_key("00000000:3B:00.0") == "0000:3b:00"


def test_the_xid_log_reads_only_what_came_after_its_cursor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls"
    journalctl = tmp_path / "journalctl"
    journalctl.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        '  *--after-cursor*) echo "NVRM: Xid (PCI:0000:3b:00): 79, pid=1"; echo "-- cursor: c2" ;;\n'
        '  *) echo "NVRM: Xid (PCI:0000:3b:00): 13, pid=1"; echo "-- cursor: c1" ;;\n'
        "esac\n"
    )
    journalctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    log = facts.XidLog()
    assert log.read() == {"0000:3b:00": 1}
    assert log.read() == {"0000:3b:00": 2}
    lines = calls.read_text().splitlines()
    assert "--after-cursor" not in lines[0] and lines[1].endswith("--after-cursor c1")
