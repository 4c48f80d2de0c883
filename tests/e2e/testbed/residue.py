"""What a testbed left on the machine: used by tests to prove ``down`` removes everything.

Works from a copy of ``state.json`` taken while the testbed was up (``down`` deletes the original).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.e2e.testbed import network
from tests.e2e.testbed.procs import Proc

PROPAGATE = Path("/run/systemd/nspawn/propagate")


def residue(record: dict[str, Any], state_dir: Path) -> list[str]:
    """Everything of the recorded testbed that still exists (empty when ``down`` was complete)."""
    left: list[str] = []
    links = json.loads(
        subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    )
    names = {link["ifname"] for link in links}
    slot = record.get("slot")
    reused = slot is not None and _slot_owner(slot) not in (
        None,
        str(state_dir),
    )  # another testbed has it now
    if record.get("bridge") in names and not reused:
        left.append(f"bridge {record['bridge']}")
    mounts = Path("/proc/self/mounts").read_text()
    for node in record.get("nodes", {}).values():
        veth = network.host_veth(node["machine"])
        if veth in names:
            left.append(f"link {veth}")
        for cg in node.get("cgroups", []):
            if Path(cg).exists():
                left.append(f"cgroup {cg}")
        if f" {node['dir']}/" in mounts:
            left.append(f"mount under {node['dir']}")
        if (PROPAGATE / node["machine"]).exists():
            left.append(f"{PROPAGATE / node['machine']}")
        if node.get("keeper") and Proc.from_json(node["keeper"]).alive():
            left.append(f"keeper pid {node['keeper']['pid']}")
    for name, proc in record.get("procs", {}).items():
        if Proc.from_json(proc).alive():
            left.append(f"{name} server pid {proc['pid']}")
    for pid, cmdline in _processes():
        machines = [n["machine"] for n in record.get("nodes", {}).values()]
        if str(state_dir) in cmdline or any(f"-M{m}" in cmdline for m in machines):
            left.append(f"process {pid}: {cmdline[:120]}")
    if slot is not None and not reused:
        if _slot_owner(slot) == str(state_dir):
            left.append(f"slot record {network.registry() / f'{slot}.json'}")
        sub = str(network.subnet(slot))
        routes = subprocess.run(["ip", "-4", "route", "show", sub], capture_output=True, text=True).stdout
        if routes.strip():
            left.append(f"route {routes.strip()}")
    return left


def _slot_owner(slot: int) -> str | None:
    try:
        return str(json.loads((network.registry() / f"{slot}.json").read_text())["state_dir"])
    except (OSError, ValueError, KeyError):
        return None


def _processes() -> list[tuple[int, str]]:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        if cmdline:
            out.append((int(proc.name), cmdline))
    return out
