"""Detection: what the machine is, read-only, before anything changes.

One POSIX shell script prints ``key=value`` lines: kernel and architecture, /etc/os-release,
every Python interpreter (with its libc), systemd as PID 1, docker, NVIDIA display devices on
the PCI bus, the package manager, free space under /opt, and what tether already left there
(the bootstrap marker, the agent identity, the unit's state, the kill switch). ``refusals``
turns that into the list of reasons not to go on, all at once.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from dataclasses import dataclass, field

from tether.bootstrap.errors import CommandFailed
from tether.bootstrap.layout import UNIT_NAME, Layout
from tether.bootstrap.transport import Transport
from tether.nodeagent.facts import ARCH_ALIASES, os_family
from tether.nodeagent.model import HostFacts

MIN_PYTHON = (3, 10)  # grpcio's floor
MIN_GLIBC = (2, 17)  # manylinux2014
MIN_FREE_KB = 200 * 1024
PYTHON_NAMES = ("python3.13", "python3.12", "python3.11", "python3.10", "python3")
# Prints "VERSION LIBC LIBCVERSION ok" when the stdlib modules the agent needs are there.
_PROBE = (
    "import sys, platform; import sqlite3, ssl, hashlib, tarfile, zlib; "
    "v = sys.version_info; l = platform.libc_ver(); "
    "print('%d.%d.%d %s %s ok' % (v[0], v[1], v[2], l[0] or 'unknown', l[1] or '0'))"
)


def script(layout: Layout) -> str:
    marker = shlex.quote(layout.marker)
    identity = " && ".join(f"[ -f {shlex.quote(p)} ]" for p in layout.identity_files)
    pythons = " ".join(PYTHON_NAMES)
    return f"""\
set +e
echo "uname_s=$(uname -s)"
echo "uname_m=$(uname -m)"
echo "kernel=$(uname -r)"
echo "hostname=$(cat /proc/sys/kernel/hostname 2>/dev/null || hostname)"
if [ -r /etc/os-release ]; then
  (. /etc/os-release; echo "os_id=$ID"; echo "os_version_id=$VERSION_ID"; echo "os_like=$ID_LIKE"; \
echo "os_pretty=$PRETTY_NAME")
fi
[ -d /run/systemd/system ] && echo "systemd=1"
command -v systemctl >/dev/null 2>&1 && echo "systemctl=1"
command -v docker >/dev/null 2>&1 && echo "docker=1"
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] || continue
  if [ "$(cat "$d/vendor")" = 0x10de ]; then
    case "$(cat "$d/class")" in 0x03*) echo "gpu=${{d##*/}}" ;; esac
  fi
done
seen=""
for p in {pythons} /usr/libexec/platform-python; do
  x=$(command -v "$p" 2>/dev/null) || continue
  r=$(readlink -f "$x" 2>/dev/null || echo "$x")
  case " $seen " in *" $r "*) continue ;; esac
  seen="$seen $r"
  echo "python=$x $("$x" -c {shlex.quote(_PROBE)} 2>/dev/null)"
done
for m in apt-get dnf yum zypper; do command -v "$m" >/dev/null 2>&1 && echo "pkg=$m" && break; done
df -Pk /opt 2>/dev/null | awk 'NR==2 {{print "free_kb=" $4}}'
echo "machine_id=$(cat /etc/machine-id 2>/dev/null)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
[ -f {marker} ] && echo "marker=$(base64 < {marker} | tr -d '\\n')"
{identity} && echo "identity=1"
[ -e {shlex.quote(layout.disabled)} ] && echo "disabled=1"
if command -v systemctl >/dev/null 2>&1; then
  echo "unit_active=$(systemctl is-active {UNIT_NAME} 2>/dev/null)"
  echo "unit_enabled=$(systemctl is-enabled {UNIT_NAME} 2>/dev/null)"
fi
exit 0
"""


@dataclass(frozen=True)
class Python:
    path: str
    version: tuple[int, int, int]
    libc: str = "unknown"  # "glibc" | "musl"/"unknown"
    libc_version: tuple[int, int] = (0, 0)

    @property
    def short(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def supported(self) -> bool:
        return self.version[:2] >= MIN_PYTHON

    def __str__(self) -> str:
        return f"Python {'.'.join(map(str, self.version))} ({self.path})"


@dataclass(frozen=True)
class InstallState:
    """What an earlier bootstrap (or someone) left on the machine."""

    marker: dict[str, object] | None = None
    identity: bool = False  # key.pem, cert.pem and node.json under the state directory
    unit_active: str = ""  # systemctl is-active
    unit_enabled: str = ""
    disabled: bool = False  # the kill switch file exists


@dataclass(frozen=True)
class DetectedHost:
    facts: HostFacts
    kernel_name: str = ""  # uname -s
    machine: str = ""  # uname -m, before normalisation
    os_like: str = ""
    systemctl: bool = False
    pythons: tuple[Python, ...] = ()
    package_manager: str = ""
    free_kb: int | None = None
    gpu_devices: tuple[str, ...] = ()
    install: InstallState = field(default_factory=InstallState)

    @property
    def python(self) -> Python | None:
        """The newest supported interpreter, if any."""
        usable = [p for p in self.pythons if p.supported]
        return max(usable, key=lambda p: p.version) if usable else None

    @property
    def glibc(self) -> tuple[int, int] | None:
        for p in sorted(self.pythons, key=lambda p: p.version, reverse=True):
            if p.libc == "glibc":
                return p.libc_version
        return None

    def summary(self) -> str:
        f = self.facts
        python = self.python or (max(self.pythons, key=lambda p: p.version) if self.pythons else None)
        return ", ".join(
            [
                f.os_pretty or f"{f.os_id} {f.os_version_id}".strip() or self.kernel_name or "unknown OS",
                f.arch or self.machine or "unknown arch",
                f"kernel {f.kernel}" if f.kernel else "kernel ?",
                str(python) if python else "no Python",
                f"systemd {'yes' if f.systemd else 'no'}",
                f"docker {'yes' if f.docker else 'no'}",
                f"NVIDIA GPU {'yes (' + str(len(self.gpu_devices)) + ')' if f.nvidia_gpu else 'no'}",
            ]
        )


def parse(output: str) -> DetectedHost:
    values: dict[str, str] = {}
    pythons: list[Python] = []
    gpus: list[str] = []
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "python":
            parsed = _python(value)
            if parsed is not None:
                pythons.append(parsed)
        elif key == "gpu":
            gpus.append(value)
        else:
            values[key] = value
    release = {"ID": values.get("os_id", ""), "ID_LIKE": values.get("os_like", "")}
    machine = values.get("uname_m", "")
    facts = HostFacts(
        hostname=values.get("hostname", ""),
        os_id=values.get("os_id", ""),
        os_version_id=values.get("os_version_id", ""),
        os_pretty=values.get("os_pretty", ""),
        os_family=os_family(release),
        arch=ARCH_ALIASES.get(machine, ""),
        kernel=values.get("kernel", ""),
        python_version=".".join(map(str, max(pythons, key=lambda p: p.version).version)) if pythons else "",
        systemd=values.get("systemd") == "1",
        docker=values.get("docker") == "1",
        nvidia_gpu=bool(gpus),
        boot_id=values.get("boot_id", ""),
        machine_id=values.get("machine_id", ""),
    )
    free = values.get("free_kb", "")
    return DetectedHost(
        facts=facts,
        kernel_name=values.get("uname_s", ""),
        machine=machine,
        os_like=values.get("os_like", ""),
        systemctl=values.get("systemctl") == "1",
        pythons=tuple(pythons),
        package_manager=values.get("pkg", ""),
        free_kb=int(free) if free.isdigit() else None,
        gpu_devices=tuple(gpus),
        install=InstallState(
            marker=_marker(values.get("marker", "")),
            identity=values.get("identity") == "1",
            unit_active=values.get("unit_active", ""),
            unit_enabled=values.get("unit_enabled", ""),
            disabled=values.get("disabled") == "1",
        ),
    )


def _python(value: str) -> Python | None:
    parts = value.split()
    if len(parts) < 5 or parts[4] != "ok":
        return None  # not runnable, or missing a stdlib module the agent needs
    try:
        version = tuple(int(x) for x in parts[1].split(".")[:3])
        libc_version = tuple(int(x) for x in [*parts[3].split("."), "0"][:2])
    except ValueError:
        return None
    if len(version) != 3:
        return None
    return Python(
        parts[0], (version[0], version[1], version[2]), parts[2], (libc_version[0], libc_version[1])
    )


def _marker(encoded: str) -> dict[str, object] | None:
    if not encoded:
        return None
    try:
        doc = json.loads(base64.b64decode(encoded))
    except (binascii.Error, ValueError):
        return {"unreadable": True}
    return doc if isinstance(doc, dict) else {"unreadable": True}


def refusals(host: DetectedHost, *, python_installable: bool, python_reason: str = "") -> list[str]:
    """Every reason not to install on this machine (empty: go ahead)."""
    reasons = []
    if host.kernel_name and host.kernel_name != "Linux":
        reasons.append(f"not Linux (uname -s says {host.kernel_name})")
    if not host.facts.arch:
        reasons.append(f"unsupported architecture {host.machine or '?'} (amd64 and arm64 only)")
    if not host.facts.systemd or not host.systemctl:
        reasons.append(
            "systemd is not running as PID 1 (no /run/systemd/system): the agent runs as a systemd unit"
        )
    if host.python is None and not python_installable:
        reasons.append(python_reason or "no Python >= 3.10 and no way to install one")
    glibc = host.glibc
    if host.pythons and (glibc is None or glibc < MIN_GLIBC):
        found = "no glibc" if glibc is None else f"glibc {glibc[0]}.{glibc[1]}"
        reasons.append(f"the agent's wheels need glibc >= 2.17 ({found})")
    if host.free_kb is not None and host.free_kb < MIN_FREE_KB:
        reasons.append(f"only {host.free_kb // 1024} MiB free under /opt (the agent needs 200 MiB)")
    if host.install.disabled:
        reasons.append("the agent is switched off on this machine (/etc/tether/disabled exists)")
    return reasons


async def detect(transport: Transport, layout: Layout) -> DetectedHost:
    result = await transport.run(script(layout), timeout=60)
    if not result.ok:
        raise CommandFailed("detection", result.exit_code, result.stderr, target=transport.target)
    return parse(result.stdout)
