"""Real processes for integration tests: a controller on 127.0.0.1 (port 0) and agents."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

BIN = Path(sys.executable).parent
T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except AssertionError as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Controller:
    """``tether-controller serve`` on ``host`` (loopback; e2e: a testbed bridge) and a free port."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1", extra_args: tuple[str, ...] = ()) -> None:
        self.host = host
        self.extra_args = extra_args  # more ``serve`` flags (e.g. --node-cert-days)
        self.data_dir = workdir / "controller"
        self.log_path = workdir / "controller.log"
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.port = 0

    @property
    def config(self) -> Path:
        return self.data_dir / "admin.conf"

    def start(self, port: int | None = None) -> None:
        listen = f"{self.host}:{port if port is not None else (self.port or 0)}"
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "tether-controller"),
                    "serve",
                    "--listen",
                    listen,
                    "--data-dir",
                    str(self.data_dir),
                    "--heartbeat-seconds",
                    "1",
                    *self.extra_args,
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (\S+):(\d+)", line)
            if m:
                self.address, self.port = f"{m.group(1)}:{m.group(2)}", int(m.group(2))
                return
        self.kill()  # nothing of a failed start is left running
        raise AssertionError(f"controller did not start: {self.log_path.read_text()[-2000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None

    def ctl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TETHER_CONFIG": str(self.config)}
        out = subprocess.run(
            [str(BIN / "tetherctl"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"tetherctl {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out

    def db_dump(self) -> str:
        with contextlib.closing(sqlite3.connect(self.data_dir / "tether.db")) as conn:
            return "\n".join(conn.iterdump())


class Agent:
    def __init__(self, workdir: Path, name: str, controller: Controller) -> None:
        self.name = name
        self.controller = controller
        self.state_dir = workdir / f"agent-{name}"
        self.log_path = workdir / f"agent-{name}.log"
        self.proc: subprocess.Popen[str] | None = None

    def _argv(self, *extra: str) -> list[str]:
        return [
            str(BIN / "tether-agent"),
            "run",
            "--controller",
            self.controller.address,
            "--state-dir",
            str(self.state_dir),
            "--node-name",
            self.name,
            *extra,
        ]

    def start(self, token: str = "", ca_hash: str = "", *extra: str) -> None:
        args = self._argv(
            "--heartbeat-seconds",
            "1",
            "--backoff-max-seconds",
            "1",
            "--reboot-command",
            "true",
            *extra,
        )
        if token:
            args += ["--token", token, "--ca-hash", ca_hash]
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, text=True)

    def run_once(
        self, token: str, ca_hash: str, *extra: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run an agent expected to exit (e.g. a refused enrollment)."""
        args = self._argv("--token", token, "--ca-hash", ca_hash, *extra)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def db_dump(self) -> str:
        with contextlib.closing(sqlite3.connect(self.state_dir / "state.db")) as conn:
            return "\n".join(conn.iterdump())

    def status(self) -> str:
        return subprocess.run(
            [str(BIN / "tether-agent"), "status", "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
