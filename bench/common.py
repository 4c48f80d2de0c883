"""Shared helpers: child processes (pinned, measured, always cleaned up) and the JSON figures."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# The server under test (controller or bare baseline) gets core 0 to itself; every client
# (simulated agents, the real agent, bash, this coordinator) runs on the other core(s).
_ALL = sorted(os.sched_getaffinity(0))
SERVER_CPUS: set[int] = {_ALL[0]}
CLIENT_CPUS: set[int] = set(_ALL[1:]) or {_ALL[0]}


def pinned(argv: list[str], cpus: set[int]) -> list[str]:
    """``argv`` run on ``cpus`` only, pinned before it starts (taskset execs it: same PID), so every
    thread it ever starts inherits the mask. Not ``preexec_fn``: forking a process with threads
    and running Python in the child before exec can abort the child (seen: SIGABRT)."""
    return ["taskset", "-c", ",".join(str(c) for c in sorted(cpus)), *argv]


T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "proto")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Proc:
    """A child process we started: pinned to ``cpus``, measured through /proc, killed by PID."""

    registry: list[Proc] = []

    def __init__(
        self,
        args: Sequence[str],
        *,
        cpus: set[int],
        log_path: Path,
        stdin: bool = False,
        stdout: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.log_path = log_path
        log_file = log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                pinned(self.args, cpus),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout else log_file,
                stderr=log_file,
                cwd=str(cwd or REPO),
                env=env or child_env(),
                start_new_session=True,
            )
        finally:
            log_file.close()
        self.pid = self.popen.pid
        self._buf = b""
        Proc.registry.append(self)

    # -- measurement ----------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """utime + stime of every thread so far."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def cpu_ns(self) -> int | None:
        """Nanoseconds on a CPU of every live thread (``/proc/PID/task/*/schedstat``), exact where
        ``cpu_seconds`` counts 10 ms ticks; None where the kernel keeps no schedstat. A thread that
        ends is not counted any more (compare with ``cpu_seconds`` over a window)."""
        by_thread = self.cpu_ns_by_thread()
        return None if by_thread is None else sum(by_thread.values())

    def cpu_ns_by_thread(self) -> dict[str, int] | None:
        """``cpu_ns`` by thread name (``comm``; threads of one name summed)."""
        out: dict[str, int] = {}
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return None
        for tid in tasks:
            task = f"/proc/{self.pid}/task/{tid}"
            try:
                ns = int(Path(f"{task}/schedstat").read_text().split()[0])
                name = Path(f"{task}/comm").read_text().strip()
            except FileNotFoundError:
                continue  # the thread ended meanwhile
            except (OSError, ValueError, IndexError):
                return None
            out[name] = out.get(name, 0) + ns
        return out

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def rss_mib(self) -> float:
        return self.status_kib("VmRSS") / 1024

    def open_fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def open_files_limit(self) -> int:
        """Its soft open-files limit (``Max open files`` in /proc/PID/limits); -1 if unknown."""
        try:
            for line in Path(f"/proc/{self.pid}/limits").read_text().splitlines():
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    return -1 if soft == "unlimited" else int(soft)
        except (OSError, ValueError, IndexError):
            pass
        return -1

    def alive(self) -> bool:
        return self.popen.poll() is None

    # -- line protocol on stdout/stdin ------------------------------------------------------------

    def readline(self, timeout: float) -> str:
        """One line of stdout, or TimeoutError (never blocks past ``timeout``)."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.args[0]}: no output within {timeout}s (log: {self.log_path})")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(f"{self.args[0]} exited (log: {self.log_path}): {self.tail()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.readline(max(0.1, deadline - time.monotonic()))
            m = re.search(pattern, line)
            if m:
                return m

    def send(self, doc: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(doc) + "\n").encode())
        self.popen.stdin.flush()

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # -- ending -------------------------------------------------------------------------------------

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=30)
        for f in (self.popen.stdin, self.popen.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        self.kill(signal.SIGTERM, timeout)

    @classmethod
    def cleanup(cls) -> None:
        for p in reversed(cls.registry):
            with contextlib.suppress(Exception):
                p.kill(signal.SIGKILL, timeout=10)
        cls.registry.clear()


@dataclass
class Figure:
    name: str
    value: float | int | None
    unit: str
    baseline: float | int | None
    target: str
    met: bool
    ratio: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        ratio = self.ratio
        if ratio is None and self.value is not None and self.baseline:
            ratio = self.value / self.baseline
        doc = {
            "name": self.name,
            "value": _round(self.value),
            "unit": self.unit,
            "baseline": _round(self.baseline),
            "ratio": _round(ratio, 3),
            "target": self.target,
            "met": bool(self.met),
            "detail": {k: _round(v) for k, v in self.detail.items()},
        }
        return json.dumps(doc)


def _round(v: Any, digits: int = 2) -> Any:
    if isinstance(v, float):
        return round(v, digits) if abs(v) >= 1 or v == 0 else float(f"{v:.3g}")
    return v


def emit(fig: Figure) -> Figure:
    print(fig.line(), flush=True)
    return fig
