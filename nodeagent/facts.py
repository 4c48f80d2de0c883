"""Host facts and health probes: read from /proc, /sys, /etc/os-release and a few tools.

Every probe is best effort: a missing file or tool gives an empty value, never an error.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from tether.nodeagent import __version__
from tether.nodeagent.model import ClusterNode, ClusterView, Gpu, Health, HostFacts, PciGpu, now_ms

NVIDIA_PCI_VENDOR = "0x10de"
# PCI class 0x03xxxx: display controllers (VGA 0x0300, 3D controller 0x0302).
DISPLAY_CLASS_PREFIX = "0x03"
PCI_IDS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"), Path("/usr/share/pci.ids"))
ARCH_ALIASES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
FAMILIES = {
    "debian": "debian",
    "ubuntu": "debian",
    "rhel": "rhel",
    "rocky": "rhel",
    "centos": "rhel",
    "fedora": "rhel",
    "almalinux": "rhel",
    "amzn": "amazon",
}


def read_os_release(root: Path = Path("/")) -> dict[str, str]:
    for rel in ("etc/os-release", "usr/lib/os-release"):
        path = root / rel
        if path.exists():
            out: dict[str, str] = {}
            for line in path.read_text(errors="replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() and not key.startswith("#"):
                    out[key.strip()] = value.strip().strip('"').strip("'")
            return out
    return {}


def os_family(release: dict[str, str]) -> str:
    candidates = [release.get("ID", ""), *release.get("ID_LIKE", "").split()]
    for c in candidates:
        if c in FAMILIES:
            return FAMILIES[c]
    return "unknown"


def nvidia_pci_devices(sys_root: Path = Path("/sys")) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers (no driver needed)."""
    return [g.address for g in pci_gpus(sys_root)]


def pci_gpus(sys_root: Path = Path("/sys"), ids: Path | None = None) -> list[PciGpu]:
    """NVIDIA display/3D controllers on the PCI bus, named from pci.ids when it is there."""
    found: list[PciGpu] = []
    devices = sys_root / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return found
    for dev in sorted(devices.iterdir()):
        try:
            vendor = (dev / "vendor").read_text().strip()
            klass = (dev / "class").read_text().strip()
            device = (dev / "device").read_text().strip() if (dev / "device").exists() else ""
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and klass.startswith(DISPLAY_CLASS_PREFIX):
            found.append(PciGpu(address=dev.name, device_id=device))
    if found:
        names = nvidia_device_names(ids or _pci_ids())
        found = [PciGpu(g.address, g.device_id, names.get(g.device_id.lower(), "")) for g in found]
    return found


def _pci_ids() -> Path:
    for candidate in PCI_IDS:
        if candidate.exists():
            return candidate
    return PCI_IDS[0]


def nvidia_device_names(path: Path) -> dict[str, str]:
    """``{"0x2335": "GH100 [H200 SXM 141GB]", ...}``: NVIDIA's devices in a pci.ids file (read
    once per file version: health reports ask on every heartbeat)."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return {}
    cached = _NAMES.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    names = _read_device_names(path)
    _NAMES[path] = (stamp, names)
    return names


_NAMES: dict[Path, tuple[int, dict[str, str]]] = {}


def _read_device_names(path: Path) -> dict[str, str]:
    names: dict[str, str] = {}
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            inside = False
            for line in f:
                if not line.strip() or line.startswith("#"):
                    continue  # comments and blank lines sit anywhere, inside a vendor's block too
                if not line.startswith("\t"):
                    if inside:
                        break  # the next vendor
                    inside = line.startswith(NVIDIA_PCI_VENDOR[2:] + "  ")
                elif inside and not line.startswith("\t\t"):
                    device, _, name = line.strip().partition("  ")
                    names["0x" + device.lower()] = name.strip()
    except OSError:
        pass
    return names


def _number(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0  # "[N/A]", "[Not Supported]"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id
    [,ecc.errors.uncorrected.volatile.total] --format=csv,noheader,nounits`` output."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6 or not parts[0].isdigit():
            continue
        gpus.append(
            Gpu(
                index=int(parts[0]),
                name=parts[1],
                uuid=parts[2],
                driver_version=parts[3],
                memory_total_mib=_number(parts[4]),
                pci_bus_id=parts[5],
                ecc_uncorrected=_number(parts[6]) if len(parts) > 6 else 0,
            )
        )
    return gpus


XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\)")


def parse_xids(text: str) -> dict[str, int]:
    """Xid errors per PCI address (``"0000:3b:00"`` lowercase, no function) in kernel messages."""
    counts: dict[str, int] = {}
    for m in XID_RE.finditer(text):
        key = _bus_key(m.group(1))
        counts[key] = counts.get(key, 0) + 1
    return counts


def _bus_key(address: str) -> str:
    """ "00000000:3B:00.0" and "0000:3b:00" alike: domain (4 digits), bus and device, lowercase."""
    head = address.lower().split(".")[0]
    parts = head.split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


class XidLog:
    """Xid errors the kernel logged since boot, per GPU: the journal's ``kernel`` lines read once,
    then only what came after the last cursor (a heartbeat reads a few new lines, not the boot's)."""

    def __init__(self) -> None:
        self.boot = ""
        self.cursor = ""
        self.counts: dict[str, int] = {}

    def read(self, timeout: float = 10.0) -> dict[str, int]:
        exe = shutil.which("journalctl")
        if exe is None:
            return {}
        if self.boot != boot_id():  # a new boot (or the first read): from its start
            self.boot, self.cursor, self.counts = boot_id(), "", {}
        argv = [exe, "-b", "-t", "kernel", "-o", "cat", "--no-pager", "--show-cursor"]
        if self.cursor:
            argv += ["--after-cursor", self.cursor]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return dict(self.counts)
        text = out.stdout
        head, sep, tail = text.rpartition("-- cursor: ")
        if sep:
            self.cursor, text = tail.strip(), head
        for key, n in parse_xids(text).items():
            self.counts[key] = self.counts.get(key, 0) + n
        return dict(self.counts)


XIDS = XidLog()


def kernel_xids(timeout: float = 10.0) -> dict[str, int]:
    """Xid lines the kernel logged since boot (the journal's ``kernel`` identifier), best effort."""
    return XIDS.read(timeout)


def query_gpus(timeout: float = 10.0, errors: bool = False) -> list[Gpu]:
    """What nvidia-smi reports; with ``errors``, uncorrected ECC and Xid counts too (health)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    fields = "index,name,uuid,driver_version,memory.total,pci.bus_id"
    if errors:
        fields += ",ecc.errors.uncorrected.volatile.total"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = parse_nvidia_smi(out.stdout) if out.returncode == 0 else []
    if errors and gpus:
        xids = kernel_xids(timeout)
        gpus = [replace(g, xid_errors=xids.get(_bus_key(g.pci_bus_id), 0)) for g in gpus]
    return gpus


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def local_addresses(toward: str = "") -> list[str]:
    """The node's IPv4 addresses; the one used to reach ``toward`` (host:port) first."""
    addrs: list[str] = []
    if toward:
        host = toward.rpartition(":")[0].strip("[]") or toward
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, 9))  # no packet is sent for UDP connect
                addrs.append(s.getsockname()[0])
        except OSError:
            pass
    try:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            if "inet" in parts:
                addr = parts[parts.index("inet") + 1].split("/")[0]
                if addr not in addrs:
                    addrs.append(addr)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return addrs


def collect_facts(controller: str = "") -> HostFacts:
    release = read_os_release()
    on_bus = tuple(pci_gpus())
    return HostFacts(
        hostname=socket.gethostname(),
        os_id=release.get("ID", ""),
        os_version_id=release.get("VERSION_ID", ""),
        os_pretty=release.get("PRETTY_NAME", "unknown"),
        os_family=os_family(release),
        arch=ARCH_ALIASES.get(platform.machine(), platform.machine()),
        kernel=platform.release(),
        python_version=".".join(str(v) for v in sys.version_info[:3]),
        systemd=Path("/run/systemd/system").is_dir(),
        docker=shutil.which("docker") is not None,
        nvidia_gpu=bool(on_bus),
        gpus=tuple(query_gpus()),
        addresses=tuple(local_addresses(controller)),
        boot_id=boot_id(),
        machine_id=_read("/etc/machine-id"),
        cpu_count=os.cpu_count() or 0,
        memory_total_bytes=_meminfo().get("MemTotal", 0),
        pci_gpus=on_bus,
    )


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * 1024
    return out


def service_states(names: tuple[str, ...] = ("kubelet", "containerd", "docker", "crio")) -> dict[str, str]:
    if shutil.which("systemctl") is None or not Path("/run/systemd/system").is_dir():
        return {}
    try:
        out = subprocess.run(
            ["systemctl", "is-active", *names], capture_output=True, text=True, timeout=5, check=False
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # "inactive" is also what systemd says of a unit that does not exist: leave those out.
    return {n: s for n, s in zip(names, out, strict=False) if s != "inactive"}


def cluster_view(kubeconfig: str = "/etc/kubernetes/admin.conf", timeout: float = 10.0) -> ClusterView | None:
    """What ``kubectl get nodes`` says, on control planes only (where admin.conf exists)."""
    import json

    exe = shutil.which("kubectl")
    if exe is None or not Path(kubeconfig).exists():
        return None
    try:
        out = subprocess.run(
            [exe, "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ClusterView(api_server="unreachable", time_ms=now_ms())
    if out.returncode != 0:
        return ClusterView(api_server="unreachable", time_ms=now_ms())
    try:
        items = json.loads(out.stdout).get("items", [])
    except ValueError:
        return ClusterView(api_server="unknown", time_ms=now_ms())
    nodes = []
    for item in items:
        meta, status = item.get("metadata", {}), item.get("status", {})
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
        )
        ip = next(
            (a.get("address", "") for a in status.get("addresses", []) if a.get("type") == "InternalIP"), ""
        )
        roles = tuple(
            sorted(
                k.removeprefix("node-role.kubernetes.io/")
                for k in meta.get("labels", {})
                if k.startswith("node-role.kubernetes.io/")
            )
        )
        nodes.append(
            ClusterNode(
                name=meta.get("name", ""),
                ready=ready,
                version=status.get("nodeInfo", {}).get("kubeletVersion", ""),
                internal_ip=ip,
                roles=roles,
            )
        )
    return ClusterView(api_server="running", nodes=tuple(nodes), time_ms=now_ms())


def collect_health(state_dir: Path, gpus: bool = True) -> Health:
    mem = _meminfo()
    try:
        disk = shutil.disk_usage(state_dir if state_dir.exists() else "/")
        disk_total, disk_free = disk.total, disk.free
    except OSError:
        disk_total = disk_free = 0
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    uptime = _read("/proc/uptime").split()
    return Health(
        time_ms=now_ms(),
        os=read_os_release().get("PRETTY_NAME", platform.system()),
        arch=ARCH_ALIASES.get(platform.machine(), platform.machine()),
        kernel=platform.release(),
        uptime_seconds=float(uptime[0]) if uptime else 0.0,
        load1=load[0],
        load5=load[1],
        load15=load[2],
        memory_total_bytes=mem.get("MemTotal", 0),
        memory_available_bytes=mem.get("MemAvailable", 0),
        disk_total_bytes=disk_total,
        disk_free_bytes=disk_free,
        agent_version=__version__,
        gpus=tuple(query_gpus(errors=True)) if gpus else (),
        services=service_states(),
        cluster=cluster_view(),
        pci_gpus=tuple(pci_gpus()) if gpus else (),
    )
