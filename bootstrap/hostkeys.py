"""SSH host key verification: known_hosts files or one pinned key; trust-on-first-use only when asked.

The rules, in order:

1. A pinned key (``--host-key 'ssh-ed25519 AAAA...'``) is the only key accepted for the target.
2. Otherwise the key must be in a known_hosts file (``--known-hosts FILE``, else
   ``~/.ssh/known_hosts`` and tether's own ``~/.config/tether/known_hosts``).
3. A host that *is* known with a different key is always refused (possible man in the middle),
   even with ``accept_new``.
4. An unknown host is accepted only with ``accept_new``; its key is then appended to
   ``record_to`` (the ``--known-hosts`` file, else tether's own) under a file lock.

The key is checked during the SSH handshake, before authentication: when it is refused, no
credential has been sent and no command has run.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from tether.bootstrap.errors import HostKeyError

TETHER_KNOWN_HOSTS = Path("~/.config/tether/known_hosts")
USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")


@dataclass(frozen=True)
class HostKeyPolicy:
    known_hosts: tuple[Path, ...] = ()  # empty: the user's and tether's default files
    pinned: str = ""  # "ssh-ed25519 AAAA..." (a comment after the key is ignored)
    accept_new: bool = False
    record_to: Path | None = None  # where accepted new keys go (default: tether's file)
    inline: str = ""  # known_hosts content given directly (AdminService.Bootstrap), read with the files

    def files(self) -> tuple[Path, ...]:
        chosen = self.known_hosts or (USER_KNOWN_HOSTS, TETHER_KNOWN_HOSTS)
        return tuple(p.expanduser() for p in chosen)

    def recording_file(self) -> Path:
        if self.record_to is not None:
            return self.record_to.expanduser()
        return self.known_hosts[0].expanduser() if self.known_hosts else TETHER_KNOWN_HOSTS.expanduser()

    def without_pin(self) -> HostKeyPolicy:
        """The policy for a jump host: the same files and TOFU setting, never the target's pin."""
        return HostKeyPolicy(self.known_hosts, "", self.accept_new, self.record_to, self.inline)


def parse_pinned(line: str) -> asyncssh.SSHKey:
    parts = line.strip().split()
    if len(parts) < 2:
        raise HostKeyError(f"invalid pinned host key {line.strip()[:40]!r}: expected 'TYPE BASE64'")
    try:
        return asyncssh.import_public_key(f"{parts[0]} {parts[1]}")
    except (asyncssh.KeyImportError, ValueError) as exc:
        raise HostKeyError(f"invalid pinned host key: {exc}") from None


def fingerprint(key: asyncssh.SSHKey) -> str:
    return str(key.get_fingerprint("sha256"))


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class HostKeyVerifier:
    """Builds asyncssh's ``known_hosts`` argument and decides about keys it does not trust."""

    policy: HostKeyPolicy
    host: str
    port: int
    problem: str = ""  # why a key was refused (shown to the operator)
    learned: str = ""  # the known_hosts line recorded by trust-on-first-use
    _known: asyncssh.SSHKnownHosts = field(init=False)
    _pinned: asyncssh.SSHKey | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.policy.pinned:
            self._pinned = parse_pinned(self.policy.pinned)
            pin = self._pinned.export_public_key("openssh").decode().split()
            self._known = asyncssh.import_known_hosts(f"* {pin[0]} {pin[1]}\n")
            return
        texts = [self.policy.inline]
        for path in self.policy.files():
            try:
                texts.append(path.read_text())
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise HostKeyError(f"cannot read known_hosts file {path}: {exc.strerror}") from None
        try:
            self._known = asyncssh.import_known_hosts("\n".join(texts))
        except (ValueError, asyncssh.KeyImportError) as exc:
            raise HostKeyError(f"cannot parse known_hosts: {exc}") from None

    @property
    def known_hosts(self) -> asyncssh.SSHKnownHosts:
        return self._known

    def validate(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Called by asyncssh for a key the known_hosts argument does not already trust."""
        presented = fingerprint(key)
        where = host_pattern(self.host, self.port)
        if self._pinned is not None:
            self.problem = (
                f"host key mismatch for {where}: it presented {presented}, the pinned key is "
                f"{fingerprint(self._pinned)}; refusing to connect"
            )
            return False
        trusted = self._known.match(self.host, addr, self.port if self.port != 22 else None)[0]
        if key in trusted:
            return True
        if trusted:
            known = ", ".join(sorted({fingerprint(k) for k in trusted}))
            self.problem = (
                f"host key for {where} has CHANGED: it presented {presented}, known_hosts has {known}; "
                "possible man-in-the-middle, refusing (remove the stale entry if the machine was re-imaged)"
            )
            return False
        if not self.policy.accept_new:
            self.problem = (
                f"unknown host key {presented} ({key.get_algorithm()}) for {where}: check it, then pass "
                "--host-key, add it to --known-hosts, or use --accept-new-host-key"
            )
            return False
        self.learned = self._record(key)
        return True

    def _record(self, key: asyncssh.SSHKey) -> str:
        algo, blob = key.export_public_key("openssh").decode().split()[:2]
        line = f"{host_pattern(self.host, self.port)} {algo} {blob}"
        path = self.policy.recording_file()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # several bootstraps may learn keys at once
            fh.seek(0)
            if line not in (existing.strip() for existing in fh):
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        return line
