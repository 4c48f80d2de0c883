"""Per-node cgroups in every hierarchy (TESTBED.md §2a).

Without host systemd, nspawn ``--keep-unit`` leaves every node in the launcher's cgroup, and the nodes'
systemd instances then trample each other's ``system.slice``. Each node therefore gets a child of our own
cgroup in every mounted hierarchy (so the memory limit of the sandbox still applies).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def create(name: str) -> list[Path]:
    """Create ``name`` under our current cgroup in every hierarchy; return the paths (parents first)."""
    paths: list[Path] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, current = line.split(":", 2)
        if controllers == "":
            hierarchy = "unified"
        elif controllers.startswith("name="):
            hierarchy = controllers[len("name=") :]
        else:
            hierarchy = controllers
        mount = ROOT / hierarchy
        if not mount.is_dir() or not (mount / "cgroup.procs").exists():
            continue
        path = mount / current.strip("/") / name
        path.mkdir(exist_ok=True)
        if "cpuset" in hierarchy.split(","):
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((path.parent / knob).read_text())
        paths.append(path)
    return paths


def procs(paths: list[Path]) -> set[int]:
    """Every PID in these cgroups or their descendants."""
    found: set[int] = set()
    for path in paths:
        if not path.is_dir():
            continue
        for sub, _, _ in os.walk(path):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (Path(sub) / "cgroup.procs").read_text().split())
    return found


def kill_all(paths: list[Path], timeout: float = 5.0) -> None:
    """SIGKILL everything left in the node's cgroups (after a clean stop failed) and wait for it to go."""
    deadline = time.monotonic() + timeout
    while (pids := procs(paths)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove(paths: list[Path]) -> list[Path]:
    """rmdir the cgroups and every sub-cgroup the node's systemd made, deepest first; return leftovers."""
    for path in paths:
        if not path.is_dir():
            continue
        subdirs = sorted((Path(d) for d, _, _ in os.walk(path)), key=lambda p: len(p.parts), reverse=True)
        for sub in subdirs:
            for _ in range(20):
                try:
                    sub.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last processes exit
                    time.sleep(0.05)
    return [p for p in paths if p.exists()]
