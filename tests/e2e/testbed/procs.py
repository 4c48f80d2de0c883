"""Processes the testbed starts and later stops, identified by PID *and* start time.

A recorded PID is only signalled while ``/proc/PID/stat`` still shows the recorded start time, so a
teardown after a crash never kills an unrelated process that reused the PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Proc:
    """A process we started: its PID and its start time in clock ticks since boot."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Proc:
        return cls(pid, start_time(pid) or 0)

    def alive(self) -> bool:
        return self.start != 0 and start_time(self.pid) == self.start and not _zombie(self.pid)

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still our process; True if it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait(self, timeout: float) -> bool:
        """Wait until the process is gone (or a zombie); True if it went."""
        deadline = time.monotonic() + timeout
        while self.alive():
            _reap(self.pid)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        _reap(self.pid)
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.signal(signal.SIGTERM) and not self.wait(timeout):
            self.signal(signal.SIGKILL)
            self.wait(5.0)

    def to_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start": self.start}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> Proc:
        return cls(int(data["pid"]), int(data["start"]))


def matching(fragment: str) -> list[Proc]:
    """Live processes whose command line contains ``fragment`` (a path unique to one testbed)."""
    found = []
    needle = fragment.encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "cmdline").read_bytes():
                proc = Proc.of(int(entry.name))
                if proc.alive() and proc.pid != os.getpid():
                    found.append(proc)
        except (OSError, ValueError):
            continue
    return found


def start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    """Reap ``pid`` if it is our child (it is when the same Python process started it)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def spawn_daemon(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    """Start a process in its own session that outlives us (stdin /dev/null, output appended to ``log``).

    A short-lived ``sh`` starts it in the background and exits, so the daemon is never our child.
    """
    script = 'log=$1; shift; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!'
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(log), *argv], capture_output=True, text=True, check=True, env=env
    ).stdout
    return Proc.of(int(out.strip()))
