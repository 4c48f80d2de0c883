"""Check the agent's GPU inventory against nvidia-smi on a real GPU host.

Needs only the Python standard library and this checkout (tether.nodeagent.facts is stdlib-only),
so it runs on a bare GPU machine: `python3 scripts/gpu-inventory-check.py`. Prints one JSON
object and exits non-zero when the agent's view disagrees with the driver's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "proto"))  # the tether package

from tether.nodeagent import facts


def main() -> int:
    problems: list[str] = []
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False).stdout if smi else ""
    listed_gpus = [line for line in listed.splitlines() if line.startswith("GPU ")]
    host = facts.collect_facts()
    health = facts.collect_health(Path("/"))
    pci = facts.nvidia_pci_devices()
    if not pci:
        problems.append("no NVIDIA display/3D controller found on the PCI bus")
    if not host.nvidia_gpu:
        problems.append("facts.nvidia_gpu is false")
    if len(host.gpus) != len(listed_gpus):
        problems.append(f"agent sees {len(host.gpus)} GPUs, nvidia-smi -L lists {len(listed_gpus)}")
    for g in host.gpus:
        if g.uuid not in listed:
            problems.append(f"GPU {g.index} uuid {g.uuid} not in nvidia-smi -L")
        if g.memory_total_mib <= 0 or not g.driver_version or not g.pci_bus_id:
            problems.append(f"GPU {g.index} has incomplete data: {g}")
    if [dataclasses.asdict(g) for g in health.gpus] != [dataclasses.asdict(g) for g in host.gpus]:
        problems.append("health report GPUs differ from host facts GPUs")
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "nvidia_smi_L": listed_gpus,
                "pci_nvidia_devices": pci,
                "facts": {
                    "nvidia_gpu": host.nvidia_gpu,
                    "os": host.os_pretty,
                    "arch": host.arch,
                    "kernel": host.kernel,
                    "gpus": [dataclasses.asdict(g) for g in host.gpus],
                },
                "health": {
                    "gpus": len(health.gpus),
                    "memory_total_bytes": health.memory_total_bytes,
                    "load1": health.load1,
                },
                "problems": problems,
                "ok": not problems,
            },
            indent=2,
        )
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
