"""A real OpenSSH server on 127.0.0.1 (a free port), for the bootstrap's SSH tests.

It runs as root in a private mount namespace (``unshare --mount``): there it gets its own
``/run`` (sshd's privilege-separation directory) and, for password tests, a copy of
``/etc/shadow`` in which root has a password. The host's files are never modified. Only
``authorized_keys`` (a file in the test's directory) lets keys in. Stopped by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def available() -> str:
    """Why these tests cannot run here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root (sshd in a private mount namespace)"
    for tool in (SSHD, "ssh-keygen", "unshare", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, passphrase: str = "", kind: str = "ed25519") -> str:
    """Create a key pair; returns the public key line ('TYPE BASE64 COMMENT')."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", path.name, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return (
        path.with_suffix(".pub").read_text().strip()
        if path.suffix
        else Path(f"{path}.pub").read_text().strip()
    )


class Sshd:
    def __init__(self, workdir: Path, *, root_password: str = "", name: str = "sshd") -> None:
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root_password = root_password
        self.host_key = self.dir / "host_key"
        self.authorized_keys = self.dir / "authorized_keys"
        self.log = self.dir / "sshd.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host_key_line(self) -> str:
        algo, blob = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"{algo} {blob}"

    def authorize(self, public_line: str) -> None:
        with self.authorized_keys.open("a") as fh:
            fh.write(public_line.strip() + "\n")
        self.authorized_keys.chmod(0o600)

    def start(self) -> Sshd:
        if not self.host_key.exists():
            keygen(self.host_key)
        self.authorized_keys.touch(mode=0o600)
        for _ in range(5):
            self.port = free_port()
            config = self.dir / "sshd_config"
            config.write_text(
                f"ListenAddress 127.0.0.1:{self.port}\nHostKey {self.host_key}\nPidFile none\n"
                f"AuthorizedKeysFile {self.authorized_keys}\n"
                f"PermitRootLogin {'yes' if self.root_password else 'prohibit-password'}\n"
                f"PasswordAuthentication {'yes' if self.root_password else 'no'}\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n"
                "Subsystem sftp internal-sftp\n"
            )
            setup = "mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd"
            if self.root_password:
                shadow = self.dir / "shadow"
                digest = subprocess.run(
                    ["openssl", "passwd", "-6", "-stdin"],
                    input=self.root_password,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                lines = Path("/etc/shadow").read_text().splitlines()
                shadow.write_text(
                    "\n".join(
                        f"root:{digest}:" + ":".join(line.split(":")[2:])
                        if line.startswith("root:")
                        else line
                        for line in lines
                    )
                    + "\n"
                )
                shadow.chmod(0o600)
                setup += f" && mount --bind {shadow} /etc/shadow"
            self.proc = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    f"{setup} && exec {SSHD} -D -e -f {config}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=self.log.open("ab"),
            )
            if self._wait_listening():
                return self
            self.stop()
        raise AssertionError(f"sshd did not start: {self.log.read_text()[-2000:]}")

    def _wait_listening(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
