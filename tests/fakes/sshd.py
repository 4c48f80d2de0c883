"""A real OpenSSH server on 127.0.0.1 (a free port), for the bootstrap's SSH tests.

It runs as root in a private mount namespace (``unshare --mount``): there it gets its own
``/run`` (sshd's privilege-separation directory) and, for password tests, copies of
``/etc/passwd``, ``/etc/shadow`` and ``/etc/group`` in which root has a password and an extra
unprivileged user exists. The host's files are never modified. Only ``authorized_keys`` (a file
in the test's directory) lets keys in. The server is stopped by its PID.
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
EXTRA_UID = 4242


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


def keygen(path: Path, passphrase: str = "", kind: str = "ed25519", fmt: str = "") -> str:
    """Create a key pair (``fmt="PEM"`` for the legacy format); returns the public key line."""
    argv = ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", path.name, "-f", str(path)]
    if fmt:
        argv += ["-m", fmt]
    subprocess.run(argv, check=True, capture_output=True)
    return Path(f"{path}.pub").read_text().strip()


def _hash(password: str) -> str:
    return subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True, check=True
    ).stdout.strip()


class Sshd:
    def __init__(
        self,
        workdir: Path,
        *,
        root_password: str = "",
        user: tuple[str, str] | None = None,  # an unprivileged (name, password) login
        forwarding: bool = True,
        name: str = "sshd",
    ) -> None:
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root_password = root_password
        self.user = user
        self.forwarding = forwarding
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

    def _accounts(self) -> str:
        """Mount commands giving root a password and adding the extra user, in the namespace only."""
        passwd = Path("/etc/passwd").read_text()
        shadow = Path("/etc/shadow").read_text().splitlines()
        group = Path("/etc/group").read_text()
        if self.root_password:
            digest = _hash(self.root_password)
            shadow = [
                f"root:{digest}:" + ":".join(s.split(":")[2:]) if s.startswith("root:") else s for s in shadow
            ]
        if self.user is not None:
            name, password = self.user
            home = self.dir / "home"
            home.mkdir(exist_ok=True)
            os.chown(home, EXTRA_UID, EXTRA_UID)
            passwd += f"{name}:x:{EXTRA_UID}:{EXTRA_UID}::{home}:/bin/sh\n"
            group += f"{name}:x:{EXTRA_UID}:\n"
            shadow.append(f"{name}:{_hash(password)}:19000:0:99999:7:::")
        mounts = []
        for filename, text, mode in (
            ("passwd", passwd, 0o644),
            ("shadow", "\n".join(shadow) + "\n", 0o600),
            ("group", group, 0o644),
        ):
            copy = self.dir / filename
            copy.write_text(text)
            copy.chmod(mode)
            mounts.append(f" && mount --bind {copy} /etc/{filename}")
        return "".join(mounts)

    def start(self) -> Sshd:
        if not self.host_key.exists():
            keygen(self.host_key)
        self.authorized_keys.touch(mode=0o600)
        passwords = bool(self.root_password or self.user)
        setup = "mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd"
        if passwords:
            setup += self._accounts()
        for _ in range(5):
            self.port = free_port()
            config = self.dir / "sshd_config"
            config.write_text(
                f"ListenAddress 127.0.0.1:{self.port}\nHostKey {self.host_key}\nPidFile none\n"
                f"AuthorizedKeysFile {self.authorized_keys}\n"
                f"PermitRootLogin {'yes' if self.root_password else 'prohibit-password'}\n"
                f"PasswordAuthentication {'yes' if passwords else 'no'}\n"
                f"AllowTcpForwarding {'yes' if self.forwarding else 'no'}\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n"
            )
            with self.log.open("ab") as log:  # the child keeps its own copy of the descriptor
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
                    stderr=log,
                )
            if self._wait_listening():
                return self
            self.stop()
        raise AssertionError(f"sshd did not start: {self.log_text()[-2000:]}")

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

    def wait_log(self, *phrases: str, timeout: float = 10.0) -> str:
        """Wait until the log holds one of ``phrases`` (sshd writes after the fact); returns the log."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text()
            if any(p in text for p in phrases) or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def sessions(self) -> int:
        """Logins so far (each 'Accepted publickey/password for ...' line)."""
        return sum(
            1
            for line in self.log_text().splitlines()
            if "Accepted publickey for" in line or "Accepted password for" in line
        )
