"""tether-controller under systemd's notify protocol (tether-controller.service: Type=notify,
WatchdogSec): READY=1 once it listens, WATCHDOG=1 every WatchdogSec/2, STOPPING=1 on SIGTERM.

The socket stands in for systemd's; the controller is the real program, on 127.0.0.1 port 0.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def test_controller_sends_ready_watchdog_pings_and_stopping(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(30)
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "200000"}
    argv = [str(BIN / "tether-controller"), "serve", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*argv, "--data-dir", str(tmp_path / "data")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = sock.recv(4096).decode()
        assert ready.startswith("READY=1\nSTATUS=listening on 127.0.0.1:"), ready
        assert (tmp_path / "data" / "admin.conf").exists()  # READY=1 comes after the start-up work
        started = time.monotonic()
        pings = [sock.recv(4096).decode() for _ in range(3)]
        assert pings == ["WATCHDOG=1"] * 3
        assert time.monotonic() - started < 5  # every 0.1 s (WatchdogSec/2), not seconds apart
        proc.send_signal(signal.SIGTERM)
        while (message := sock.recv(4096).decode()) == "WATCHDOG=1":
            pass
        assert message == "STOPPING=1"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
