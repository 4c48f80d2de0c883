"""SSH host key verification: known_hosts files or one pinned key; trust-on-first-use only when asked.

The rules, in order:

1. A pinned key (``--host-key 'ssh-ed25519 AAAA...'``) is the only key accepted for the target.
2. Otherwise the key must be in a known_hosts file (``--known-hosts FILE``, else
   ``~/.ssh/known_hosts`` and tether's own ``~/.config/tether/known_hosts``).
3. A host that *is* known with a different key is always refused (possible man in the middle),
   even with ``accept_new``.
4. An unknown host is accepted only with ``accept_new``; its key is then appended to
   ``record_to`` (the ``--known-hosts`` file, else tether's own) under a file lock.
5. ``verify=False`` (``--insecure-ignore-host-key``, holodeck's ``knownHostsPolicy: off``) checks
   nothing. ``decide_mode`` says which of strict / accept-new / off applies: strict unless asked,
   conflicting requests refused, and ``off`` only with ``--insecure-ignore-host-key``.

The key is checked during the SSH handshake, before authentication: when it is refused, no
credential has been sent and no command has run.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field, replace
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
    verify: bool = True  # False: accept any key (knownHostsPolicy off + --insecure-ignore-host-key)

    def files(self) -> tuple[Path, ...]:
        chosen = self.known_hosts or (USER_KNOWN_HOSTS, TETHER_KNOWN_HOSTS)
        return tuple(p.expanduser() for p in chosen)

    def recording_file(self) -> Path:
        if self.record_to is not None:
            return self.record_to.expanduser()
        return self.known_hosts[0].expanduser() if self.known_hosts else TETHER_KNOWN_HOSTS.expanduser()

    def without_pin(self) -> HostKeyPolicy:
        """The policy for a jump host: the same files and TOFU setting, never the target's pin."""
        return replace(self, pinned="")

    @property
    def mode(self) -> str:
        return "off" if not self.verify else "accept-new" if self.accept_new else "strict"


MODES = ("strict", "accept-new", "off")


def decide_mode(
    policy: str = "", *, accept_new: bool | None = None, insecure: bool = False, pinned: bool = False
) -> str:
    """strict, accept-new or off for one target, from everything that asks for one.

    ``policy`` is the inventory's (holodeck's ``knownHostsPolicy``), the others the command line's
    (or the inventory's ``accept_new_host_key``/``host_key``). Nothing asked: strict (holodeck's
    default is accept-new; tether's is not). Two different asks: refused, never guessed. ``off``
    needs ``insecure`` (``--insecure-ignore-host-key``) as well, whoever asked for it.
    """
    if policy and policy not in MODES:
        raise HostKeyError(f"unknown knownHostsPolicy {policy!r} (one of {', '.join(MODES)})")
    asks: list[tuple[str, str]] = []
    if policy:
        asks.append((policy, f"knownHostsPolicy {policy}"))
    if pinned:
        asks.append(("strict", "a pinned --host-key"))
    if accept_new:
        asks.append(("accept-new", "--accept-new-host-key"))
    if insecure:
        asks.append(("off", "--insecure-ignore-host-key"))
    modes = {mode for mode, _ in asks}
    if len(modes) > 1:
        raise HostKeyError(
            "conflicting host key settings: " + ", ".join(who for _, who in asks) + "; give only one"
        )
    mode = modes.pop() if modes else "strict"
    if mode == "off" and not insecure:
        raise HostKeyError(
            "knownHostsPolicy off turns host key verification off (anyone in the path would get the "
            "credentials and the join token): refused unless --insecure-ignore-host-key is given too; "
            "prefer --known-hosts, --host-key or knownHostsPolicy accept-new"
        )
    return mode


def policy_for(
    mode: str, *, known_hosts: tuple[Path, ...] = (), pinned: str = "", inline: str = ""
) -> HostKeyPolicy:
    """The ``HostKeyPolicy`` of a mode ``decide_mode`` returned."""
    return HostKeyPolicy(
        known_hosts=known_hosts,
        pinned=pinned,
        accept_new=mode == "accept-new",
        inline=inline,
        verify=mode != "off",
    )


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
        if not self.policy.verify:
            self._known = asyncssh.import_known_hosts("")
            return
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
    def known_hosts(self) -> asyncssh.SSHKnownHosts | None:
        """asyncssh's ``known_hosts`` argument (None: no verification at all)."""
        return self._known if self.policy.verify else None

    def validate(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Called by asyncssh for a key the known_hosts argument does not already trust."""
        if not self.policy.verify:
            return True
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
                "--host-key, add it to --known-hosts, or use --accept-new-host-key "
                "(knownHostsPolicy: accept-new)"
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
