"""The testbed's private network: a collision-free slot (bridge name + /24), the bridge, node links.

Slot N owns bridge ``tbbrN`` and subnet 10.200.N.0/24 (bridge 10.200.N.1, nodes from .11). Slots are
taken under a machine-wide lock and recorded in ``REGISTRY/N.json`` (which names the state dir), so two
testbeds on one machine never share a bridge or subnet; a slot whose record's state dir and bridge are
both gone is stale and reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import subprocess
from pathlib import Path

REGISTRY_ENV = "TETHER_TESTBED_REGISTRY"
DEFAULT_REGISTRY = Path("/var/lib/tether-testbed/slots")
SUBNET_PREFIX = "10.200"
FIRST_NODE_HOST = 11
SLOTS = range(1, 255)


def registry() -> Path:
    return Path(os.environ.get(REGISTRY_ENV, str(DEFAULT_REGISTRY)))


def bridge_name(slot: int) -> str:
    return f"tbbr{slot}"


def subnet(slot: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{slot}.0/24")


def bridge_ip(slot: int) -> str:
    return f"{SUBNET_PREFIX}.{slot}.1"


def node_ip(slot: int, index: int) -> str:
    """Address of node ``index`` (1-based)."""
    return f"{SUBNET_PREFIX}.{slot}.{FIRST_NODE_HOST + index - 1}"


def allocate(state_dir: Path) -> int:
    """Reserve a free slot for ``state_dir`` and create its bridge, all under the registry lock."""
    reg = registry()
    reg.mkdir(parents=True, exist_ok=True)
    with open(reg / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        links = _links()
        used = _used_networks()
        for slot in SLOTS:
            record = reg / f"{slot}.json"
            if record.exists() and not _stale(record, slot, links):
                continue
            if bridge_name(slot) in links or any(subnet(slot).overlaps(n) for n in used):
                continue
            if any(link.startswith(host_veth(f"tb{slot}n")) for link in links):  # a node left from an old run
                continue
            record.write_text(json.dumps({"state_dir": str(state_dir.resolve()), "pid": os.getpid()}))
            create_bridge(slot)
            return slot
    raise RuntimeError("no free testbed slot (10.200.1-254.0/24 all taken)")


def release(slot: int, state_dir: Path) -> None:
    """Drop the registry record of ``slot`` if it is ours."""
    record = registry() / f"{slot}.json"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(record.read_text())["state_dir"] == str(state_dir.resolve()):
            record.unlink()


def _stale(record: Path, slot: int, links: set[str]) -> bool:
    try:
        state_dir = Path(json.loads(record.read_text())["state_dir"])
    except (OSError, ValueError, KeyError):
        return True
    return not (state_dir / "state.json").exists() and bridge_name(slot) not in links


def create_bridge(slot: int) -> None:
    name = bridge_name(slot)
    _ip("link", "add", name, "type", "bridge")
    # Bridged node-to-node traffic must not depend on the host's iptables FORWARD policy.
    _ip("link", "set", name, "type", "bridge", "nf_call_iptables", "0", check=False)
    _ip("addr", "add", f"{bridge_ip(slot)}/24", "dev", name)
    _ip("link", "set", name, "up")


def delete_link(name: str) -> None:
    _ip("link", "del", name, check=False)


def link_exists(name: str) -> bool:
    return name in _links()


def set_link(name: str, up: bool) -> None:
    _ip("link", "set", name, "up" if up else "down")


def host_veth(machine: str) -> str:
    """The host-side end nspawn's ``--network-bridge`` creates for ``machine`` (``vb-`` + name)."""
    return f"vb-{machine}"[:15]


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now (the server then binds it; nothing else is racing on our IP)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {link["ifname"] for link in json.loads(out)}


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    nets = []
    for link in json.loads(out):
        for addr in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return nets


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)
