"""sd_notify without libsystemd: READY, STATUS and WATCHDOG pings over $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send one notification; False when not running under systemd (no $NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """How often to ping the watchdog (half of WatchdogSec), or None when it is off."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2
